"""Edits of one ``[table]`` in TOML text, each checked by reading the result back with ``tomllib``.

A table is appended at the end of the file, after one blank line; removing it deletes the header, its keys and
its subtables, and that blank line, so an append then a removal gives back the original bytes (a file that did
not end with a newline gets one). The keys are written one per line as ``key = value``, values in TOML's JSON-like
inline syntax. Anything the checks cannot confirm (a table written as dotted keys or inline, a result that reads
back differently) is refused with ``TomlEditError``, and nothing is written.
"""

from __future__ import annotations

import copy
import json
import re
import tomllib
from typing import Any

_HEADER = re.compile(r"^[ \t]*\[(?!\[)(?P<keys>[^\]\n#]*)\][ \t]*(?:#.*)?$")
_ANY_HEADER = re.compile(r"^[ \t]*\[")
_BARE = re.compile(r"^[A-Za-z0-9_-]+$")
_KEY_LINE = re.compile(r"^[ \t]*(?P<key>[A-Za-z0-9_-]+|\"[^\"\n]*\")[ \t]*=")


class TomlEditError(ValueError):
    """The edit cannot be made safely; the message says why."""


def loads(text: str) -> dict[str, Any]:
    """The parsed document; TomlEditError naming the problem when it is not valid TOML."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise TomlEditError(f"not valid TOML ({error})") from None


def key_text(key: str) -> str:
    """A key as TOML writes it: bare when it can be, else quoted."""
    return key if _BARE.match(key) else json.dumps(key, ensure_ascii=False)


def value_text(value: Any) -> str:
    """A string, boolean, number, list or table (an inline one) as TOML inline syntax."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(value_text(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key_text(str(k))} = {value_text(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML for {type(value).__name__}")


def _header_keys(line: str) -> tuple[str, ...] | None:
    """The dotted key of a ``[table]`` header line, unquoted; None for any other line."""
    match = _HEADER.match(line)
    if not match:
        return None
    parts = re.findall(r"\s*(\"(?:[^\"\\]|\\.)*\"|'[^']*'|[A-Za-z0-9_-]+)\s*(?:\.|$)", match.group("keys"))
    keys: list[str] = []
    for part in parts:
        keys.append(json.loads(part) if part.startswith('"') else part.strip("'"))
    return tuple(keys)


def _blocks(lines: list[str], path: tuple[str, ...]) -> list[tuple[int, int]]:
    """(first, last + 1) line spans of the table at ``path`` and its subtables: header to last key or value line."""
    spans: list[tuple[int, int]] = []
    index = 0
    while index < len(lines):
        keys = _header_keys(lines[index])
        if keys is None or keys[:len(path)] != path:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not _ANY_HEADER.match(lines[end]):
            end += 1
        last = end
        while last > index + 1 and (not lines[last - 1].strip() or lines[last - 1].lstrip().startswith("#")):
            last -= 1  # blank lines and comments before the next header belong to it
        spans.append((index, last))
        index = end
    return spans


