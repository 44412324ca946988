"""context/assemble and context/usage as plain functions."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from protocol import methods
from protocol.types import AssembleParams, AssembleResult, DidPruneParams, ReportUsageParams, Usage, UsageParams
from sidecar.assemble_reply import context_item_head, context_item_tail, encode_assemble_result
from sidecar.engine.assembly import PRUNED_PLACEHOLDER, Assembly, appendable, assemble, is_prunable, plan_window
from sidecar.engine.messages import openai_view
from sidecar.engine.summaries import render_summary
from sidecar.engine.usage import prompt_budget, reserve_for, steady_budget
from sidecar.rows import ItemRow, SessionRow, SummaryRow, iso
from sidecar.services.errors import invalid_params
from sidecar.services.figures import PLACEHOLDER_TOKENS
from sidecar.services.prompt import Prompt
from sidecar.services.runtime import SessionRuntime
from sidecar.services.state import Sidecar
from sidecar.wire import RawJSON, dumps, unstructure, utf8

log = logging.getLogger(__name__)

MAX_SCALE = 8.0
"""The largest ``scale`` an assemble takes: a client whose messages are rendered larger is mistaken about them."""


@attrs.frozen
class Shortfall:
    """What an assemble found before it replied: the prompt would not hold what it must (see ``assemble_fitting``)."""

    budget: int
    over_budget: bool
    """The summaries, pinned messages and fresh tail alone exceed the budget."""


def assemble_context(sidecar: Sidecar, params: AssembleParams) -> RawJSON:
    """The message list for the next LLM call, within the budget, valid for any OpenAI-compatible API.

    Returned as the JSON text of an ``AssembleResult`` (``encode_assemble_result``): messages are spliced in as
    rendered once and kept.
    With ``since`` naming the session's previous reply, and that prompt unchanged but for messages added at its
    end, only those come back (``delta``); otherwise the whole prompt, with ``delta: false``.
    """
    reply = _assemble(sidecar, params, fitting=False)
    assert isinstance(reply, RawJSON)
    return reply


def _assemble(sidecar: Sidecar, params: AssembleParams, fitting: bool) -> RawJSON | Shortfall:
    """``assemble_context``; with ``fitting``, a prompt over its budget, or one leaving messages out while a
    compaction of the session runs, is not built: the ``Shortfall`` says so, and nothing was changed."""
    session = sidecar.session(params.session_id)
    state = sidecar.runtime.of(session.session_id)
    budget = _budget(sidecar, session, state, params)
    fresh_tail = sidecar.settings.compaction.fresh_tail if params.fresh_tail is None else params.fresh_tail
    if fresh_tail < 0:
        raise invalid_params("freshTail must not be negative", "freshTail")
    prune = sidecar.settings.prune.enabled if params.prune is None else params.prune
    reasoning = bool(params.reasoning)
    tools = None
    if params.tools:
        from sidecar.services.model_tools.definitions import DEFINITIONS_JSON

        tools = utf8(DEFINITIONS_JSON)
    state.note_prompt(session.context_tokens)
    previous = state.prompt
    key = (budget, fresh_tail, prune, reasoning)
    step = None
    if prune:
        due = sidecar.prune_state(session)
        session = sidecar.session(session.session_id)  # prune_state may have recounted the totals
        step = due if due.advanced else None
    anchors = sidecar.store().anchors(session)
    same = step is None and previous is not None and previous.holds(key, session, sidecar.settings, anchors)
    if same and params.since is not None and params.since == previous.revision:  # type: ignore[union-attr]
        fast = _appended(sidecar, session, state, previous, budget, reasoning, tools)  # type: ignore[arg-type]
        if fast is not None:
            return fast
    frontier = step.frontier if step is not None else session.pruned_upto
    plan, needed = choose_items(sidecar, session, budget, fresh_tail, frontier if prune else None,
                                previous.anchor if previous is not None
                                and previous.anchors(key, session, sidecar.settings) else None)
    if fitting and (plan.over_budget or (len(plan.chosen) < session.context_count and state.compacting)):
        return Shortfall(budget, plan.over_budget)
    stepped_from: int | None = None
    if step is not None:
        stepped_from = session.pruned_upto
        session = sidecar.store().advance_prune(session.session_id, step.frontier, step.count, step.tokens) or session
    messages, items, rows = render(sidecar, session, plan, reasoning)
    raw_tokens = {item.position: item.tokens for item in needed} if needed is not plan.chosen else None
    state.note_assembled(session.revision, plan.tokens / session.calibration)
    stable = previous.common_prefix(messages) if previous is not None else 0
    anchor = plan.start  # where the fill starts: system and pinned messages before it are always sent anyway
    revision = sidecar.next_revision()
    prompt = Prompt.assembled(revision, key, session, sidecar.settings, plan, messages, rows, raw_tokens,
                              anchors.positions)
    sidecar.runtime.keep_prompt(session.session_id, prompt)
    result = AssembleResult(messages=[], items=[], tokens=plan.tokens, dropped=session.context_count - len(items),
                            over_budget=plan.over_budget, usage=sidecar.usage(session), revision=revision,
                            stable_prefix=stable, cache_breakpoints=prompt.breakpoints(stable), budget=budget,
                            fixed_breakpoints=prompt.leading,
                            reason=over_budget_reason(sidecar, session, plan, budget) if plan.over_budget else None)
    if stepped_from is not None:
        announce_prune(sidecar, session, stepped_from, session.pruned_upto, plan, anchors.positions)
    if params.since is not None:
        # Not after a rewrite (a prune step, a compaction, a pin, another fill, other settings): the whole prompt.
        result.delta = same and params.since == previous.revision and anchor == previous.anchor  # type: ignore
        if result.delta:
            result.keep = stable
            messages, items = messages[stable:], items[stable:]
    return encode_assemble_result(result, messages, items, tools)


async def assemble_fitting(sidecar: Sidecar, params: AssembleParams,
                           fit: Callable[[str, int], Awaitable[Any]],
                           after_running: Callable[[str], Awaitable[Any]]) -> RawJSON:
    """``context/assemble`` that compacts rather than leave out what the prompt must hold.

    A compaction of the session that is running is waited for when the prompt would leave messages out without it.
    Summaries, pinned messages and the fresh tail over the budget the sidecar worked out (no ``budget`` named) are
    compacted first (``fit``: automatic compaction, the kept tail within half the budget); then the prompt is built
    as it can be (``reason`` says why when it is still over).
    """
    fitted = False
    while True:
        reply = _assemble(sidecar, params, fitting=True)
        if not isinstance(reply, Shortfall):
            return reply
        if sidecar.runtime.of(params.session_id).running is not None:
            await after_running(params.session_id)
        elif reply.over_budget and not fitted and params.budget is None:  # a budget named is the client's to keep
            fitted = True
            await fit(params.session_id, reply.budget)
        else:
            return assemble_context(sidecar, params)


def _budget(sidecar: Sidecar, session: SessionRow, state: SessionRuntime, params: AssembleParams) -> int:
    """The budget asked for, else the prompt's: the window less the reply's room and the client's overhead, kept
    while that changes by little (``steady_budget``)."""
    if params.overhead_tokens is not None:
        if params.overhead_tokens < 0:
            raise invalid_params("overheadTokens must not be negative", "overheadTokens")
        state.overhead = params.overhead_tokens
    scale = 1.0 if params.scale is None else params.scale
    if not (1.0 <= scale <= MAX_SCALE):
        raise invalid_params(f"scale must be between 1 and {MAX_SCALE:g}", "scale")
    if params.budget is not None:
        if params.budget < 0:
            raise invalid_params("budget must not be negative", "budget")
        return params.budget
    if params.reply_tokens is not None and params.reply_tokens < 0:
        raise invalid_params("replyTokens must not be negative", "replyTokens")
    wanted = prompt_budget(sidecar.context_window(session), sidecar.settings.compaction, state.overhead, scale,
                           params.reply_tokens or 0)
    state.budget = steady_budget(wanted, state.budget)
    return state.budget


def over_budget_reason(sidecar: Sidecar, session: SessionRow, plan: Assembly, budget: int) -> str:
    """Why a prompt is over its budget, naming what decides it."""
    forced = plan.tokens
    window = sidecar.context_window(session)
    compaction = sidecar.settings.compaction
    text = f"the summaries, pinned messages and fresh tail hold {forced:,} tokens, over the budget of {budget:,}"
    if budget == 0:
        return text + (f": the model's window ({window:,}) less the reply's reserve (compaction.reserveTokens, "
                       f"{reserve_for(window, compaction):,}) leaves no room beside the {sidecar.overhead(session):,} "
                       "tokens of system prompt and tools")
    if not compaction.automatic:
        return text + " (automatic compaction is off: compaction.auto, compaction.maxTokens)"
    state = sidecar.runtime.get(session.session_id)
    if state is not None and state.idle_at is not None:
        return text + f"; compaction replaced nothing: {state.idle_at[1]}"
    return text + "; what is left cannot be compacted (the newest messages alone exceed it)"


def _appended(sidecar: Sidecar, session: SessionRow, state: SessionRuntime, previous: Prompt, budget: int,
              reasoning: bool = False, tools: bytes | None = None) -> RawJSON | None:
    """The delta reply when only whole units were appended since ``previous`` and they fit: the prompt's previous
    messages stay as they are, so only the new ones are read and rendered; None when the full path must decide."""
    if previous.over_budget or previous.last_position is None or session.last_position is None:
        return None
    if previous.calibration != session.calibration:  # a usage report since: the same messages, other figures
        previous.recalibrate(session.calibration, sidecar.prune_rule().placeholder_tokens)
    new = sidecar.store().items_after(session, previous.last_position)
    if session.revision - previous.session_revision != len(new):
        return None  # something else changed the context too
    if not appendable((item.role, item.tool_call_ids, item.tool_call_id) for item in new):
        return None
    chosen = sidecar.calibrated(new, session)
    tokens = previous.tokens + sum(item.tokens for item in chosen)
    if tokens > budget:
        return None  # the fill must move
    plan = Assembly(chosen=chosen, pruned=frozenset(), answered={}, tokens=tokens, over_budget=False,  # type: ignore
                    exhausted=False)
    messages, items, rows = render(sidecar, session, plan, reasoning)
    raw = {item.position: item.tokens for item in new}
    pins = sidecar.store().anchors(session).positions  # pinned messages among the new ones
    keep = previous.append(sidecar.next_revision(), session, messages, (raw[row.position] for row in rows), tokens,
                           pins)
    sidecar.runtime.keep_prompt(session.session_id, previous)
    state.note_assembled(session.revision, tokens / session.calibration)
    dropped = session.context_count - len(previous.messages)
    result = AssembleResult(messages=[], items=[], tokens=tokens, dropped=dropped, over_budget=False,
                            usage=sidecar.usage(session), revision=previous.revision, stable_prefix=keep,
                            cache_breakpoints=previous.breakpoints(keep), delta=True, keep=keep, budget=budget,
                            fixed_breakpoints=previous.leading)
    return encode_assemble_result(result, messages, items, tools)


def announce_prune(sidecar: Sidecar, session: SessionRow, after: int, upto: int, plan: Assembly,
                   anchored: frozenset[int] = frozenset()) -> None:
    """context/didPrune for the step that pruned the outputs in (after, upto], but the ``anchored`` (pinned) ones."""
    rule = sidecar.prune_rule()
    newly = [item for item in sidecar.store().items(session, after, upto)
             if is_prunable(item, rule) and item.position not in anchored]
    if not newly:
        return
    factor = session.calibration
    saved = sum(math.ceil(item.tokens * factor) for item in newly) - len(newly) * rule.placeholder_tokens
    first = newly[0].position
    rewritten = sum(rule.placeholder_tokens if item.position in plan.pruned else item.tokens
                    for item in plan.chosen if item.position >= first)
    sidecar.notify(methods.CONTEXT_DID_PRUNE, unstructure(DidPruneParams(
        session_id=session.session_id, ids=[item.ref_id for item in newly], tokens_saved=saved,
        tokens_rewritten=rewritten)))


def choose_items(sidecar: Sidecar, session: SessionRow, budget: int, fresh_tail: int, frontier: int | None,
                 anchor: int | None = None) -> tuple[Assembly, list[ItemRow]]:
    """Read newest items until they surely cover the budget, then mark the pruned ones and fill; also returns the
    raw items it chose from (``chosen`` itself when the calibration changes no figure).

    ``frontier`` is the prune frontier (None: no pruning); ``anchor`` where the previous fill started.
    """
    store = sidecar.store()
    rule = sidecar.prune_rule() if frontier is not None else None
    factor = session.calibration
    want = math.ceil(budget / factor)
    if rule is not None and session.context_tokens:
        # Pruned outputs shrink to placeholders, so a budget holds more items: read for that at once.
        share = min(session.prunable_tokens / session.context_tokens, 0.9)
        want = math.ceil(want / (1 - share))
    anchors = store.anchors(session)
    while True:
        raw, complete = store.tail(session, want + 1, fresh_tail + 1)
        window = plan_window(raw, budget, fresh_tail, rule, frontier or 0, factor, anchors.positions)
        if window.covered or complete:
            needed = raw[window.start:]
            placeholder = rule.placeholder_tokens if rule is not None else PLACEHOLDER_TOKENS
            always = store.summary_items(session)
            if anchors.items or always:
                # Anchored items and summaries older than the window join it: they are always sent, in their place.
                start = needed[0].position if needed else math.inf
                older = [item for item in anchors.items if item.position < start]
                older += [item for item in always if item.position < start]
                needed = sorted(older, key=lambda item: item.position) + needed if older else needed
            calibrated = sidecar.calibrated(needed, session)
            plan = assemble(calibrated, budget, fresh_tail, window.pruned, placeholder, anchors.positions,
                            anchors.system, anchor)
            return plan, (plan.chosen if calibrated is needed else needed)  # type: ignore[return-value]
        want = max(want * 2, 2 * sum(item.tokens for item in raw))


PRUNED_TAIL = context_item_tail(PLACEHOLDER_TOKENS, pruned=True)


def render(sidecar: Sidecar, session: SessionRow, plan: Assembly,
           reasoning: bool = False) -> tuple[list[bytes], list[str], list[ItemRow]]:
    """The chosen items as OpenAI messages (UTF-8 JSON), as ``items`` entries (JSON text), and as the rows.

    ``reasoning``: messages keep their stored reasoning; those renderings are made afresh, never kept.
    """
    store = sidecar.store()
    rendered = sidecar.runtime.rendered
    chosen: list[ItemRow] = plan.chosen  # type: ignore[assignment]
    summaries = store.summaries(session.session_id, [i.ref_id for i in chosen if i.kind == "summary"])
    messages: list[bytes] = []
    items: list[str] = []
    missing: list[tuple[int, ItemRow]] = []
    for item in chosen:
        if item.kind == "summary":
            messages.append(utf8(dumps({"role": "user", "content": render_stored_summary(summaries[item.ref_id])})))
            items.append(context_item_head("summary", item.ref_id) + context_item_tail(item.tokens))
            continue
        pruned = item.position in plan.pruned
        entry = None if reasoning or item.position in plan.answered else rendered.get(item.position, pruned)
        tail = PRUNED_TAIL if pruned else context_item_tail(item.tokens)
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
        messages, items, chosen = [messages[i] for i in keep], [items[i] for i in keep], [chosen[i] for i in keep]
    return messages, items, chosen


def _render_missing(sidecar: Sidecar, session: SessionRow, plan: Assembly, messages: list[bytes], items: list[str],
                    missing: list[tuple[int, ItemRow]], reasoning: bool = False) -> None:
    """Render, from the stored JSON, messages not kept rendered and those whose tool calls are trimmed."""
    raws = sidecar.store().message_raws(session.session_id, [item.position for _, item in missing])
    for index, item in missing:
        pruned = item.position in plan.pruned
        message = openai_view(raws[item.position], reasoning)
        if pruned:
            message["content"] = f"{PRUNED_PLACEHOLDER} (id {item.ref_id})"
        head = context_item_head("message", item.ref_id)
        items[index] = head + items[index]
        if reasoning and item.position not in plan.answered:
            messages[index] = utf8(dumps(message))
            continue
        if item.position not in plan.answered:
            messages[index] = sidecar.runtime.rendered.put(item.position, pruned, utf8(dumps(message)), head)[0]
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
    state = sidecar.runtime.of(session.session_id)
    basis = state.calibration_basis(session.revision)
    if basis is None:
        basis = sidecar.estimated_tokens(session) / session.calibration
    calibration = session.calibration
    if basis >= MIN_CALIBRATION_BASIS:
        sample = state.calibration_sample(basis, prompt)
        calibration = (1 - CALIBRATION_SMOOTHING) * calibration + CALIBRATION_SMOOTHING * sample
        calibration = min(max(calibration, CALIBRATION_BOUNDS[0]), CALIBRATION_BOUNDS[1])
    # docs/protocol.md names input + cacheRead + output; cache writes are prompt tokens too (Anthropic reports a
    # freshly cached prompt only there), so they count: 0 from providers that have no such figure.
    if prompt > 0:
        state.note_cache_hits(counts["cacheReadTokens"], prompt)
    reported = prompt + params.output_tokens
    store.record_reported_usage(session.session_id, reported, calibration)
    return sidecar.usage(sidecar.session(session.session_id))


def usage(sidecar: Sidecar, params: UsageParams) -> Usage:
    """The session's usage."""
    return sidecar.usage(sidecar.session(params.session_id))
