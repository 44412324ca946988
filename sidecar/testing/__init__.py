"""Test helpers that ship with the package: a scriptable OpenAI-compatible server and a stand-in model on it."""

from sidecar.testing.openai_server import FakeOpenAIServer, RecordedRequest, Reply

__all__ = ["FakeOpenAIServer", "RecordedRequest", "Reply"]
