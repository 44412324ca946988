"""Every server setting as the wire names it, with its default: what docs and editor schemas are checked against."""

from __future__ import annotations

import types
import typing
from typing import Any

import attrs

from sidecar.config.settings import Settings
from sidecar.wire import camel

JSON_TYPES: dict[Any, str] = {bool: "boolean", int: "integer", float: "number", str: "string",
                              type(None): "null", tuple: "array", dict: "object"}


def json_types(hint: Any) -> set[str]:
    """The JSON schema types a settings field's type hint allows."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return set().union(*(json_types(arg) for arg in typing.get_args(hint)))
    return {JSON_TYPES[origin or hint]}


def server_settings(cls: type = Settings, prefix: str = "") -> dict[str, tuple[Any, set[str]]]:
    """Every leaf setting as its camelCase dotted key -> (default as JSON, JSON types)."""
    hints = typing.get_type_hints(cls)
    defaults = cls()
    found: dict[str, tuple[Any, set[str]]] = {}
    for field in attrs.fields(cls):
        key = prefix + camel(field.name)
        if attrs.has(hints[field.name]):
            found.update(server_settings(hints[field.name], key + "."))
        else:
            default = getattr(defaults, field.name)
            found[key] = (list(default) if isinstance(default, tuple) else default, json_types(hints[field.name]))
    return found
