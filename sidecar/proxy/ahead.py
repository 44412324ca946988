"""Sending a request before the host has stored it: the previous assembled context, then what came since.

Between two rewrites (a compaction, a prune step, the fill moving) the sidecar's next context is its previous one with
the new messages appended (``context/assemble``'s delta). When a request only appends whole turns to the branch it
follows (no system message, every tool call among them answered among them) and all of it fits the budget, the proxy
forwards that context at once and sends the ingest and the assemble behind it; the host's answer, checked once it
comes, is what the next request builds on. Should the host have rewritten the context meanwhile, that request was
sent with the context as it stood before (as it would have been a moment earlier), and the next one has the new one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import attrs

from protocol import types as t
from sidecar.client import SidecarClient
from sidecar.engine.assembly import appendable
from sidecar.engine.tokens import estimate_bytes_tokens
from sidecar.proxy.adapters.base import Adapter, Unit, part_id
from sidecar.proxy.conversation import Branch
from sidecar.proxy.render import joined_size, render_context, rendered_tokens, unit_elements
from sidecar.services.prompt import cache_breakpoints
from sidecar.wire import structure

log = logging.getLogger(__name__)



@attrs.define
class Ahead:
    """A context sent ahead of the host, and what its assemble must answer to confirm it."""

    elements: list[bytes]
    """The context as rendered, without cache markers."""
    size: int
    """Their bytes (``render.joined_size``)."""
    ends: list[int]
    """For each item, the index of its group's last element."""
    breakpoints: list[int]
    """Item indexes to put cache markers after, as the host would name them."""
    keep: int
    """Items of the previous context, all kept."""
    ids: list[str]
    """The ids of the items appended, and the tool calls of each."""
    calls: list[tuple[str, ...]]
    covered: int
    """Units of the branch's path the context holds."""
    epoch: int


def plan(adapter: Adapter, branch: Branch, units: Sequence[tuple[str, Unit]], overhead: int) -> Ahead | None:
    """The context to send ahead: the branch's previous one and ``units`` (its stored units the previous context
    came before, then the request's new ones), with a body of ``overhead`` tokens beside it; None when the host must
    decide first."""
    if branch.revision is None or not branch.items or branch.over_budget or branch.epoch != branch.prompt_epoch \
            or branch.budget is None:
        return None
    ids: list[str] = []
    calls: list[tuple[str, ...]] = []
    parts: list[tuple[str, tuple[str, ...], str | None]] = []
    elements = list(branch.elements)
    ends = list(branch.ends)
    added = 0
    for uid, unit in units:
        split = adapter.parts(unit)
        for index, part in enumerate(split):
            ids.append(part_id(uid, index, len(split)))
            calls.append(tuple(call["id"] for call in part.get("tool_calls") or ()))
            parts.append((str(part.get("role")), calls[-1], str(part.get("tool_call_id"))))
        rendered = unit_elements(adapter, unit, uid)
        elements += rendered
        added += joined_size(rendered)
        ends += [len(elements) - 1] * len(split)
    if not appendable(parts):
        return None  # the host trims, reorders or leads with some of them
    if branch.tokens + estimate_bytes_tokens(added) > branch.budget:
        return None  # the host's fill may have to move
    if rendered_tokens(branch.size + added) + overhead > branch.budget * branch.scale + branch.overhead:
        return None  # this body leaves less room than the one the budget was worked out for
    keep = len(branch.items)
    return Ahead(elements, branch.size + added, ends, cache_breakpoints(branch.fixed, keep, keep + len(ids)), keep,
                 ids, calls, 0, branch.epoch)


async def check(client: SidecarClient, adapter: Adapter, branch: Branch, ahead: Ahead,
                stored: Any, assembling: Any) -> None:
    """Take the host's answers to a request sent ahead: its context becomes the branch's, the one sent when they
    are the same (else rendered from the answer); after an error the next request waits for the host."""
    try:
        if stored is not None:
            await stored
        result = structure(await assembling, t.AssembleResult)
    except Exception as error:  # the host's, or a reply of the wrong shape
        log.info("session %s: the request sent ahead was not stored (%s); the next one waits for the host",
                 branch.session_id, error)
        branch.forget_prompt()
        return
    try:
        same = bool(result.delta) and result.keep == ahead.keep and not result.over_budget \
            and [item.id for item in result.items] == ahead.ids and not any(item.pruned for item in result.items) \
            and [tuple(c["id"] for c in m.get("tool_calls") or ()) for m in result.messages] == ahead.calls
        take(branch, result, ahead.covered, ahead.epoch)
        if same:
            branch.elements, branch.ends, branch.size = ahead.elements, ahead.ends, ahead.size
        else:
            log.info("session %s: the sidecar's context changed (%s); the next request has it", branch.session_id,
                     "over budget" if result.over_budget else "rewritten" if not result.delta else "the fill moved")
            if result.over_budget:
                branch.forget_prompt()
            else:
                await render_context(client, adapter, branch, result)
    except Exception:
        log.exception("session %s: taking the host's context failed; the next request waits for the host",
                      branch.session_id)
        branch.forget_prompt()


def take(branch: Branch, result: t.AssembleResult, covered: int, epoch: int) -> t.AssembleResult:
    """An assemble's answer becomes the branch's context (its items; the caller renders them)."""
    if result.delta and branch.revision is not None:
        keep = result.keep or 0
        branch.items = branch.items[:keep] + result.items
        branch.messages = branch.messages[:keep] + result.messages
    else:
        branch.items, branch.messages = list(result.items), list(result.messages)
    branch.revision, branch.tokens, branch.over_budget = result.revision, result.tokens, result.over_budget
    branch.covered, branch.prompt_epoch = covered, epoch
    branch.budget, branch.fixed = result.budget, result.fixed_breakpoints or []
    return result


def pending(branch: Branch, units: Sequence[Unit], ids: Sequence[str], common: int
            ) -> list[tuple[str, Unit]] | None:
    """What the branch's context does not hold yet: its stored units after it, then the request's new ones (None
    when one of those is not at hand)."""
    stored = [(uid, branch.units[uid]) for uid in branch.ids[branch.covered:] if uid in branch.units]
    if len(stored) != len(branch.ids) - branch.covered:
        return None
    return stored + list(zip(ids[common:], units[common:], strict=True))
