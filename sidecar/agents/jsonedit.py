"""Edits of JSON text that leave every byte they do not change as it was: config files stay as their owner wrote them.

Members and items are appended after the last one, in the layout of their siblings (indentation, one per line or
all on one line); removing one deletes exactly the text an append adds, so an append then a removal gives back
the original bytes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

import attrs

_DELIMITER = re.compile(r"[\s,\]}]")
_WHITESPACE = " \t\r\n"


class JsonEditError(ValueError):
    """The document holds a key of another type than the edit needs (``name``: the file, in the message)."""


@attrs.define
class Node:
    """A JSON value's span in the text; an object's members or an array's items, with their spans."""

    start: int
    end: int
    kind: str
    """``object``, ``array`` or ``scalar``."""
    keys: list[tuple[str, int]] = attrs.field(factory=list)
    """An object's keys and where each starts (the opening quote)."""
    children: list[Node] = attrs.field(factory=list)
    """An object's member values, or an array's items."""

    def member(self, key: str) -> Node | None:
        """The value of ``key`` (the last one, as JSON parsers take it)."""
        found = [child for (name, _), child in zip(self.keys, self.children, strict=True) if name == key]
        return found[-1] if found else None


def loads(text: str) -> tuple[Any, Node]:
    """(value, spans) of a JSON document; ValueError (json.JSONDecodeError) when it is not valid JSON."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    return value, _Parser(text).document()


class _Parser:
    """Spans of a document ``json.loads`` accepted (so no error checking here)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def document(self) -> Node:
        self._space()
        return self._value()

    def _space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in _WHITESPACE:
            self.pos += 1

    def _string_end(self, start: int) -> int:
        pos = start + 1
        while self.text[pos] != '"':
            pos += 2 if self.text[pos] == "\\" else 1
        return pos + 1

    def _value(self) -> Node:
        start = self.pos
        first = self.text[start]
        if first == "{":
            return self._container(start, "object", "}")
        if first == "[":
            return self._container(start, "array", "]")
        if first == '"':
            self.pos = self._string_end(start)
        else:
            match = _DELIMITER.search(self.text, start)
            self.pos = match.start() if match else len(self.text)
        return Node(start, self.pos, "scalar")

    def _container(self, start: int, kind: str, close: str) -> Node:
        node = Node(start, start, kind)
        self.pos += 1
        self._space()
        while self.text[self.pos] != close:
            if kind == "object":
                key_start = self.pos
                self.pos = self._string_end(key_start)
                node.keys.append((json.loads(self.text[key_start:self.pos]), key_start))
                self._space()
                self.pos += 1  # the colon
                self._space()
            node.children.append(self._value())
            self._space()
            if self.text[self.pos] == ",":
                self.pos += 1
                self._space()
        self.pos += 1
        node.end = self.pos
        return node


def _line_indent(text: str, pos: int) -> str:
    line_start = text.rfind("\n", 0, pos) + 1
    line = text[line_start:pos]
    return line[:len(line) - len(line.lstrip(" \t"))]


def _unit(text: str, root: Node) -> str:
    """The document's indentation step: its first nested line's, else two spaces."""
    for child_start in [start for _, start in root.keys] + [child.start for child in root.children]:
        before = text[root.start + 1:child_start]
        if "\n" in before:
            return before.rsplit("\n", 1)[1] or "  "
    return "  "


def _layout(text: str, root: Node, container: Node) -> tuple[str | None, str]:
    """(indentation of the container's entries, or None when they sit on one line; the container's own)."""
    outer = _line_indent(text, container.start)
    starts = [start for _, start in container.keys] or [child.start for child in container.children]
    if starts:
        before = text[container.start + 1:starts[0]]
        return (before.rsplit("\n", 1)[1] if "\n" in before else None), outer
    multiline = "\n" in text[root.start:root.end] or not root.children  # an empty document takes the usual layout
    return (outer + _unit(text, root) if multiline else None), outer


def _render(value: Any, indent: str | None, unit: str) -> str:
    if indent is None:
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, ensure_ascii=False, indent=unit).replace("\n", "\n" + indent)


def _entry(key: str | None, value: Any, indent: str | None, unit: str) -> str:
    rendered = _render(value, indent, unit)
    return rendered if key is None else f"{json.dumps(key, ensure_ascii=False)}: {rendered}"


def append(text: str, path: Sequence[str | int], key: str | None, value: Any) -> str:
    """``text`` with ``value`` appended to the object (as ``key``) or array (``key`` None) at ``path``."""
    _, root = loads(text)
    container = _find(root, path)
    indent, outer = _layout(text, root, container)
    unit = _unit(text, root)
    entry = _entry(key, value, indent, unit)
    if container.children:
        last = container.children[-1].end
        joiner = ",\n" + indent if indent is not None else ", "
        return text[:last] + joiner + entry + text[last:]
    opening, closing = text[container.start], text[container.end - 1]
    body = f"\n{indent}{entry}\n{outer}" if indent is not None else entry
    return text[:container.start] + opening + body + closing + text[container.end:]


