"""context/assemble and context/usage as plain functions."""

from __future__ import annotations

import logging
import math

from protocol.types import AssembleParams, ReportUsageParams, Usage, UsageParams
from sidecar.engine.assembly import PRUNED_PLACEHOLDER, Assembly, assemble, plan_window
from sidecar.engine.messages import openai_view
from sidecar.engine.summaries import render_summary
from sidecar.engine.usage import reserve_for
from sidecar.services.errors import invalid_params
from sidecar.services.memory import iso
from sidecar.services.state import PLACEHOLDER_TOKENS, Sidecar
from sidecar.storage.rows import ItemRow, SessionRow, SummaryRow
from sidecar.wire import RawJSON, dumps, unstructure, utf8

log = logging.getLogger(__name__)


def assemble_context(sidecar: Sidecar, params: AssembleParams) -> RawJSON:
    """The message list for the next LLM call, within the budget, valid for any OpenAI-compatible API.

    Returned as the JSON text of an ``AssembleResult``: messages are spliced in as rendered once and kept.
    """
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
    plan = choose_items(sidecar, session, budget, fresh_tail, prune)
    messages, items = render(sidecar, session, plan, bool(params.reasoning))
    sidecar.assembled[session.session_id] = (session.revision, plan.tokens / session.calibration)
    rest = {"tokens": plan.tokens, "dropped": session.context_count - len(items),
            "overBudget": plan.over_budget, "usage": unstructure(sidecar.usage(session))}
    tools = b""
    if params.tools:
        from sidecar.services.model_tools.definitions import DEFINITIONS_JSON

        tools = b'"tools":' + utf8(DEFINITIONS_JSON) + b","
    return RawJSON(b"".join((b'{"messages":[', b",".join(messages), b'],"items":[', utf8(",".join(items)), b"],",
                             tools, utf8(dumps(rest)[1:]))))


def choose_items(sidecar: Sidecar, session: SessionRow, budget: int, fresh_tail: int, prune: bool) -> Assembly:
    """Read newest items until they surely cover the budget, then decide pruning and the fill.

    Older items than those read enter the pruning decision through the session's running totals.
    """
    store = sidecar.store()
    rule = sidecar.prune_rule() if prune else None
    factor = session.calibration
    want = math.ceil(budget / factor)
    if rule is not None and session.context_tokens:
        # Pruned outputs shrink to placeholders, so a budget holds more items: read for that at once.
        share = min(session.prunable_tokens / session.context_tokens, 0.9)
        want = math.ceil(want / (1 - share))
    all_prunable = sidecar.prune_totals(session)[1] if rule is not None else 0
    anchors = store.anchors(session)
    while True:
        raw, complete = store.tail(session, want + 1, fresh_tail + 1)
        window = plan_window(raw, budget, fresh_tail, rule, all_prunable, factor, anchors.positions)
        if window.covered or complete:
            needed = raw[window.start:]
            placeholder = rule.placeholder_tokens if rule is not None else PLACEHOLDER_TOKENS
            if anchors.items:
                # Anchored items older than the window join it: they are always sent, in their place.
                start = needed[0].position if needed else math.inf
                needed = [item for item in anchors.items if item.position < start] + needed
            return assemble(sidecar.calibrated(needed, session), budget, fresh_tail, window.pruned, placeholder,
                            anchors.positions, anchors.system)
        want = max(want * 2, 2 * sum(item.tokens for item in raw))


def render(sidecar: Sidecar, session: SessionRow, plan: Assembly,
           reasoning: bool = False) -> tuple[list[bytes], list[str]]:
    """The chosen items as OpenAI messages (UTF-8 JSON) and as ``items`` entries (JSON text).

    ``reasoning``: messages keep their stored reasoning; those renderings are made afresh, never kept.
    """
    store = sidecar.store()
    rendered = sidecar.rendered
    chosen: list[ItemRow] = plan.chosen  # type: ignore[assignment]
    summaries = store.summaries(session.session_id, [i.ref_id for i in chosen if i.kind == "summary"])
    messages: list[bytes] = []
    items: list[str] = []
    missing: list[tuple[int, ItemRow]] = []
    for item in chosen:
        if item.kind == "summary":
            messages.append(utf8(dumps({"role": "user", "content": render_stored_summary(summaries[item.ref_id])})))
            items.append(f'{{"kind":"summary","id":{dumps(item.ref_id)},"tokens":{item.tokens}}}')
            continue
        pruned = item.position in plan.pruned
        entry = None if reasoning or item.position in plan.answered else rendered.get(item.position, pruned)
        tail = f'{PLACEHOLDER_TOKENS},"pruned":true}}' if pruned else f"{item.tokens}}}"
        if entry is None:
            missing.append((len(messages), item))
            messages.append(b"")
            items.append(tail)
        else:
            messages.append(entry[0])
            items.append(entry[1] + tail)
    if missing:
        _render_missing(sidecar, session, plan, messages, items, missing, reasoning)
    # A call left with no results and no text renders as nothing: drop it and its entry.
    keep = [index for index, text in enumerate(messages) if text]
    if len(keep) != len(messages):
        messages, items = [messages[i] for i in keep], [items[i] for i in keep]
    return messages, items


