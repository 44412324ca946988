"""The OpenAI-compatible face of ``FakeProvider``, as the ``openai_server`` fixture gives it.

    with FakeOpenAIServer() as server:
        server.script(Reply(status=500), Reply(text="a summary"))
        ...  # point an OpenAI client at server.base_url
        assert server.max_in_flight <= 4
"""

from __future__ import annotations

from sidecar.testing.conversation import chat_prompt_tokens as prompt_tokens
from sidecar.testing.provider import FakeProvider, RecordedRequest, Reply, Responder


class FakeOpenAIServer(FakeProvider):
    """A ``FakeProvider`` read as an OpenAI-compatible server (it answers the other APIs too)."""

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        """The chat completion requests received so far."""
        return [r for r in self.requests if r.method == "POST" and r.api == "chat"]


__all__ = ["FakeOpenAIServer", "RecordedRequest", "Reply", "Responder", "prompt_tokens"]
