"""Converting protocol types and settings to and from JSON: camelCase keys, strict primitives.

Strict means no coercion: ``"5"`` is not an int and ``1`` is not a bool, so
ill-typed params are rejected with the path of the first bad field. Settings are
read in the lenient mode (``structure_lenient``): a bad value is reported and
replaced, and the rest is kept.
"""

from __future__ import annotations

import json
import re
import types
import typing
from typing import Any

import attrs
import cattrs
from cattrs.gen import make_dict_unstructure_fn, override


def camel(name: str) -> str:
    """``max_tokens`` -> ``maxTokens``."""
    head, *rest = name.split("_")
    return head + "".join(word.title() for word in rest)


def snake(name: str) -> str:
    """``maxTokens`` -> ``max_tokens``."""
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def describe_json(value: Any) -> str:
    """A JSON value as an error message names it: ``null``, ``a boolean``, ``the string 'x'``…"""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, list):
        return "a list"
    return "an object"


class ParamsError(ValueError):
    """Params that do not fit their type; ``field`` is the camelCase path of the culprit."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class RawJSON(bytes):
    """UTF-8 JSON already encoded: a handler's result written into the reply as it is, not encoded again."""


def dumps(value: Any) -> str:
    """Compact JSON text, non-ASCII kept as is (the wire is UTF-8)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def utf8(text: str) -> bytes:
    """JSON text as it goes on the wire."""
    # Lone surrogates can only sit inside JSON strings, where the \uXXXX that backslashreplace writes is valid.
    return text.encode("utf-8", "backslashreplace")


def _strict(kind: type) -> Any:
    def structure(value: Any, _: type) -> Any:
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise ParamsError(f"expected {_TYPE_NAMES[kind]}, got {describe_json(value)}")
        return value

    return structure


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}


def _structure_any_dict(value: Any, _: type) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ParamsError(f"expected an object, got {describe_json(value)}")
    return value


def _structure_list(value: Any, cls: type) -> list[Any]:
    if not isinstance(value, list):
        raise ParamsError(f"expected an array, got {describe_json(value)}")
    (item_type,) = typing.get_args(cls) or (Any,)
    hook = converter.get_structure_hook(item_type)  # resolved once: an assembled context has thousands of items
    try:
        return [hook(item, item_type) for item in value]
    except ParamsError:
        pass
    for index, item in enumerate(value):  # again, one by one, to name the item at fault
        try:
            hook(item, item_type)
        except ParamsError as error:
            raise ParamsError(str(error), _join(f"[{index}]", error.field)) from None
    raise AssertionError("unreachable: the item that failed above fails here too")


def _structure_tuple(value: Any, cls: type) -> tuple[Any, ...]:
    (item_type, *_) = typing.get_args(cls) or (Any,)
    return tuple(_structure_list(value, list[item_type]))  # type: ignore[valid-type]


def _structure_literal(value: Any, cls: type) -> Any:
    allowed = typing.get_args(cls)
    if value not in allowed or isinstance(value, bool):
        raise ParamsError(f"expected one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


def _structure_union(value: Any, cls: type) -> Any:
    args = typing.get_args(cls)
    if value is None:
        if type(None) in args:
            return None
        raise ParamsError("must not be null")
    errors = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return converter.structure(value, arg)
        except ParamsError as error:
            errors.append(error)
    if len(errors) == 1:
        raise errors[0]
    names = " or ".join(_TYPE_NAMES.get(a, getattr(a, "__name__", str(a))) for a in args if a is not type(None))
    raise ParamsError(f"expected {names}, got {describe_json(value)}")


def _join(head: str, tail: str | None) -> str:
    if not tail:
        return head
    return f"{head}{tail}" if tail.startswith("[") else f"{head}.{tail}"


def _attrs_structure_factory(cls: type) -> Any:
    fields = attrs.fields(cls)
    names = {camel(f.name): f for f in fields}
    hints = typing.get_type_hints(cls)
    hooks: dict[str, Any] = {}

    def structure(value: Any, _: type) -> Any:
        if value is None and not any(f.default is attrs.NOTHING for f in fields):
            value = {}
        if not isinstance(value, dict):
            raise ParamsError(f"expected an object, got {describe_json(value)}")
        if not hooks:  # resolved on first use: types may refer to classes defined after this one
            hooks.update({key: converter.get_structure_hook(hints[field.name]) for key, field in names.items()})
        kwargs = {}
        for key, field in names.items():
            if key not in value:
                if field.default is attrs.NOTHING:
                    raise ParamsError("is required", key)
                continue
            try:
                kwargs[field.name] = hooks[key](value[key], hints[field.name])
            except ParamsError as error:
                raise ParamsError(str(error), _join(key, error.field)) from None
        return cls(**kwargs)

    return structure


def _attrs_unstructure_factory(cls: type) -> Any:
    overrides = {
        f.name: override(rename=camel(f.name), omit_if_default=f.default is None) for f in attrs.fields(cls)
    }
    return make_dict_unstructure_fn(cls, converter, **overrides)  # type: ignore[arg-type]  # cattrs types kwargs


converter = cattrs.Converter()
for _kind in (str, int, float, bool):
    converter.register_structure_hook(_kind, _strict(_kind))
converter.register_structure_hook_func(lambda t: typing.get_origin(t) is dict, _structure_any_dict)
converter.register_structure_hook_func(lambda t: typing.get_origin(t) is list, _structure_list)
converter.register_structure_hook_func(lambda t: typing.get_origin(t) is tuple, _structure_tuple)
converter.register_structure_hook_func(lambda t: typing.get_origin(t) is typing.Literal, _structure_literal)
converter.register_structure_hook_func(
    lambda t: typing.get_origin(t) in (typing.Union, types.UnionType), _structure_union
)
converter.register_structure_hook_factory(attrs.has, _attrs_structure_factory)
converter.register_unstructure_hook_factory(attrs.has, _attrs_unstructure_factory)
# Messages are JSON already; walking them key by key costs more than the rest of a reply.
converter.register_unstructure_hook_func(lambda t: typing.get_origin(t) is dict, lambda value: value)
converter.register_structure_hook(Any, lambda value, _: value)

def structure(value: Any, cls: type) -> Any:
    """``value`` (JSON) as ``cls``; raises ParamsError naming the field at fault."""
    try:
        return converter.structure(value, cls)
    except RecursionError:
        raise ParamsError("params nested too deeply") from None


def unstructure(value: Any) -> Any:
    """``value`` as JSON-ready data with camelCase keys and no null optionals."""
    return converter.unstructure(value)


class Replaced(ValueError):
    """A validator's verdict that a value is unusable and ``value`` stands in for it, not the default."""

    def __init__(self, message: str, value: Any) -> None:
        super().__init__(message)
        self.value = value


