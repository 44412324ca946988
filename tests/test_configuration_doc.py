"""docs/configuration.md lists every server setting with the default the server really has."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.helpers.settings import server_settings

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
PLACEHOLDER = object()
"""A default the doc describes in words (`per-user file`): listed, but not a value to compare."""


def documented_defaults() -> dict[str, Any]:
    """The settings table: `a.b` / `c` | 1 / `x` rows read as {"a.b": 1, "a.c": "x"}."""
    text = DOC.read_text(encoding="utf-8")
    table = text[text.index("## Settings"):].split("\n\n| setting |", 1)[1].split("\n\n", 1)[0]
    found: dict[str, Any] = {}
    for row in table.splitlines()[2:]:
        keys_cell, defaults_cell = [cell.strip() for cell in row.strip("|").split("|")][:2]
        keys = [key.strip().strip("`") for key in keys_cell.split(" / ")]
        defaults = [value.strip() for value in defaults_cell.split(" / ")]
        assert len(keys) == len(defaults), f"row {row!r}: {len(keys)} settings, {len(defaults)} defaults"
        prefix = keys[0].rpartition(".")[0]
        for index, (key, value) in enumerate(zip(keys, defaults, strict=True)):
            found[key if index == 0 or not prefix else f"{prefix}.{key}"] = parse(value)
    return found


def parse(value: str) -> Any:
    """A cell's default: JSON where it is one, a backticked word as a string, other words as a placeholder."""
    quoted = value.startswith("`") and value.endswith("`")
    bare = value.strip("`")
    try:
        return json.loads(bare)
    except json.JSONDecodeError:
        return bare if quoted else PLACEHOLDER


def test_the_table_lists_every_setting_and_no_other() -> None:
    documented, server = documented_defaults(), server_settings()
    assert sorted(set(server) - set(documented)) == [], f"settings missing from {DOC.name}"
    assert sorted(set(documented) - set(server)) == [], f"{DOC.name} lists settings the server does not have"


def test_each_documented_default_is_the_servers() -> None:
    server = server_settings()
    compared = 0
    for key, value in documented_defaults().items():
        if value is PLACEHOLDER:
            continue
        actual = server[key][0]
        assert value == actual, f"{DOC.name} says {key} defaults to {value!r}; the server has {actual!r}"
        compared += 1
    assert compared >= 25, compared
