"""context/assemble and context/usage as plain functions."""

from __future__ import annotations

import html
import json
from typing import Any

from protocol.types import AssembleParams, AssembleResult, ContextItem, Usage, UsageParams
from sidecar.core import PLACEHOLDER_TOKENS, Sidecar
from sidecar.engine.assembly import PRUNED_PLACEHOLDER, Assembly, assemble, plan_pruning
from sidecar.engine.messages import openai_view
from sidecar.engine.usage import reserve_for
from sidecar.errors import invalid_params
from sidecar.memory import iso
from sidecar.storage import ItemRow, SessionRow, SummaryRow


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
    plan = choose_items(sidecar, session, budget, fresh_tail, prune)
    messages, items = render(sidecar, session, plan)
    return AssembleResult(
        messages=messages,
        items=items,
        tokens=plan.tokens,
        dropped=session.context_count - len(items),
        over_budget=plan.over_budget,
        usage=sidecar.usage(session),
    )


def choose_items(sidecar: Sidecar, session: SessionRow, budget: int, fresh_tail: int, prune: bool) -> Assembly:
    """Fetch newest items until the budget is covered, then decide pruning and the fill."""
    store = sidecar.store()
    rule = sidecar.prune_rule()
    want = budget + (rule.protect_tokens if prune else 0)
    while True:
        items, complete = store.tail(session, want + 1, fresh_tail + 1)
        items = sidecar.calibrated(items, session)
        pruned: frozenset[int] = frozenset()
        if prune:
            older = 0
            if not complete and items:
                older = store.prunable_before(session, items[0].position, rule)[1]
            pruned = plan_pruning(items, rule, older)
        plan = assemble(items, budget, fresh_tail, pruned, rule.placeholder_tokens)
        # Pruning can shrink what was fetched below the budget; then fetch further back.
        if complete or not plan.exhausted:
            return plan
        want *= 4


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
            messages.append({"role": "user", "content": render_summary(summaries[item.ref_id])})
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


def render_summary(summary: SummaryRow) -> str:
    """A summary as the content of a user message; the text is escaped so it cannot close or forge the tag."""
    attributes = {
        "id": summary.id,
        "kind": summary.kind,
        "depth": str(summary.depth),
        "earliest_at": iso(summary.earliest_at) or "",
        "latest_at": iso(summary.latest_at) or "",
    }
    tag = " ".join(f'{name}="{html.escape(value, quote=True)}"' for name, value in attributes.items())
    return (
        f"<summary {tag}>\n{html.escape(summary.content, quote=False)}\n</summary>\n"
        f"This summarizes earlier messages. To recover their full detail, call memory/expand with "
        f"id {json.dumps(summary.id)}."
    )


def usage(sidecar: Sidecar, params: UsageParams) -> Usage:
    """The session's usage."""
    return sidecar.usage(sidecar.session(params.session_id))
