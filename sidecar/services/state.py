"""The sidecar's state: settings, the open store, per-session runtime flags, and shared reads."""

from __future__ import annotations

import logging
import math
import os
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from protocol import errors as codes
from protocol.types import Usage, UsageSource
from sidecar.config.models import context_window_for
from sidecar.config.paths import default_storage_path, legacy_workspace_path, workspace_key
from sidecar.config.settings import Settings
from sidecar.config.sockets import ShareError, check_owner
from sidecar.engine.assembly import PRUNED_PLACEHOLDER, PruneRule, PruneStep, is_prunable, prune_step, pruned_total
from sidecar.engine.cache_cost import ITEMS_PER_PROMPT, smoothed_growth, step_pays
from sidecar.engine.messages import RenderedMessages
from sidecar.engine.tokens import MESSAGE_OVERHEAD_TOKENS, estimate_text_tokens
from sidecar.engine.usage import compaction_threshold, default_budget, not_compacted_hint, usage_figures
from sidecar.rows import ItemRow, SessionRow, StorageFailure, StorageLocked, prune_rule_key
from sidecar.services.errors import SidecarError, unknown_session

if TYPE_CHECKING:
    from sidecar.storage.database import Storage

log = logging.getLogger(__name__)

PLACEHOLDER_TOKENS = estimate_text_tokens(PRUNED_PLACEHOLDER + " (id msg_00000000000000000000000000000000)") \
    + MESSAGE_OVERHEAD_TOKENS