def structure_lenient(value: Any, cls: type, base: Any, problems: list[str], path: str = "") -> Any:
    """``value`` (JSON) over ``base`` as the attrs class ``cls``, keeping what fits.

    A value of the wrong type or that its field's validator refuses is reported in ``problems`` and
    replaced by the field's default; unknown keys are reported and ignored; ``dict`` fields drop bad
    entries one by one.
    """
    if not isinstance(value, dict):
        problems.append(f"{path.rstrip('.') or 'settings'}: expected an object, got {describe_json(value)}; "
                        "using defaults")
        return base
    fields = {camel(f.name): f for f in attrs.fields(cls)}
    hints = typing.get_type_hints(cls)
    defaults = cls()
    changes: dict[str, Any] = {}
    for key, item in value.items():
        field = fields.get(key) or fields.get(camel(snake(key)))
        where = f"{path}{key}"
        if field is None:
            problems.append(f"{where}: unknown setting, ignored")
            continue
        hint, default = hints[field.name], getattr(defaults, field.name)
        if attrs.has(hint):
            changes[field.name] = structure_lenient(item, hint, getattr(base, field.name), problems, f"{where}.")
            continue
        if typing.get_origin(hint) is dict and isinstance(item, dict):
            changes[field.name] = _dict_lenient(item, hint, problems, where)
            continue
        try:
            new = structure(item, hint)
            if field.validator is not None:
                field.validator(None, field, new)
        except Replaced as error:
            problems.append(f"{where}: {error}; using {error.value!r}")
            new = error.value
        except ParamsError as error:
            problems.append(f"{_join(where, error.field)}: {error}; using the default {default!r}")
            new = default
        except ValueError as error:
            problems.append(f"{where}: {error}; using the default {default!r}")
            new = default
        changes[field.name] = new
    return attrs.evolve(base, **changes)


def _dict_lenient(value: dict[str, Any], hint: Any, problems: list[str], where: str) -> dict[str, Any]:
    _, item_type = typing.get_args(hint)
    kept = {}
    for name, entry in value.items():
        try:
            kept[name] = structure(entry, item_type)
        except ParamsError as error:
            field = f"{error.field}: " if error.field else ""
            problems.append(f"{where}.{name}: {field}{error}; entry ignored")
        except ValueError as error:
            problems.append(f"{where}.{name}: {error}; entry ignored")
    return kept
