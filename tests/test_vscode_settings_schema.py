"""The VS Code extension's settings schema names every server setting, with its default and JSON type."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.settings import server_settings

MANIFEST = Path(__file__).resolve().parent.parent / "editors" / "vscode" / "package.json"
PREFIX = "contextSidecar."
EXTENSION_ONLY = {"serverCommand", "serverArgs", "trace.server", "followWorkspace", "watchAgents"}
"""Settings of the extension itself (how to start the server), never sent to it."""


@pytest.fixture(scope="module")
def schema() -> dict[str, dict[str, Any]]:
    properties = json.loads(MANIFEST.read_text())["contributes"]["configuration"]["properties"]
    return {key.removeprefix(PREFIX): entry for key, entry in properties.items()
            if key.removeprefix(PREFIX) not in EXTENSION_ONLY}


def test_the_schema_has_exactly_the_server_settings(schema: dict[str, dict[str, Any]]) -> None:
    server = server_settings()
    assert sorted(set(server) - set(schema)) == [], "server settings missing from editors/vscode/package.json"
    assert sorted(set(schema) - set(server)) == [], "schema entries the server does not know"


def test_defaults_and_types_match(schema: dict[str, dict[str, Any]]) -> None:
    for key, (default, kinds) in server_settings().items():
        entry = schema[key]
        assert entry["default"] == default, key
        declared = entry["type"] if isinstance(entry["type"], list) else [entry["type"]]
        assert set(declared) == kinds, key


def test_every_entry_is_described(schema: dict[str, dict[str, Any]]) -> None:
    for key, entry in schema.items():
        assert len(entry.get("markdownDescription") or entry.get("description") or "") > 20, key
