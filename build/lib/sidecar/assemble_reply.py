"""The JSON text of a ``context/assemble`` reply, written from its types (``protocol.types.AssembleResult``).

Messages, items and tool definitions come as JSON text already (rendered once per message and kept, see
``engine.messages.RenderedMessages``) and are spliced in as they are; every other member is the
``AssembleResult`` value through the wire converter, so names, order and omitted nulls are the type's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from protocol.types import AssembleResult, ContextItem
from sidecar.wire import RawJSON, camel, dumps, unstructure, utf8

# Unpacking fails at import when ContextItem gains or loses a field: these fragments must follow it.
_KIND, _ID, _TOKENS, _PRUNED = (f'"{camel(field.name)}":' for field in attrs.fields(ContextItem))
_PRUNED_TRUE, _PRUNED_FALSE = f",{_PRUNED}true}}", f",{_PRUNED}false}}"

_MEMBERS = tuple((camel(field.name), utf8(f'"{camel(field.name)}":')) for field in attrs.fields(AssembleResult))


def context_item_head(kind: str, id: str) -> str:
    """A ContextItem's JSON text up to its token count: the part kept beside a rendered message."""
    return f"{{{_KIND}{dumps(kind)},{_ID}{dumps(id)},{_TOKENS}"


def context_item_tail(tokens: int, pruned: bool | None = None) -> str:
    """The rest of a ContextItem's JSON text, after ``context_item_head``."""
    if pruned is None:
        return f"{tokens}}}"
    return f"{tokens}{_PRUNED_TRUE if pruned else _PRUNED_FALSE}"


def encode_context_item(item: ContextItem) -> str:
    """A ContextItem as JSON text, an entry of a reply's ``items``."""
    return context_item_head(item.kind, item.id) + context_item_tail(item.tokens, item.pruned)


def encode_assemble_result(result: AssembleResult, messages: Sequence[bytes], items: Sequence[str],
                           tools: bytes | None = None) -> RawJSON:
    """``result`` as the reply's JSON text, with ``messages`` (UTF-8 JSON each), ``items`` (JSON text each, see
    ``encode_context_item``) and ``tools`` (a JSON array, or None for none) in place of its own, which must be empty.
    """
    if result.messages or result.items or result.tools is not None:
        raise ValueError("an AssembleResult to encode holds no messages, items or tools: they come as JSON text")
    spliced = {"messages": (b"[", b",".join(messages), b"]"), "items": (b"[", utf8(",".join(items)), b"]"),
               "tools": None if tools is None else (tools,)}
    values = unstructure(result)
    # One join at the end: each concatenation of a large reply would copy it again (a few ms at 10k items).
    # Consecutive plain members are written by one dumps: a delta reply is small and its cost is mostly calls.
    pieces: list[bytes] = []
    plain: dict[str, Any] = {}
    for name, key in _MEMBERS:
        if name in spliced:
            text = spliced[name]
            if text is None:
                continue
            if plain:
                pieces += (b",", utf8(dumps(plain)[1:-1]))
                plain = {}
            pieces += (b",", key, *text)
        elif name in values:
            plain[name] = values[name]
    if plain:
        pieces += (b",", utf8(dumps(plain)[1:-1]))
    pieces[0] = b"{"  # in place of the first member's separator: messages always come
    pieces.append(b"}")
    reply = b"".join(pieces)
    del pieces, spliced  # before the copy into RawJSON, which then reuses their memory: fresh pages cost ms
    return RawJSON(reply)
