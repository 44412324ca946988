"""context/assemble and context/usage as plain functions."""

from __future__ import annotations

import logging
import math
from typing import Any

from protocol.types import AssembleParams, AssembleResult, ContextItem, ReportUsageParams, Usage, UsageParams
from sidecar.core import PLACEHOLDER_TOKENS, Sidecar
from sidecar.engine.assembly import PRUNED_PLACEHOLDER, Assembly, assemble, is_prunable, plan_pruning
from sidecar.engine.messages import openai_view
from sidecar.engine.summaries import render_summary
from sidecar.engine.usage import reserve_for
from sidecar.errors import invalid_params
from sidecar.memory import iso
from sidecar.storage.rows import ItemRow, SessionRow, SummaryRow

log = logging.getLogger(__name__)


def assemble_context(sidecar: Sidecar, params: AssembleParams) -> AssembleResult:
    """The message list for the next LLM call, within the budget, valid for any OpenAI-compatible API."""
    session = sidecar.session(params.session_id)
    compaction = sidecar.settings.compaction
    window = sidecar.context_window(session)
    budget = window - reserve_for(window, compaction) if params.budget is None else params.budget
    if budget < 0:
        raise invalid_params("budget must not be negative", "budget")
    fresh_tail = compaction.fresh_tail if params.fresh_tail is None else params.fresh_tail
    if fresh_tail < 0:
        raise invalid_params("freshTail must not be negative", "freshTail")
    prune = sidecar.settings.prune.enabled if params.prune is None else params.prune
    plan, tail = choose_items(sidecar, session, budget, fresh_tail, prune)
    messages, items = render(sidecar, session, plan)
    sidecar.assembled[session.session_id] = (session.revision, plan.tokens / session.calibration)
    return AssembleResult(
        messages=messages,
        items=items,
        tokens=plan.tokens,
        dropped=session.context_count - len(items),
        over_budget=plan.over_budget,
        usage=sidecar.usage(session, tail=tail if prune else None),  # a pruning fetch covers protectTokens
    )


def choose_items(sidecar: Sidecar, session: SessionRow, budget: int, fresh_tail: int,
                 prune: bool) -> tuple[Assembly, tuple[list[ItemRow], bool]]:
    """Fetch newest items until the budget is covered, then decide pruning and the fill; returns the raw tail too.

    Older items than those fetched enter the pruning decision through the session's running totals.
    """
    store = sidecar.store()
    rule = sidecar.prune_rule()
    factor = session.calibration
    want = math.ceil(budget / factor)
    if prune and session.context_tokens:
        # Pruned outputs shrink to placeholders, so a budget holds more items: fetch for that at once.
        share = min(session.prunable_tokens / session.context_tokens, 0.9)
        want = math.ceil(want / (1 - share))
    raw, complete = store.tail(session, want + 1, fresh_tail + 1)
    while True:
        pruned: frozenset[int] = frozenset()
        if prune:
            _, all_tokens = sidecar.prune_totals(session)
            older = all_tokens - sum(item.tokens for item in raw if is_prunable(item, rule))
            pruned = plan_pruning(raw, rule, older, factor)
        plan = assemble(sidecar.calibrated(raw, session), budget, fresh_tail, pruned, rule.placeholder_tokens)
        if complete or not plan.exhausted:
            return plan, (raw, complete)
        older_items, complete = store.tail(session, want + 1, 1, before=raw[0].position)
        raw = older_items + raw
        want *= 2


def render(sidecar: Sidecar, session: SessionRow, plan: Assembly) -> tuple[list[dict[str, Any]], list[ContextItem]]:
    """OpenAI messages for the chosen items, and the items beside them."""
    store = sidecar.store()
    chosen: list[ItemRow] = plan.chosen  # type: ignore[assignment]
    raws = store.message_raws(session.session_id, [i.position for i in chosen if i.kind == "message"])
    summaries = store.summaries(session.session_id, [i.ref_id for i in chosen if i.kind == "summary"])
    messages: list[dict[str, Any]] = []
    items: list[ContextItem] = []
    for item in chosen:
        if item.kind == "summary":
            messages.append({"role": "user", "content": render_stored_summary(summaries[item.ref_id])})
            items.append(ContextItem(kind="summary", id=item.ref_id, tokens=item.tokens))
            continue
        message = openai_view(raws[item.position])
        pruned = item.position in plan.pruned
        if pruned:
            message["content"] = f"{PRUNED_PLACEHOLDER} (id {item.ref_id})"
        if item.position in plan.answered:
            keep = plan.answered[item.position]
            calls = [call for call in message.get("tool_calls") or () if call["id"] in keep]
            if calls:
                message["tool_calls"] = calls
            else:
                message.pop("tool_calls", None)
                if not message.get("content"):
                    continue  # nothing left to send: a call whose results are not stored yet
        messages.append(message)
        items.append(ContextItem(kind="message", id=item.ref_id, tokens=plan_tokens(item, plan),
                                 pruned=True if pruned else None))
    return messages, items


def plan_tokens(item: ItemRow, plan: Assembly) -> int:
    """An item's tokens as assembled (the placeholder's when pruned)."""
    return PLACEHOLDER_TOKENS if item.position in plan.pruned else item.tokens


def render_stored_summary(summary: SummaryRow) -> str:
    """A stored summary as the content of its user message."""
    return render_summary(summary.id, summary.kind, summary.depth, iso(summary.earliest_at), iso(summary.latest_at),
                          summary.content)


CALIBRATION_SMOOTHING = 0.5
CALIBRATION_BOUNDS = (0.25, 4.0)
MIN_CALIBRATION_BASIS = 256
"""Contexts smaller than this (estimated tokens) say too little about the tokenizer to calibrate on."""


def report_usage(sidecar: Sidecar, params: ReportUsageParams) -> Usage | None:
    """Record what the provider counted; returns the new usage, or None when the report was ignored."""
    counts = {"inputTokens": params.input_tokens, "outputTokens": params.output_tokens,
              "cacheReadTokens": params.cache_read_tokens or 0, "cacheWriteTokens": params.cache_write_tokens or 0}
    negative = [name for name, value in counts.items() if value < 0]
    if negative:
        log.warning("context/reportUsage for %r ignored: negative %s", params.session_id, ", ".join(negative))
        return None
    store = sidecar.store()
    session = store.session(params.session_id)
    if session is None:
        log.warning("context/reportUsage for unknown session %r ignored", params.session_id)
        return None
    prompt = params.input_tokens + counts["cacheReadTokens"] + counts["cacheWriteTokens"]
    revision, basis = sidecar.assembled.get(session.session_id, (None, 0.0))
    if revision != session.revision:
        basis = sidecar.estimated_tokens(session) / session.calibration
    calibration = session.calibration
    if basis >= MIN_CALIBRATION_BASIS and prompt > 0:
        sample = prompt / basis
        calibration = (1 - CALIBRATION_SMOOTHING) * calibration + CALIBRATION_SMOOTHING * sample
        calibration = min(max(calibration, CALIBRATION_BOUNDS[0]), CALIBRATION_BOUNDS[1])
    # PROTOCOL.md names input + cacheRead + output; cache writes are prompt tokens too (Anthropic reports a
    # freshly cached prompt only there), so they count: 0 from providers that have no such figure.
    reported = prompt + params.output_tokens
    store.record_reported_usage(session.session_id, reported, calibration)
    return sidecar.usage(sidecar.session(session.session_id))


def usage(sidecar: Sidecar, params: UsageParams) -> Usage:
    """The session's usage."""
    return sidecar.usage(sidecar.session(params.session_id))
