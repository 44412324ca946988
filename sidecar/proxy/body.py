"""A request body read against the previous one of its conversation: the bytes that did not change are not read.

An agent resends its whole conversation with every request, the old messages byte for byte. The leading elements
of the conversation's array whose bytes (and every byte before them) are the previous body's are found with a few
``startswith`` comparisons of the raw bytes and taken unread; so are the members after the array (system prompt,
tools) when their bytes are the previous body's. Only what is new is decoded and parsed. Spans are byte offsets
into ``raw``, so that the body to forward is spliced from the agent's own bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from sidecar.proxy.jsontext import JsonTextError, Span, elements, members, skip_space, value_at


class BodyError(ValueError):
    """The body is not JSON of the expected shape (not UTF-8, not an object, …); the message says where."""


@attrs.define(eq=False)
class Body:
    """A body as read: its top-level members, and where its conversation's elements are."""

    raw: bytes
    key: str
    """The member holding the conversation (``messages``, ``input``)."""
    values: dict[str, Any]
    """Top-level members; ``values[key]`` lists the elements' values when it is an array (None: taken unread)."""
    span: Span | None
    """The byte span of the conversation's value; None when the body has no such member."""
    elements: list[Span] = attrs.Factory(list)
    """The byte span of each element of the conversation's array (empty when it is not an array)."""
    texts: list[str] = attrs.Factory(list)
    """The JSON text of each element read (those after the first ``reused``)."""
    reused: int = 0
    """Leading elements that are the previous body's, byte for byte, at the same offsets: not read."""
    basis: Body | None = None
    """The previous body those come from."""
    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    """The keys of the members before and after the conversation's."""

    @property
    def array(self) -> bool:
        """Whether the conversation is an array (else it is read as any other value)."""
        return self.span is not None and isinstance(self.values.get(self.key), list)


def read_body(raw: bytes, key: str, previous: Sequence[Body] = ()) -> Body:
    """The body, its conversation's elements read but for those that are the most similar previous body's."""
    best, reused = None, 0
    for candidate in previous:
        count = common_elements(raw, candidate)
        if count > reused:
            best, reused = candidate, count
    if best is not None:
        try:
            return _continued(raw, best, reused)
        except BodyError:
            pass  # read whole, which says where the error is
    return _whole(raw, key)


def common_elements(raw: bytes, previous: Body) -> int:
    """How many leading elements of ``previous`` start ``raw`` byte for byte (everything before them too)."""
    if not previous.array or not previous.elements:
        return 0
    view = memoryview(previous.raw)
    elements = previous.elements  # not copied: this runs for every previous body of every request

    def same(count: int) -> bool:
        return raw.startswith(view[:elements[count - 1][1]])

    if not same(1):
        return 0
    low, high = 1, len(elements)
    for guess in (high, high - 1, high - 2):  # agents append, and move their cache marker to the newest message
        if low < guess <= high:
            if same(guess):
                low = guess
                break
            high = guess - 1
    while low < high:  # the largest count that matches, which is at least ``low``
        middle = (low + high + 1) // 2
        if same(middle):
            low = middle
        else:
            high = middle - 1
    return low


class _Offsets:
    """Byte offsets in the body of character indexes of ``text`` (which starts at byte ``base``), asked in order."""

    def __init__(self, text: str, base: int) -> None:
        self.text = text
        self.base = base
        self.ascii = text.isascii()
        self._index = 0
        self._byte = base

    def __call__(self, index: int) -> int:
        if self.ascii:
            return self.base + index
        if index < self._index:
            return self.base + len(self.text[:index].encode())
        self._byte += len(self.text[self._index:index].encode())
        self._index = index
        return self._byte


def _decode(raw: bytes, start: int) -> str:
    try:
        return raw[start:].decode("utf-8")
    except UnicodeDecodeError as error:
        raise BodyError(f"the body is not UTF-8: {error}") from None


def _whole(raw: bytes, key: str) -> Body:
    text = _decode(raw, 0)
    found: list[Span] = []

    def conversation(text: str, index: int) -> tuple[Any, int]:
        if text[index:index + 1] != "[":
            return value_at(text, index)  # not an array: the adapter's check says so as the API would
        return elements(text, index + 1, found, opening=True)

    try:
        values, spans, end = members(text, skip_space(text, 0), {key: conversation}, opening=True)
    except JsonTextError as error:
        raise BodyError(f"the body is not valid JSON: {error}") from None
    if text[end:].strip():
        raise BodyError(f"the body is not valid JSON: extra data at character {end}")
    at = _Offsets(text, 0)
    span = spans.get(key)
    body = Body(raw, key, values, None)
    if span is None:
        return body
    positions = sorted({span[0], span[1], *(p for s in found for p in s)})
    offsets = {position: at(position) for position in positions}
    body.span = (offsets[span[0]], offsets[span[1]])
    if isinstance(values[key], list):
        body.elements = [(offsets[a], offsets[b]) for a, b in found]
        body.texts = [text[a:b] for a, b in found]
    body.before = tuple(name for name, (start, _) in spans.items() if start < span[0])
    body.after = tuple(name for name, (start, _) in spans.items() if start > span[0])
    return body


def _continued(raw: bytes, previous: Body, reused: int) -> Body:
    """The body read from the end of its ``reused``-th element on; the rest as ``previous`` when it is the same."""
    assert previous.span is not None
    base = previous.elements[reused - 1][1]
    text = _decode(raw, base)
    found: list[Span] = []
    try:
        index = skip_space(text, 0)
        separator = text[index:index + 1]
        if separator == ",":
            new, end = elements(text, index + 1, found, opening=False)
        elif separator == "]":
            new, end = [], index + 1
        else:
            raise BodyError("read whole")
        at = _Offsets(text, base)
        spans = previous.elements[:reused] + [(at(a), at(b)) for a, b in found]
        texts = [text[a:b] for a, b in found]
        stop = at(end)
        values = {name: previous.values[name] for name in previous.before}
        values[previous.key] = [None] * reused + new
        tail = len(previous.raw) - previous.span[1]
        if len(raw) - stop == tail and raw.endswith(memoryview(previous.raw)[previous.span[1]:]):
            after = {name: previous.values[name] for name in previous.after}
        else:
            after, _, close = members(text, end, {})
            if previous.key in after or text[close:].strip():
                raise BodyError("read whole")
    except JsonTextError as error:
        raise BodyError(str(error)) from None  # read whole, which says where
    values.update(after)
    return Body(raw, previous.key, values, (previous.span[0], stop), spans, texts, reused, previous,
                previous.before, tuple(after))
