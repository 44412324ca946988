"""What a model request asks, read the same way for Anthropic Messages, OpenAI Responses and Chat Completions."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

Api = Literal["anthropic", "responses", "chat", "count_tokens"]

_SUFFIXES: tuple[tuple[str, Api], ...] = (
    ("/messages/count_tokens", "count_tokens"), ("/messages", "anthropic"),
    ("/responses", "responses"), ("/chat/completions", "chat"))


def api_of(path: str) -> Api | None:
    """The model API a request path belongs to, or None (``/v1/models``, anything else)."""
    bare = path.split("?", 1)[0].rstrip("/")
    for suffix, api in _SUFFIXES:
        if bare.endswith(suffix):
            return api
    return None


@dataclasses.dataclass(frozen=True)
class OfferedTool:
    """A tool the request offers the model; ``namespace`` is set for tools grouped as Codex groups MCP tools."""

    name: str
    namespace: str | None = None


def offered_tools(body: Any) -> list[OfferedTool]:
    """Every tool the request offers, in order; a namespace's tools are listed one by one."""
    found: list[OfferedTool] = []
    for tool in _list(body, "tools"):
        if not isinstance(tool, dict):
            continue
        if tool.get("type") == "namespace":
            found.extend(OfferedTool(str(sub.get("name")), str(tool.get("name")))
                         for sub in tool.get("tools") or () if isinstance(sub, dict) and sub.get("name"))
            continue
        name = tool.get("name") or (tool.get("function") or {}).get("name")
        if name:
            found.append(OfferedTool(str(name)))
    return found


def text_of(content: Any) -> str:
    """The text of a message's content: a string, or the text (and tool result) parts of a list, one per line."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, dict):
            continue
        if part.get("type") in ("text", "input_text", "output_text"):
            parts.append(str(part.get("text", "")))
        elif part.get("type") == "tool_result":
            parts.append(text_of(part.get("content")))
    return "\n".join(parts)


def newest_tool_result(api: Api | None, body: Any) -> str | None:
    """The text of the tool result that ends the conversation, or None when it does not end with one."""
    if api == "anthropic":
        last = _last_turn(body)
        blocks = last.get("content") if last.get("role") == "user" else None
        results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"] \
            if isinstance(blocks, list) else []
        return text_of(results[-1].get("content")) if results else None
    if api == "chat":
        messages = _list(body, "messages")
        last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
        return text_of(last.get("content")) if last.get("role") == "tool" else None
    if api == "responses":
        items = _list(body, "input")
        last = items[-1] if items and isinstance(items[-1], dict) else {}
        if last.get("type") in ("function_call_output", "custom_tool_call_output"):
            output = last.get("output")
            return output if isinstance(output, str) else text_of(output) if isinstance(output, list) \
                else json.dumps(output)
    return None


def last_user_text(api: Api | None, body: Any) -> str:
    """The text of the newest user message (its text parts; tool results are not user text)."""
    if api == "responses" and isinstance(body, dict) and isinstance(body.get("input"), str):
        return str(body["input"])
    key = "input" if api == "responses" else "messages"
    for message in reversed(_list(body, key)):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, list):
            content = [p for p in content if isinstance(p, dict) and p.get("type") != "tool_result"]
            if not content:
                continue
        return text_of(content)
    return ""


def prompt_chars(api: Api | None, body: Any) -> int:
    """Characters of the prompt's message contents (and system), the base of the fake's usage estimates."""
    if not isinstance(body, dict):
        return 0
    if api == "chat":  # kept as FakeOpenAIServer always counted it
        return sum(len(str(m.get("content") or "")) for m in _list(body, "messages") if isinstance(m, dict))
    items = body.get("input") if api == "responses" else body.get("messages")
    system = body.get("instructions") if api == "responses" else body.get("system")
    return len(_flat(items)) + len(_flat(system))


def chat_prompt_tokens(body: Any) -> int:
    """A chat prompt's tokens as the fake counts them for the window: UTF-8 bytes of each message's content
    over four, rounded up, plus four per message."""
    messages = body.get("messages") if isinstance(body, dict) else None
    total = 0
    for message in messages or ():
        content = message.get("content") if isinstance(message, dict) else None
        size = len(json.dumps(content, ensure_ascii=False).encode("utf-8")) if isinstance(content, list) else \
            len(str(content or "").encode("utf-8"))
        total += -(-size // 4) + 4
    return total


def _flat(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else json.dumps(value, ensure_ascii=False)


def _last_turn(body: Any) -> dict[str, Any]:
    """The newest Anthropic message that is not a ``role: system`` aside (Claude Code appends those)."""
    turns = [m for m in _list(body, "messages") if isinstance(m, dict) and m.get("role") != "system"]
    return turns[-1] if turns else {}


def _list(body: Any, key: str) -> list[Any]:
    value = body.get(key) if isinstance(body, dict) else None
    return value if isinstance(value, list) else []


@dataclasses.dataclass(frozen=True)
class RecordedRequest:
    """One request the server received."""

    method: str
    path: str
    """The path without the query string."""
    headers: dict[str, str]
    """Header names in lower case."""
    body: Any
    """The JSON body, or None when there was none or it was not JSON."""
    raw: bytes
    """The body's bytes as received."""
    query: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    api: Api | None = None
    """Which API the path belongs to (``anthropic``, ``responses``, ``chat``, ``count_tokens``), or None."""
    at: float = 0.0
    """``time.monotonic()`` when it arrived."""

    @property
    def tools(self) -> list[OfferedTool]:
        """The tools the request offers the model."""
        return offered_tools(self.body)

    @property
    def last_user_text(self) -> str:
        """The newest user message's text."""
        return last_user_text(self.api, self.body)

    @property
    def tool_result(self) -> str | None:
        """The text of the tool result that ends the conversation, or None."""
        return newest_tool_result(self.api, self.body)
