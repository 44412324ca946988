"""Test helpers shipped with the package: a scripted fake LLM provider, a refusing proxy, a stand-in model."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sidecar.testing.openai_server import FakeOpenAIServer
    from sidecar.testing.provider import FakeProvider, RecordedRequest, Reply, ToolCall, Usage, reference_policy
    from sidecar.testing.refusing_proxy import RefusingProxy

_HOMES = {"FakeOpenAIServer": "openai_server", "RefusingProxy": "refusing_proxy",
          **dict.fromkeys(("FakeProvider", "RecordedRequest", "Reply", "ToolCall", "Usage", "reference_policy"),
                          "provider")}
__all__ = ["FakeOpenAIServer", "FakeProvider", "RecordedRequest", "RefusingProxy", "Reply", "ToolCall", "Usage",
           "reference_policy"]


def __getattr__(name: str) -> Any:
    """Import on first use, so ``python -m sidecar.testing.provider`` runs a module not yet imported."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"sidecar.testing.{_HOMES[name]}"), name)