def remove(text: str, path: Sequence[str | int], index: int) -> str:
    """``text`` without the ``index``-th member or item of the container at ``path`` (what ``append`` added)."""
    _, root = loads(text)
    container = _find(root, path)
    children = container.children
    if len(children) == 1:
        empty = "{}" if container.kind == "object" else "[]"
        return text[:container.start] + empty + text[container.end:]
    starts = [start for _, start in container.keys] or [child.start for child in children]
    if index > 0:
        return text[:children[index - 1].end] + text[children[index].end:]
    return text[:starts[0]] + text[starts[1]:]


def replace(text: str, path: Sequence[str | int], value: Any) -> str:
    """``text`` with the value at ``path`` replaced, laid out as its siblings are."""
    _, root = loads(text)
    parent, node = _find(root, path[:-1]), _find(root, path)
    indent, _ = _layout(text, root, parent)
    return text[:node.start] + _render(value, indent, _unit(text, root)) + text[node.end:]


def _find(root: Node, path: Sequence[str | int]) -> Node:
    node = root
    for step in path:
        found = node.member(step) if isinstance(step, str) else node.children[step]
        if found is None:
            raise KeyError(step)
        node = found
    return node


def new_document(value: dict[str, Any]) -> str:
    """A file's text for ``value``: two-space indentation and a final newline."""
    return json.dumps(value, ensure_ascii=False, indent=2) + "\n"


# Members and items at a path, for config files: each takes the file's name for its messages.

def _value(text: str, path: Sequence[str | int]) -> Any:
    value = loads(text)[0]
    for step in path:
        value = value[step]
    return value


def walk(text: str, name: str, path: list[str]) -> tuple[list[str], Any]:
    """(the part of ``path`` that exists, its value); JsonEditError when a step is not an object."""
    value = loads(text)[0]
    if not isinstance(value, dict):
        raise JsonEditError(f"{name} does not hold a JSON object")
    found: list[str] = []
    for key in path:
        if key not in value:
            break
        value = value[key]
        found.append(key)
        if not isinstance(value, dict) and len(found) < len(path):
            raise JsonEditError(f"{name}: {'.'.join(found)} is not an object")
    return found, value


def _nest(keys: list[str], leaf: Any) -> Any:
    for key in reversed(keys):
        leaf = {key: leaf}
    return leaf


def ensure_member(text: str, name: str, path: list[str], key: str, value: dict[str, Any]) -> tuple[str, str | None]:
    """``path.key`` holding ``value``'s keys (other keys of an existing entry kept); (text, "added"/"updated"/None)."""
    found, node = walk(text, name, [*path, key])
    if len(found) == len(path) + 1:
        if not isinstance(node, dict):
            raise JsonEditError(f"{name}: {'.'.join([*path, key])} is not an object")
        if all(node.get(k) == v for k, v in value.items()):
            return text, None
        return replace(text, [*path, key], {**node, **value}), "updated"
    if found != path:
        nested = _nest([*path[len(found) + 1:], key], value)
        return append(text, list(found), path[len(found)], nested), "added"
    return append(text, list(path), key, value), "added"


def ensure_item(text: str, name: str, path: list[str], item: Any) -> tuple[str, bool]:
    """The array at ``path`` holding ``item`` (appended, the array made if need be); (text, whether it was added)."""
    found, node = walk(text, name, path)
    if len(found) == len(path):
        if not isinstance(node, list):
            raise JsonEditError(f"{name}: {'.'.join(path)} is not an array")
        if item in node:
            return text, False
        return append(text, list(path), None, item), True
    return append(text, list(found), path[len(found)], _nest(path[len(found) + 1:], [item])), True


def drop_items(text: str, name: str, path: Sequence[str | int], ours: Callable[[Any], bool]) -> tuple[str, bool]:
    """The array at ``path`` without the items ``ours`` picks (the array stays, even empty); (text, any removed)."""
    try:
        node = _value(text, path)
    except (KeyError, IndexError, TypeError):
        return text, False
    if not isinstance(node, list):
        raise JsonEditError(f"{name}: {'.'.join(map(str, path))} is not an array")
    removed = False
    for index in reversed(range(len(node))):
        if ours(node[index]):
            text = remove(text, path, index)
            removed = True
    return text, removed


def drop_member(text: str, name: str, path: list[str], key: str) -> tuple[str, bool]:
    """``path`` without ``key`` (the object stays, even empty); (text, whether it was there)."""
    try:
        node = _value(text, path)
    except (KeyError, TypeError):
        return text, False
    if not isinstance(node, dict) or key not in node:
        return text, False
    return drop_key(text, path, key), True


def value_at(text: str, path: Sequence[str | int]) -> Any:
    """The value at ``path``; KeyError, IndexError or TypeError when there is none."""
    return _value(text, path)


def drop_key(text: str, path: Sequence[str | int], key: str) -> str:
    """``text`` without the member ``key`` of the object at ``path``."""
    return remove(text, path, _member_index(text, path, key))


def _member_index(text: str, path: Sequence[str | int], key: str) -> int:
    """Where ``key``'s member is among the object's members in the text (duplicates counted; the last one, which
    JSON parsers keep)."""
    keys = [name for name, _ in _find(loads(text)[1], path).keys]
    return len(keys) - 1 - keys[::-1].index(key)
