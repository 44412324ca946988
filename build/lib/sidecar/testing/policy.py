"""How a fake model decides its answers: the ``Responder`` type and the reference policy agent tests use."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sidecar.testing.conversation import RecordedRequest
from sidecar.testing.replies import Reply, ToolCall

Responder = Callable[[RecordedRequest], "Reply | str"]


def reference_policy(*, trigger: str = "USE_TOOL", tool: str = "memory_grep", arguments: Any = None,
                     text: str = "Hello from the fake model.", final: str = "FINAL: tool said: ") -> Responder:
    """A responder that makes one tool round trip: call ``tool`` on ``trigger``, then report the result.

    Newest input a tool result: answers ``final`` + the result (first 300 characters). Newest user text
    containing ``trigger`` and a tool named ``tool`` offered (else one whose name contains it): calls it
    with ``arguments`` (default ``{"pattern": "secret"}``), in its namespace if it has one. Else: ``text``.
    """
    args = {"pattern": "secret"} if arguments is None else arguments

    def respond(request: RecordedRequest) -> Reply:
        result = request.tool_result
        if result is not None:
            return Reply(text=final + result[:300])
        if trigger in request.last_user_text:
            offered = request.tools
            match = [t for t in offered if t.name == tool] or [t for t in offered if tool in t.name]
            if match:
                return Reply(tool_calls=(ToolCall(match[0].name, args, namespace=match[0].namespace),))
        return Reply(text=text)

    return respond
