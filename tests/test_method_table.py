"""The one table of methods: every protocol method once, each handled in the module of its family."""

from __future__ import annotations

import attrs

from protocol import methods
from protocol import types as t
from sidecar.rpc.handlers import METHODS


def test_the_table_serves_every_protocol_method_once() -> None:
    names = [method.name for method in METHODS]
    assert sorted(names) == sorted({*methods.REQUESTS, *methods.CLIENT_NOTIFICATIONS})
    assert len(names) == len(set(names))
    assert {method.name for method in METHODS if method.notification} == set(methods.CLIENT_NOTIFICATIONS)


def test_each_handler_lives_in_the_module_of_its_family() -> None:
    misplaced = [f"{method.name} in {method.handler.__module__}" for method in METHODS
                 if method.handler.__module__ != f"sidecar.rpc.handlers.{method.name.split('/')[0]}"]
    assert misplaced == []


def test_params_are_protocol_types() -> None:
    assert [method.name for method in METHODS
            if not (attrs.has(method.params) and getattr(t, method.params.__name__, None) is method.params)] == []
