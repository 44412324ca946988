"""Checks that a message list is a valid OpenAI Chat Completions conversation."""

from __future__ import annotations

from typing import Any

ROLES = ("system", "user", "assistant", "tool")
ALLOWED_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id", "id", "metadata", "reasoning"}
"""``reasoning`` is the importers' field for thinking; assemble sends it only when asked."""


def assert_valid_openai_sequence(messages: list[dict[str, Any]], *, allow_extra_keys: bool = False) -> None:
    """Fail unless every message is well formed and every tool call is answered exactly once, in time."""
    assert isinstance(messages, list), f"messages must be a list, got {type(messages).__name__}"
    pending: dict[str, int] = {}
    for index, msg in enumerate(messages):
        where = f"message {index} ({msg.get('role') if isinstance(msg, dict) else msg!r})"
        assert isinstance(msg, dict), f"{where}: not an object"
        role = msg.get("role")
        assert role in ROLES, f"{where}: role must be one of {ROLES}"
        if not allow_extra_keys:
            extra = set(msg) - ALLOWED_KEYS
            assert not extra, f"{where}: unexpected keys {sorted(extra)}"
        _check_content(msg.get("content"), where, nullable=role == "assistant", images=role == "user")
        if "reasoning" in msg:
            assert role == "assistant" and isinstance(msg["reasoning"], str), f"{where}: reasoning is assistant text"
        if "id" in msg:
            assert isinstance(msg["id"], str) and msg["id"], f"{where}: id must be a non-empty string"
        if "metadata" in msg:
            assert isinstance(msg["metadata"], dict), f"{where}: metadata must be an object"
        if role == "tool":
            call_id = msg.get("tool_call_id")
            assert isinstance(call_id, str) and call_id, f"{where}: tool message needs a tool_call_id"
            assert isinstance(msg.get("content"), str), f"{where}: tool content must be a string"
            assert call_id in pending, (
                f"{where}: answers {call_id!r}, which is not an unanswered call of the preceding assistant"
            )
            del pending[call_id]
            continue
        assert not pending, (
            f"{where}: tool calls {sorted(pending)} (from message {min(pending.values())}) "
            "are not all answered before the next non-tool message"
        )
        assert "tool_call_id" not in msg, f"{where}: only tool messages carry tool_call_id"
        if role != "assistant":
            assert "tool_calls" not in msg, f"{where}: only assistant messages carry tool_calls"
            assert msg.get("content") is not None, f"{where}: content must not be null"
            continue
        calls = msg.get("tool_calls")
        if calls is None:
            assert msg.get("content"), f"{where}: assistant needs content or tool_calls"
            continue
        assert isinstance(calls, list) and calls, f"{where}: tool_calls must be a non-empty list"
        for call in calls:
            call_id = _check_call(call, where)
            assert call_id not in pending, f"{where}: tool call id {call_id!r} repeated"
            pending[call_id] = index
    assert not pending, f"tool calls {sorted(pending)} are never answered"


def _check_content(content: Any, where: str, *, nullable: bool, images: bool = False) -> None:
    """Content is a string, a list of text parts (and image parts for users), or (when allowed) null."""
    if content is None:
        assert nullable, f"{where}: content must not be null"
        return
    if isinstance(content, str):
        return
    assert isinstance(content, list), f"{where}: content must be a string, a list of parts or null"
    for part in content:
        if images and isinstance(part, dict) and part.get("type") == "image_url":
            url = part.get("image_url", {}).get("url") if isinstance(part.get("image_url"), dict) else None
            assert isinstance(url, str) and url, f"{where}: image part without a url"
            continue
        assert isinstance(part, dict) and part.get("type") == "text", f"{where}: bad content part {part!r}"
        assert isinstance(part.get("text"), str), f"{where}: text part without text"


def _check_call(call: Any, where: str) -> str:
    """One tool_calls entry is {id, type: function, function: {name, arguments: str}}; returns its id."""
    assert isinstance(call, dict), f"{where}: tool call must be an object"
    assert isinstance(call.get("id"), str) and call["id"], f"{where}: tool call needs an id"
    assert call.get("type") == "function", f"{where}: tool call type must be 'function'"
    function = call.get("function")
    assert isinstance(function, dict), f"{where}: tool call needs a function object"
    assert isinstance(function.get("name"), str) and function["name"], f"{where}: tool call needs a name"
    assert isinstance(function.get("arguments"), str), f"{where}: arguments must be a JSON string"
    return call["id"]
