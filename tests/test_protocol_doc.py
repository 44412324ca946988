"""docs/protocol.md, the repository's protocol reference, names everything the ``protocol`` package defines."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest

from protocol import errors, methods, types
from sidecar.wire import camel

DOC = Path(__file__).resolve().parents[1] / "docs" / "protocol.md"
TEXT = DOC.read_text(encoding="utf-8")
WORDS = set(re.findall(r"[A-Za-z_$][A-Za-z0-9_/$]*", TEXT))

ALL_METHODS = (*methods.REQUESTS, *methods.CLIENT_NOTIFICATIONS, *methods.SERVER_NOTIFICATIONS,
               *methods.SERVER_REQUESTS)
WIRE_CLASSES = [value for value in vars(types).values() if isinstance(value, type) and attrs.has(value)]


@pytest.mark.parametrize("method", ALL_METHODS)
def test_every_method_is_documented(method: str) -> None:
    assert re.search(rf"(?<![\w/]){re.escape(method)}(?![\w/])", TEXT), \
        f"{method} is in protocol/methods.py but not in docs/protocol.md"


@pytest.mark.parametrize("name", [name for name in vars(errors) if name.isupper()])
def test_every_error_code_is_documented(name: str) -> None:
    code = getattr(errors, name)
    assert re.search(rf"(?<![\d-]){code}(?!\d)", TEXT), f"error {name} ({code}) is not in docs/protocol.md"


@pytest.mark.parametrize("cls", WIRE_CLASSES, ids=lambda cls: cls.__name__)
def test_every_wire_field_is_documented(cls: type) -> None:
    missing = [camel(field.name) for field in attrs.fields(cls) if camel(field.name) not in WORDS]
    assert not missing, f"{cls.__name__} fields missing from docs/protocol.md: {', '.join(missing)}"


def test_the_protocol_version_is_the_documented_one() -> None:
    assert f"version {methods.PROTOCOL_VERSION}" in TEXT


def test_the_documented_methods_all_exist() -> None:
    documented = set(re.findall(r"(?<![\w/.])((?:memory|context)/[A-Za-z]+)", TEXT))
    assert documented <= set(ALL_METHODS), f"documented but not defined: {sorted(documented - set(ALL_METHODS))}"
