"""The editor plugins spell every method name and error code as protocol/ does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from protocol import errors, methods

EDITORS = Path(__file__).resolve().parent.parent / "editors"
TS_PROTOCOL = EDITORS / "vscode" / "src" / "protocol.ts"
LUA_PROTOCOL = EDITORS / "neovim" / "lua" / "context_sidecar" / "protocol.lua"
PI_PROTOCOL = EDITORS / "pi" / "src" / "protocol.ts"


def python_constants(module: object, kind: type) -> dict[str, object]:
    """Upper-case module constants of one type; method names are the strings holding a slash."""
    found = {name: value for name, value in vars(module).items() if name.isupper() and type(value) is kind}
    if kind is str:
        found = {name: value for name, value in found.items() if "/" in value}
    return found


def block(text: str, opening: str) -> str:
    """The body of the ``{ ... }`` that follows ``opening``."""
    start = text.index(opening)
    body_start = text.index("{", start) + 1
    return text[body_start:text.index("}", body_start)]


def entries(body: str) -> dict[str, object]:
    """``NAME: 'value'`` (TS) or ``NAME = 'value'`` (Lua) entries, strings or integers."""
    entry = r"^\s*([A-Z][A-Z0-9_]*)\s*[:=]\s*(?:'([^']*)'|\"([^\"]*)\"|(-?\d+))\s*,?\s*$"
    pairs = re.findall(entry, body, re.M)
    names = [name for name, *_ in pairs]
    assert len(names) == len(set(names)), f"a name twice: {sorted(n for n in names if names.count(n) > 1)}"
    return {name: int(number) if number else (single or double) for name, single, double, number in pairs}


@pytest.mark.parametrize(("path", "methods_opening", "errors_opening"), [
    (TS_PROTOCOL, "export const Methods =", "export const ErrorCodes ="),
    (LUA_PROTOCOL, "M.methods =", "M.errors ="),
], ids=["vscode", "neovim"])
def test_plugin_constants_match_protocol(path: Path, methods_opening: str, errors_opening: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert entries(block(text, methods_opening)) == python_constants(methods, str)
    assert entries(block(text, errors_opening)) == python_constants(errors, int)


def test_the_pi_extension_spells_the_names_it_uses_as_protocol_does() -> None:
    text = PI_PROTOCOL.read_text(encoding="utf-8")
    used, codes = entries(block(text, "export const Methods =")), entries(block(text, "export const ErrorCodes ="))
    assert used and used.items() <= python_constants(methods, str).items()
    assert codes and codes.items() <= python_constants(errors, int).items()
    assert f"PROTOCOL_VERSION = {methods.PROTOCOL_VERSION};" in text
    assert f"EXPERIMENTAL_KEY = '{methods.EXPERIMENTAL_KEY}';" in text


def test_every_request_is_known_to_the_plugins() -> None:
    for path in (TS_PROTOCOL, LUA_PROTOCOL):
        text = path.read_text(encoding="utf-8")
        for name in (*methods.REQUESTS, *methods.SERVER_NOTIFICATIONS, *methods.CLIENT_NOTIFICATIONS):
            assert f"'{name}'" in text, f"{path.name} lacks {name}"
