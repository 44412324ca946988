"""A session's figures as settings, store and runtime make them: its window, pruning, token estimates, usage."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from protocol.types import Usage, UsageSource
from sidecar.config.models import context_window_for
from sidecar.config.settings import Settings
from sidecar.engine.assembly import PRUNED_PLACEHOLDER, PruneRule, PruneStep, is_prunable, prune_step, pruned_total
from sidecar.engine.cache_cost import ITEMS_PER_PROMPT, step_pays
from sidecar.engine.tokens import MESSAGE_OVERHEAD_TOKENS, estimate_text_tokens
from sidecar.engine.usage import compaction_threshold, not_compacted_hint, prompt_budget, usage_figures
from sidecar.rows import ItemRow, SessionRow, StorageUnavailable, prune_rule_key
from sidecar.services.runtime import Runtime

if TYPE_CHECKING:
    from sidecar.storage.interface import Store

PLACEHOLDER_TOKENS = estimate_text_tokens(PRUNED_PLACEHOLDER + " (id msg_00000000000000000000000000000000)") \
    + MESSAGE_OVERHEAD_TOKENS


class SessionFigures:
    """The part of the Sidecar that works out a session's figures (``state.Sidecar`` holds what they read)."""

    settings: Settings
    runtime: Runtime
    store: Callable[[], Store]
    session: Callable[[str], SessionRow]

    def context_window(self, session: SessionRow) -> int:
        """The session's window: its own, else its model's, else the setting."""
        if session.context_window:
            return session.context_window
        return context_window_for(session.model, self.settings.models) or self.settings.context_window

    def overhead(self, session: SessionRow) -> int:
        """Tokens the session's client sends beside its context (system prompt, tools), as its last assemble said."""
        state = self.runtime.get(session.session_id)
        return state.overhead if state is not None else 0

    def prompt_budget(self, session: SessionRow) -> int:
        """The budget the session's prompts are assembled within: the one its last assemble worked out, else the
        window less the reserve and the overhead."""
        state = self.runtime.get(session.session_id)
        if state is not None and state.budget is not None:
            return state.budget
        return prompt_budget(self.context_window(session), self.settings.compaction, self.overhead(session))

    def prune_rule(self) -> PruneRule:
        """Pruning as the settings say."""
        prune = self.settings.prune
        return PruneRule(prune.protect_tokens, prune.minimum_tokens, frozenset(prune.protected_tools),
                         PLACEHOLDER_TOKENS)

    def calibrated(self, items: list[ItemRow], session: SessionRow) -> list[ItemRow]:
        """Items with token estimates scaled by the session's calibration factor."""
        factor = session.calibration
        if abs(factor - 1.0) < 1e-9:
            return items
        return [item._replace(tokens=math.ceil(item.tokens * factor)) for item in items]

    def prune_signature(self) -> str:
        """The pruning rule as stored beside a session's running totals."""
        rule = self.prune_rule()
        return prune_rule_key(rule.placeholder_tokens, rule.protected_tools)

    def prune_totals(self, session: SessionRow) -> tuple[int, int]:
        """Count and raw tokens of every prunable tool output in the context, recounted if the rule changed."""
        signature = self.prune_signature()
        if session.prunable_rule != signature:
            self.store().recount_prunable(session.session_id, signature)
            session = self.session(session.session_id)
        return session.prunable_count, session.prunable_tokens

    def prune_state(self, session: SessionRow, tail: tuple[list[ItemRow], bool] | None = None) -> PruneStep:
        """The prune frontier as the next assemble uses it: the stored one, or a new step if one is due.

        ``tail`` may pass newest raw items already fetched (covering ``protectTokens``) to save a read.
        """
        key = (session.revision, session.pruned_upto, session.calibration, self.settings)
        state = self.runtime.of(session.session_id)
        remembered = state.remembered_prune(key) if tail is None else None
        if remembered is not None:
            return remembered  # ingest's usage, assemble and its usage all ask at the same revision
        step = self._prune_state(session, tail)
        if tail is None:
            state.remember_prune(key, step)
        return step

    def _prune_state(self, session: SessionRow, tail: tuple[list[ItemRow], bool] | None) -> PruneStep:
        rule = self.prune_rule()
        all_count, all_tokens = self.prune_totals(session)
        session = self.session(session.session_id)  # prune_totals may have recounted
        if session.last_position is None or (all_tokens - session.pruned_tokens) * session.calibration \
                <= rule.minimum_tokens:
            return PruneStep(session.pruned_upto)  # even every unpruned output together is not worth a step
        factor = session.calibration
        kept = [item for item in self.store().anchors(session).items if is_prunable(item, rule)]
        want = math.ceil(rule.protect_tokens / factor) + 1
        items, complete = tail or self.store().tail(session, want, 1)
        while True:
            step = prune_step(items, rule, factor, session.pruned_upto, all_count, all_tokens, session.pruned_count,
                              session.pruned_tokens, keep=kept)
            if step is not None:
                return step if not step.advanced or self._step_pays(session, step, items) else \
                    PruneStep(session.pruned_upto)
            if complete:
                return PruneStep(session.pruned_upto)  # the whole context is protected
            want = 2 * max(want, sum(item.tokens for item in items))
            items, complete = self.store().tail(session, want, len(items) + 1)

    def _step_pays(self, session: SessionRow, step: PruneStep, tail: list[ItemRow]) -> bool:
        """Whether a due prune step pays back before the next auto-compaction rewrites the prompt anyway.

        Always when pruning may postpone compaction, when no auto-compaction is coming, or when the whole context no
        longer fits the default budget (compaction is failing or skipped; pruning is what keeps old messages in).
        """
        prune, compaction = self.settings.prune, self.settings.compaction
        if prune.postpone_compaction or not compaction.automatic:
            return True
        factor = session.calibration
        window = self.context_window(session)
        whole = session.context_tokens * factor
        if whole > self.prompt_budget(session):
            return True
        rule = self.prune_rule()
        saved = step.tokens * factor - step.count * rule.placeholder_tokens
        sent = pruned_total(math.ceil(whole), session.pruned_count, session.pruned_tokens, rule, factor)
        state = self.runtime.get(session.session_id)
        measured = state.growth_per_prompt if state is not None else None
        sizes = [item.tokens for item in tail if item.kind == "message"]
        growth = measured if measured else ITEMS_PER_PROMPT * sum(sizes) / max(1, len(sizes))
        return step_pays(saved, sent - saved, compaction_threshold(window, compaction) - whole, growth * factor,
                         prune.cache_read_price, prune.cache_write_price)

    def estimated_tokens(self, session: SessionRow, prune: bool | None = None,
                         tail: tuple[list[ItemRow], bool] | None = None) -> int:
        """Tokens of the whole current context as assemble would build it with no budget.

        ``tail`` may pass newest raw items already fetched (covering ``protectTokens``) to save a read.
        """
        factor = session.calibration
        total = math.ceil(session.context_tokens * factor)
        if not (self.settings.prune.enabled if prune is None else prune) or session.last_position is None:
            return total
        step = self.prune_state(session, tail)
        session = self.session(session.session_id)
        rule = self.prune_rule()
        # Anchored (pinned) outputs behind the frontier stay whole: the stored totals count them, usage must not.
        kept = [item for item in self.store().anchors(session).items
                if item.position <= step.frontier and is_prunable(item, rule)]
        return pruned_total(total, session.pruned_count + step.count - len(kept),
                            session.pruned_tokens + step.tokens - sum(item.tokens for item in kept), rule, factor)

    def usage(self, session: SessionRow, tail: tuple[list[ItemRow], bool] | None = None) -> Usage:
        """The session's usage figures and state."""
        window = self.context_window(session)
        source: UsageSource
        try:
            estimate = self.estimated_tokens(session, tail=tail)
            # Unless pruning may postpone compaction, what it saves still counts toward the threshold.
            pruned = 0 if self.settings.prune.postpone_compaction else \
                max(0, self.estimated_tokens(session, prune=False) - estimate)
        except StorageUnavailable:  # a team database away: the stored totals, unpruned, until it is back
            estimate, pruned = math.ceil(session.context_tokens * session.calibration), 0
        if session.reported_tokens is not None and session.reported_revision == session.revision:
            tokens, source = session.reported_tokens, "provider"
        else:
            # The whole prompt, as the provider counts it: with what the client sends beside the context.
            tokens, source = estimate + self.overhead(session), "estimate"
        state = self.runtime.get(session.session_id)
        figures = usage_figures(tokens, window, self.settings.compaction,
                                state is not None and state.compacting and not state.waiting,
                                pruned)
        idle = state.idle_at if state is not None and self.settings.compaction.automatic else None
        hint = (idle and not_compacted_hint(figures.state, figures.percent, idle[1])) or figures.hint
        return Usage(
            session_id=session.session_id,
            tokens=figures.tokens,
            context_window=window,
            percent=figures.percent,
            threshold=figures.threshold,
            state=figures.state,
            source=source,
            messages=session.message_count,
            summaries=session.summary_count,
            hint=hint,
            calibration=round(session.calibration, 4),
            reported_tokens=session.reported_tokens,
            cache_hit_rate=hits[0] if (hits := state.cache_hits if state is not None else None) else None,
            cache_hit_rate_smoothed=round(hits[1], 4) if hits else None,
        )