@attrs.define
class Sidecar:
    """Everything a request handler needs, shared by all of them."""

    settings: Settings = attrs.field(factory=Settings)
    storage_path: str | None = None
    """Set by ``--db``; otherwise from settings or the workspace root, at initialize."""

    usage_notifications: bool = True
    compaction_hooks: bool = False
    notify: Callable[[str, Any], None] = lambda method, params: None
    """Sends a notification to this connection's client (the server sets it)."""
    _storage: Storage | None = None
    compacting: set[str] = attrs.field(factory=set)
    assembled: dict[str, tuple[int, float]] = attrs.field(factory=dict)
    """Per session: (revision, uncalibrated tokens) of the last assembled context, the basis of calibration."""
    prompt_samples: dict[str, list[tuple[float, int]]] = attrs.field(factory=dict)
    """Per session: recent (estimated, provider-counted) prompt tokens, to tell a fixed overhead from a ratio."""
    recent_calls: dict[str, dict[str, str]] = attrs.field(factory=dict)
    """Per session: the tool name of recent tool calls, by call id."""
    rendered: RenderedMessages = attrs.field(factory=RenderedMessages)
    """Assembled messages as JSON text, reused while they stay in the context."""
    auto_backoff: dict[str, tuple[float, float]] = attrs.field(factory=dict)
    """Per session, after a failed auto-compaction: (not before this monotonic time, the next delay)."""
    auto_idle_at: dict[str, tuple[int, str]] = attrs.field(factory=dict)
    """Per session: context size at which auto-compaction last found nothing to do, and why."""
    prompts: dict[str, Any] = attrs.field(factory=dict)
    """Per session: its previous assembled prompt (``sidecar.services.prompt.Prompt``), for stablePrefix and deltas."""
    cache_hits: dict[str, tuple[float, float]] = attrs.field(factory=dict)
    """Per session: (last, smoothed) cache hit rate of the provider's reports."""
    prune_memo: dict[str, tuple[Any, PruneStep]] = attrs.field(factory=dict)
    """Per session: the last prune state computed, and the revision, frontier, calibration, settings it holds for."""
    prompt_growth: dict[str, tuple[int, int, float | None]] = attrs.field(factory=dict)
    """Per session: raw context tokens at its last assemble, the assembles since that added some, and the raw tokens
    they added on average."""
    revision_prefix: str = attrs.field(factory=lambda: uuid.uuid4().hex[:8])
    """Revisions name this sidecar (process, or a host's connection) too, so another's is never taken for ours."""
    revisions: int = 0
    merge_root: str | None = None
    """A workspace root whose file of earlier versions is to be merged before the store is first used."""
    cwd: str | None = None
    """Where relative paths in params start: a relay's working directory in a host; None for this process's."""
    workspace: str | None = None
    """Where this connection's new sessions belong: the client's root, else the agent's working directory."""
    owns_storage: bool = True
    """False for a host's connections: the store is the host's, opened and closed by it."""

    def attached(self) -> Sidecar:
        """A connection's view of this (a host's) sidecar: own settings, the same store and per-session state."""
        return Sidecar(storage_path=self.storage_path, storage=self._storage, compacting=self.compacting,
                       assembled=self.assembled, recent_calls=self.recent_calls, rendered=self.rendered,
                       auto_backoff=self.auto_backoff, auto_idle_at=self.auto_idle_at,
                       prompt_samples=self.prompt_samples, prompts=self.prompts, cache_hits=self.cache_hits,
                       prune_memo=self.prune_memo, prompt_growth=self.prompt_growth, owns_storage=False)

    def next_revision(self) -> str:
        """A new assemble revision."""
        self.revisions += 1
        return f"{self.revision_prefix}-{self.revisions}"

    def resolve_storage_path(self, workspace_root: str | None) -> str:
        """Fix the database path from --db, then settings, then the workspace; returns it."""
        if self.storage_path is None:
            self.storage_path = self.settings.storage.path or default_storage_path(workspace_root)
        return self.storage_path

    def store(self) -> Storage:
        """The open store; opened on first use so a lock held elsewhere is retried on each request."""
        if self._storage is not None and self._storage.invalidated:
            self._reopen(self._storage)
        if self._storage is None:
            path = self.storage_path or self.resolve_storage_path(None)
            from sidecar.storage.database import Storage  # DuckDB loads on first use, not at start-up

            try:
                check_owner(path)
                self._storage = Storage.open(path, self.settings.storage.memory_limit)
            except StorageLocked as error:
                raise SidecarError(codes.STORAGE_LOCKED, str(error), {"path": error.path, "pid": error.pid}) \
                    from error
            except (StorageFailure, ShareError) as error:
                raise SidecarError(codes.STORAGE_ERROR, str(error), {"path": path}) from error
            log.info("storage %s opened", path)
        if self.merge_root is not None:
            root, self.merge_root = self.merge_root, None
            merged = self.merge_legacy(root)
            if merged is not None:
                log.warning("%s", merged)
        return self._storage

    def merge_legacy(self, workspace_root: str) -> str | None:
        """Carry the workspace's file of earlier versions into the per-user database; returns what was done.

        Only when this is the per-user default database. The old file is renamed ``*.merged`` once every
        session of it is here; a session whose id exists here already is left in it (and the file kept).
        """
        legacy = legacy_workspace_path(workspace_root)
        if not (self.storage_path and os.path.exists(legacy)) or \
                os.path.realpath(self.storage_path) != os.path.realpath(default_storage_path()):
            return None
        from sidecar.storage.database import Storage

        try:
            Storage.open(legacy, self.settings.storage.memory_limit).close()  # migrated, its WAL folded in
            copied, left = self.store().merge_file(legacy, workspace_key(workspace_root))
        except (StorageFailure, StorageLocked) as error:
            return f"could not merge {legacy} into {self.storage_path} (tried again next time): {error}"
        if left:
            return (f"merged {len(copied)} sessions of {legacy} into {self.storage_path}; kept the file, whose "
                    f"sessions {', '.join(left)} have namesakes there")
        os.replace(legacy, legacy + ".merged")
        return f"merged {len(copied)} sessions of {legacy} into {self.storage_path}"

    def noticed(self, error: BaseException) -> None:
        """Look at a request's failure: one that invalidated the database gets it reopened on the next request."""
        if self._storage is not None:
            self._storage.note_failure(error)

    def _reopen(self, store: Storage) -> None:
        """Take back a database DuckDB invalidated; until that works, each request answers an error and retries."""
        log.warning("DuckDB invalidated %s; opening it again", store.path)
        try:
            store.reopen()
        except StorageLocked as error:
            raise SidecarError(codes.STORAGE_LOCKED, str(error), {"path": error.path, "pid": error.pid}) from error
        except StorageFailure as error:
            raise SidecarError(codes.STORAGE_ERROR, f"storage {store.path} was invalidated and could not be "
                               f"opened again: {error}", {"path": store.path}) from error
        self.forget()
        log.info("storage %s opened again", store.path)

    def forget(self, session_id: str | None = None) -> None:
        """Drop runtime state kept about a session (all sessions when None): on delete or settings change."""
        if session_id is None:
            self.rendered.clear()
            self.prune_memo.clear()
        else:  # a session deleted (perhaps made again under its id): its prompt and cache figures are gone
            self.prompts.pop(session_id, None)
            self.cache_hits.pop(session_id, None)
            self.prune_memo.pop(session_id, None)
        for table in (self.assembled, self.recent_calls, self.prompt_samples, self.auto_backoff, self.auto_idle_at,
                      self.prompt_growth):
            if session_id is None:
                table.clear()
            else:
                table.pop(session_id, None)

    @property
    def open_store(self) -> Storage | None:
        """The store if it is open, without trying to open it."""
        return self._storage

    def close(self) -> None:
        """Checkpoint and close the store, if open."""
        if not self.owns_storage:
            return
        store, self._storage = self._storage, None
        if store is not None:
            store.close()

    def session(self, session_id: str) -> SessionRow:
        """The session, or -32001."""
        session = self.store().session(session_id)
        if session is None:
            raise unknown_session(session_id)
        return session

    def context_window(self, session: SessionRow) -> int:
        """The session's window: its own, else its model's, else the setting."""
        if session.context_window:
            return session.context_window
        return context_window_for(session.model, self.settings.models) or self.settings.context_window

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
        memo = self.prune_memo.get(session.session_id)
        if tail is None and memo is not None and memo[0] == key:
            return memo[1]  # ingest's usage, assemble and its usage all ask at the same revision
        step = self._prune_state(session, tail)
        if tail is None:
            self.prune_memo[session.session_id] = (key, step)
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
        if whole > default_budget(window, compaction):
            return True
        rule = self.prune_rule()
        saved = step.tokens * factor - step.count * rule.placeholder_tokens
        sent = pruned_total(math.ceil(whole), session.pruned_count, session.pruned_tokens, rule, factor)
        measured = self.prompt_growth.get(session.session_id, (0, 0, None))[2]
        sizes = [item.tokens for item in tail if item.kind == "message"]
        growth = measured if measured else ITEMS_PER_PROMPT * sum(sizes) / max(1, len(sizes))
        return step_pays(saved, sent - saved, compaction_threshold(window, compaction) - whole, growth * factor,
                         prune.cache_read_price, prune.cache_write_price)

    def note_prompt(self, session: SessionRow) -> None:
        """Count an assemble toward the session's growth per prompt (what a prune step's savings last for)."""
        last, samples, growth = self.prompt_growth.get(session.session_id, (None, 0, None))
        if last is not None and session.context_tokens > last:
            samples += 1
            growth = smoothed_growth(growth, samples, session.context_tokens - last)
        self.prompt_growth[session.session_id] = (session.context_tokens, samples, growth)

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
        estimate = self.estimated_tokens(session, tail=tail)
        if session.reported_tokens is not None and session.reported_revision == session.revision:
            tokens, source = session.reported_tokens, "provider"
        else:
            tokens, source = estimate, "estimate"
        # Unless pruning may postpone compaction, what it saves still counts toward the threshold.
        postpone = self.settings.prune.postpone_compaction
        pruned = 0 if postpone else max(0, self.estimated_tokens(session, prune=False) - estimate)
        figures = usage_figures(tokens, window, self.settings.compaction, session.session_id in self.compacting,
                                pruned)
        idle = self.auto_idle_at.get(session.session_id) if self.settings.compaction.automatic else None
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
            cache_hit_rate=hits[0] if (hits := self.cache_hits.get(session.session_id)) else None,
            cache_hit_rate_smoothed=round(hits[1], 4) if hits else None,
        )
