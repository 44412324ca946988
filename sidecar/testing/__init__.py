"""Test helpers that ship with the package: a scripted fake LLM provider (three APIs) and a refusing proxy."""

from sidecar.testing.openai_server import FakeOpenAIServer
from sidecar.testing.provider import FakeProvider, RecordedRequest, Reply, ToolCall, Usage, reference_policy

__all__ = ["FakeOpenAIServer", "FakeProvider", "RecordedRequest", "Reply", "ToolCall", "Usage", "reference_policy"]
