"""The assembled context in the provider's format: each stored message rendered from the original it came from.

Elements are kept as UTF-8 JSON, as they go into the body: after a delta (``context/assemble`` with ``since``) the
kept ones are taken as last rendered and only the new ones are rendered; the body is one join of the agent's own
bytes before and after its conversation with the elements.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from protocol.types import AssembleResult, ContextItem
from sidecar.client import SidecarClient, SidecarRequestError
from sidecar.engine.tokens import estimate_bytes_tokens
from sidecar.proxy.adapters.base import Adapter, Item, Request, Unit, part_id, split_part_id
from sidecar.proxy.conversation import MAX_RENDERED, Branch

log = logging.getLogger(__name__)


async def render_context(client: SidecarClient, adapter: Adapter, branch: Branch, result: AssembleResult
                         ) -> tuple[list[bytes], list[int]]:
    """The context's elements, and for each item the index of its group's last element: after a delta, those of
    the kept items as last rendered, and the new ones."""
    keep = result.keep or 0 if result.delta else 0
    if keep and len(branch.ends) >= keep:
        cut = branch.ends[keep - 1] + 1  # a unit's parts are stored together: no group spans the cut
        more, more_ends = await render_items(client, adapter, branch, branch.items[keep:], branch.messages[keep:])
        size = branch.size - joined_size(branch.elements[cut:]) + joined_size(more)
        elements, ends = branch.elements[:cut] + more, branch.ends[:keep] + [end + cut for end in more_ends]
    else:
        elements, ends = await render_items(client, adapter, branch, branch.items, branch.messages)
        size = joined_size(elements)
    branch.elements, branch.ends, branch.size = list(elements), list(ends), size
    return elements, ends


def unit_elements(adapter: Adapter, unit: Unit, uid: str) -> list[bytes]:
    """A unit not stored yet, whole, as its elements."""
    parts = adapter.parts(unit)
    items = [Item("message", part_id(uid, index, len(parts)), part) for index, part in enumerate(parts)]
    return [text.encode() for text in adapter.render_unit(unit, items)]


def joined_size(elements: Sequence[bytes]) -> int:
    """Bytes of ``elements`` as members of a JSON array, each with its separator."""
    return sum(len(element) + 1 for element in elements)


def rendered_tokens(size: int) -> int:
    """Tokens of a conversation whose elements take ``size`` bytes (``joined_size``), as the sidecar estimates them:
    its JSON array's bytes."""
    return estimate_bytes_tokens(size + 1)


def spliced(request: Request, elements: Sequence[bytes]) -> bytes:
    """The agent's body with its conversation replaced by ``elements``, every other byte as it sent them."""
    body = request.body
    assert body.span is not None
    start, end = body.span
    view = memoryview(body.raw)
    return b"".join((view[:start], b"[", b",".join(elements), b"]", view[end:]))


async def render_items(client: SidecarClient, adapter: Adapter, branch: Branch, items: Sequence[ContextItem],
                       messages: Sequence[dict[str, Any]]) -> tuple[list[bytes], list[int]]:
    """The elements of the assembled context, and for each item the index of its group's last element."""
    elements: list[bytes] = []
    ends: list[int] = []
    group: list[Item] = []
    owner: Unit | None = None
    owner_id = ""
    members = 0

    def flush() -> None:
        nonlocal members
        if not group:
            return
        if owner is None:
            out = [text.encode() for text in adapter.render_others(group)]
        else:
            key = (owner_id, *((i.id, i.pruned, _calls(i.message)) for i in group))
            found = branch.rendered.get(key)
            out = found if found is not None else [text.encode() for text in adapter.render_unit(owner, group)]
            branch.rendered[key] = out
            branch.rendered.move_to_end(key)
            if len(branch.rendered) > MAX_RENDERED:
                branch.rendered.popitem(last=False)
        elements.extend(out)
        ends.extend([len(elements) - 1] * members)
        group.clear()
        members = 0

    known = len(branch.units)
    for context_item, message in zip(items, messages, strict=True):
        item = Item(context_item.kind, context_item.id, message, bool(context_item.pruned))
        parsed = split_part_id(item.id) if item.kind == "message" else None
        unit = await _unit(client, branch, parsed[0], item.id) if parsed is not None else None
        uid = parsed[0] if unit is not None and parsed is not None else ""
        if group and (unit is not owner or uid != owner_id):
            flush()
        owner, owner_id = unit, uid
        group.append(item)
        members += 1
    flush()
    if len(branch.units) > known:  # one round trip each: only messages the agent's requests do not hold
        log.info("session %s: %d originals read back from memory", branch.session_id, len(branch.units) - known)
    return elements, ends


async def _unit(client: SidecarClient, branch: Branch, uid: str, message_id: str) -> Unit | None:
    """The unit a stored message came from, from memory or its stored original."""
    unit = branch.units.get(uid)
    if unit is not None:
        return unit
    first = uid if message_id == uid else f"{uid}.0"
    try:
        expanded = await client.expand(branch.session_id, first)
    except SidecarRequestError as error:
        log.warning("session %s: no original for %s (%s); rendered from the stored message", branch.session_id,
                    first, error)
        return None
    original = expanded.items[0].original if expanded.items else None
    if not original:
        return None
    unit = Unit(tuple(original), tuple(json.loads(text) for text in original))
    branch.units[uid] = unit
    return unit


def _calls(message: dict[str, Any]) -> tuple[str, ...]:
    return tuple(call["id"] for call in message.get("tool_calls") or ())
