"""Spans of JSON text: where each member of a body and each element of an array start and end.

The proxy keeps every message as the agent sent it (verbatim text) and splices the assembled context into the
agent's own body, so it works on spans of the text rather than on parsed values (see also ``body``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

_decode = json.JSONDecoder().raw_decode
_SPACE = re.compile(r"[ \t\n\r]*")

Span = tuple[int, int]


class JsonTextError(ValueError):
    """The text is not the JSON expected; the message says where."""


def skip_space(text: str, index: int) -> int:
    """The index of the first non-whitespace character at or after ``index``."""
    match = _SPACE.match(text, index)
    return match.end() if match else index


def value_at(text: str, index: int) -> tuple[Any, int]:
    """The JSON value starting at ``index`` (whitespace skipped) and the index after it."""
    index = skip_space(text, index)
    try:
        return _decode(text, index)
    except json.JSONDecodeError as error:
        raise JsonTextError(f"{error.msg} at character {error.pos}") from None


def object_members(text: str, start: int = 0,
                   special: dict[str, Callable[[str, int], tuple[Any, int]]] | None = None
                   ) -> tuple[dict[str, Any], dict[str, Span], int]:
    """The members of the object at ``start``: values, spans of the values, and the index after the object.

    A key in ``special`` has its value read by that function (text, index) -> (value, end) instead of parsed.
    A key given twice keeps its last value, as ``json.loads`` does.
    """
    return members(text, skip_space(text, start), special or {}, opening=True)


def members(text: str, index: int, special: dict[str, Callable[[str, int], tuple[Any, int]]],
            opening: bool = False) -> tuple[dict[str, Any], dict[str, Span], int]:
    """An object's members from ``index``: at its ``{`` (``opening``), or after one of its values, where a ``,``
    (more members) or its ``}`` comes. Values, spans of the values, and the index after the object."""
    values: dict[str, Any] = {}
    spans: dict[str, Span] = {}
    index = skip_space(text, index)
    if opening:
        if text[index:index + 1] != "{":
            raise JsonTextError(f"expected an object at character {index}")
        index = skip_space(text, index + 1)
        if text[index:index + 1] == "}":
            return values, spans, index + 1
    else:
        separator = text[index:index + 1]
        if separator == "}":
            return values, spans, index + 1
        if separator != ",":
            raise JsonTextError(f"expected ',' or '}}' at character {index}")
        index = skip_space(text, index + 1)
    while True:
        if text[index:index + 1] != '"':
            raise JsonTextError(f"expected a member name at character {index}")
        key, index = value_at(text, index)
        index = skip_space(text, index)
        if text[index:index + 1] != ":":
            raise JsonTextError(f"expected ':' at character {index}")
        index = skip_space(text, index + 1)
        reader = special.get(key)
        value, end = reader(text, index) if reader is not None else value_at(text, index)
        values.pop(key, None)  # a key given twice: its last value, at its last place
        spans.pop(key, None)
        values[key], spans[key] = value, (index, end)
        index = skip_space(text, end)
        separator = text[index:index + 1]
        if separator == "}":
            return values, spans, index + 1
        if separator != ",":
            raise JsonTextError(f"expected ',' or '}}' at character {index}")
        index = skip_space(text, index + 1)


def array_elements(text: str, start: int) -> tuple[list[Span], list[Any], int]:
    """The elements of the array at ``start``: their spans, their values, and the index after the array."""
    index = skip_space(text, start)
    if text[index:index + 1] != "[":
        raise JsonTextError(f"expected an array at character {index}")
    spans: list[Span] = []
    values, end = elements(text, index + 1, spans, opening=True)
    return spans, values, end


def elements(text: str, index: int, spans: list[Span], opening: bool) -> tuple[list[Any], int]:
    """An array's elements from ``index``: after its ``[`` (``opening``), or after a ``,`` (at least one more
    element), to its ``]``. Their values and the index after the array; each one's span is added to ``spans``."""
    values: list[Any] = []
    index = skip_space(text, index)
    if opening and text[index:index + 1] == "]":
        return values, index + 1
    while True:
        value, end = value_at(text, index)
        spans.append((skip_space(text, index), end))
        values.append(value)
        index = skip_space(text, end)
        separator = text[index:index + 1]
        if separator == "]":
            return values, index + 1
        if separator != ",":
            raise JsonTextError(f"expected ',' or ']' at character {index}")
        index += 1


def compact(value: Any) -> str:
    """JSON text as JavaScript's JSON.stringify writes it (no spaces, characters unescaped)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


_CACHE_CONTROL = re.compile(r',\s*"cache_control"\s*:\s*\{[^{}]*\}|"cache_control"\s*:\s*\{[^{}]*\}\s*,?\s*')
"""A ``cache_control`` member: a member name is the only place an unescaped quote can stand after ',' or '{'."""


def without_cache_control(text: str, value: Any, count: int) -> str:
    """``text`` (the JSON of ``value``) less its ``count`` cache_control members, keeping every other byte.

    Falls back to writing ``value`` (already without them) afresh when the text does not show exactly ``count``.
    """
    stripped, found = _CACHE_CONTROL.subn("", text)
    return stripped if found == count else compact(value)