def _get(document: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = document
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def set_table(text: str, path: tuple[str, ...], values: dict[str, Any]) -> str:
    """``text`` with the table at ``path`` holding ``values`` (other keys of that table are kept)."""
    document = loads(text)
    parent = _get(document, path[:-1])
    if parent is not None and not isinstance(parent, dict):
        raise TomlEditError(f"{'.'.join(path[:-1])} is not a table")
    existing = _get(document, path)
    if existing is not None and not isinstance(existing, dict):
        raise TomlEditError(f"{'.'.join(path)} is not a table")
    expected = copy.deepcopy(document)
    node = expected
    for key in path:
        node = node.setdefault(key, {})
    node.update(values)
    if expected == document:
        return text
    if existing is None:
        header = "[" + ".".join(key_text(key) for key in path) + "]"
        block = "\n".join([header, *(f"{key_text(k)} = {value_text(v)}" for k, v in values.items())]) + "\n"
        separator = "" if not text else "\n" if text.endswith("\n") else "\n\n"
        new = text + separator + block
    else:
        new = _rewrite_keys(text, path, values, existing)
    return _checked(new, expected, path)


def _same(old: Any, new: Any) -> bool:
    """Equal as TOML values (``1`` is not ``true``)."""
    return json.dumps(old, sort_keys=True, default=str) == json.dumps(new, sort_keys=True, default=str)


def _value_end(lines: list[str], index: int, last: int) -> int:
    """The line after the one where the value of the key on line ``index`` ends (a wrapped array spans several)."""
    for end in range(index + 1, last + 1):
        try:
            tomllib.loads("".join(lines[index:end]))
        except tomllib.TOMLDecodeError:
            continue
        return end
    raise TomlEditError(f"the value on line {index + 1} is not one setup can read by itself; edit it by hand")


def _rewrite_keys(text: str, path: tuple[str, ...], values: dict[str, Any], existing: dict[str, Any]) -> str:
    """The table's keys whose value differs from ``values`` rewritten in place (the whole value, however many lines
    it spans; the others keep their bytes), missing ones added after its last key."""
    lines = text.splitlines(keepends=True)
    spans = [span for span in _blocks(lines, path) if _header_keys(lines[span[0]]) == path]
    if len(spans) != 1:
        raise TomlEditError(f"{'.'.join(path)} is not written as one [table] that setup can edit; edit it by hand")
    first, last = spans[0]
    missing = dict(values)
    index = first + 1
    while index < last:
        match = _KEY_LINE.match(lines[index])
        key = match and (json.loads(match.group("key")) if match.group("key").startswith('"') else match.group("key"))
        if key not in missing:
            index += 1
            continue
        value = missing.pop(key)
        end = _value_end(lines, index, last)
        if not _same(existing.get(key), value):
            newline = "\n" if lines[end - 1].endswith("\n") else ""
            lines[index:end] = [f"{key_text(key)} = {value_text(value)}{newline}"]
            last -= end - index - 1
            end = index + 1
        index = end
    added = [f"{key_text(k)} = {value_text(v)}\n" for k, v in missing.items()]
    if added and not lines[last - 1].endswith("\n"):
        lines[last - 1] += "\n"
    lines[last:last] = added
    return "".join(lines)


def remove_table(text: str, path: tuple[str, ...]) -> str:
    """``text`` without the table at ``path`` and its subtables; the same text when there is none."""
    document = loads(text)
    parent = _get(document, path[:-1])
    if parent is not None and not isinstance(parent, dict):
        raise TomlEditError(f"{'.'.join(path[:-1])} is not a table")
    if _get(document, path) is None:
        return text
    expected = copy.deepcopy(document)
    parent = _get(expected, path[:-1])
    del parent[path[-1]]
    lines = text.splitlines(keepends=True)
    spans = _blocks(lines, path)
    for first, last in reversed(spans):
        del lines[first:last]
        if first > 0 and not lines[first - 1].strip():
            del lines[first - 1]  # the blank line the append put before it
    new = "".join(lines)
    result = loads(new)
    if result != expected and not (parent == {} and _get(result, path[:-1]) is None
                                   and _without(expected, path[:-1]) == result):
        raise TomlEditError(f"{'.'.join(path)} is not written as [table] blocks that setup can remove; "
                            "remove it by hand")
    return new


def _without(document: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    trimmed = copy.deepcopy(document)
    parent = _get(trimmed, path[:-1])
    del parent[path[-1]]
    return trimmed


def _checked(new: str, expected: dict[str, Any], path: tuple[str, ...]) -> str:
    try:
        result = tomllib.loads(new)
    except tomllib.TOMLDecodeError as error:
        raise TomlEditError(f"adding [{'.'.join(path)}] would make the file invalid ({error}): "
                            "is it defined inline or with dotted keys? Edit it by hand") from None
    if result != expected:
        raise TomlEditError(f"adding [{'.'.join(path)}] would change other settings: edit it by hand")
    return new