def _render_missing(sidecar: Sidecar, session: SessionRow, plan: Assembly, messages: list[bytes], items: list[str],
                    missing: list[tuple[int, ItemRow]], reasoning: bool = False) -> None:
    """Render, from the stored JSON, messages not kept rendered and those whose tool calls are trimmed."""
    raws = sidecar.store().message_raws(session.session_id, [item.position for _, item in missing])
    for index, item in missing:
        pruned = item.position in plan.pruned
        message = openai_view(raws[item.position], reasoning)
        if pruned:
            message["content"] = f"{PRUNED_PLACEHOLDER} (id {item.ref_id})"
        head = f'{{"kind":"message","id":{dumps(item.ref_id)},"tokens":'
        items[index] = head + items[index]
        if reasoning and item.position not in plan.answered:
            messages[index] = utf8(dumps(message))
            continue
        if item.position not in plan.answered:
            messages[index] = sidecar.rendered.put(item.position, pruned, utf8(dumps(message)), head)[0]
            continue
        keep = plan.answered[item.position]
        calls = [call for call in message.get("tool_calls") or () if call["id"] in keep]
        if calls:
            message["tool_calls"] = calls
        else:
            message.pop("tool_calls", None)
            if not message.get("content"):
                continue  # nothing left to send: a call whose results are not stored yet
        messages[index] = utf8(dumps(message))


def render_stored_summary(summary: SummaryRow) -> str:
    """A stored summary as the content of its user message."""
    return render_summary(summary.id, summary.kind, summary.depth, iso(summary.earliest_at), iso(summary.latest_at),
                          summary.content)


CALIBRATION_SMOOTHING = 0.5
CALIBRATION_BOUNDS = (0.25, 4.0)
OVERHEAD_SAMPLES = 8
"""Recent reports a session's prompt overhead is fitted on."""
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
    if prompt == 0:
        # Some backends write zeros where they count nothing; taken as real, the context would look empty.
        log.warning("context/reportUsage for %r ignored: 0 prompt tokens is no count of a real prompt",
                    params.session_id)
        return None
    revision, basis = sidecar.assembled.get(session.session_id, (None, 0.0))
    if revision != session.revision:
        basis = sidecar.estimated_tokens(session) / session.calibration
    calibration = session.calibration
    if basis >= MIN_CALIBRATION_BASIS:
        sample = calibration_sample(sidecar.prompt_samples.setdefault(session.session_id, []), basis, prompt)
        calibration = (1 - CALIBRATION_SMOOTHING) * calibration + CALIBRATION_SMOOTHING * sample
        calibration = min(max(calibration, CALIBRATION_BOUNDS[0]), CALIBRATION_BOUNDS[1])
    # PROTOCOL.md names input + cacheRead + output; cache writes are prompt tokens too (Anthropic reports a
    # freshly cached prompt only there), so they count: 0 from providers that have no such figure.
    reported = prompt + params.output_tokens
    store.record_reported_usage(session.session_id, reported, calibration)
    return sidecar.usage(sidecar.session(session.session_id))


def calibration_sample(samples: list[tuple[float, int]], basis: float, prompt: int) -> float:
    """Provider tokens per estimated token, with a fixed prompt overhead (system prompt, tools) taken out.

    The overhead is not in the stored history, so it is an offset, not a ratio: once the recent reports span
    contexts of different sizes (the largest 1.5 times the smallest), a line through them separates the two.
    """
    samples.append((basis, prompt))
    del samples[:-OVERHEAD_SAMPLES]
    low, high = min(b for b, _ in samples), max(b for b, _ in samples)
    if high < 1.5 * low:
        return prompt / basis
    mean_b = sum(b for b, _ in samples) / len(samples)
    mean_p = sum(p for _, p in samples) / len(samples)
    slope = sum((b - mean_b) * (p - mean_p) for b, p in samples) / sum((b - mean_b) ** 2 for b, _ in samples)
    if mean_p - slope * mean_b < 0:  # no overhead after all: the plain ratio
        return mean_p / mean_b
    return slope


def usage(sidecar: Sidecar, params: UsageParams) -> Usage:
    """The session's usage."""
    return sidecar.usage(sidecar.session(params.session_id))
