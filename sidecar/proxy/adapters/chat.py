"""OpenAI Chat Completions (``POST /v1/chat/completions``): pi, and any OpenAI-compatible client."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sidecar.proxy.adapters.base import Adapter, BadRequest, BodyRecorder, Item, Recorded, Recorder, Request, Unit
from sidecar.proxy.adapters.openai_common import content_text, error_body, recorded
from sidecar.proxy.jsontext import compact, object_members, without_cache_control
from sidecar.proxy.sse import EventReader

ROLES = ("system", "developer", "user", "assistant", "tool")
KEPT = ("role", "content", "name", "tool_calls", "tool_call_id", "refusal")


class ChatAdapter(Adapter):
    """Chat Completions: a message is a unit and a sidecar message of its own."""

    name = "chat"
    conversation_key = "messages"

    def check(self, request: Request) -> None:
        messages = request.values["messages"]
        if not isinstance(messages, list):
            raise BadRequest("Invalid type for 'messages': expected an array of objects.")
        for index in range(request.body.reused, len(messages)):
            message = messages[index]
            if not isinstance(message, dict) or message.get("role") not in ROLES:
                raise BadRequest(f"Invalid value for 'messages[{index}].role': expected one of {', '.join(ROLES)}.")
            calls = message.get("tool_calls")
            if calls is not None and not (isinstance(calls, list) and all(
                    isinstance(c, dict) and isinstance(c.get("id"), str)
                    and isinstance((c.get("function") or {}).get("name"), str) for c in calls)):
                raise BadRequest(f"Invalid value for 'messages[{index}].tool_calls'.")
            if message["role"] == "tool" and not isinstance(message.get("tool_call_id"), str):
                raise BadRequest(f"Missing required parameter: 'messages[{index}].tool_call_id'.")

    def clean(self, value: Any, text: str) -> tuple[Any, str]:
        content = value.get("content")
        if '"cache_control"' not in text or not isinstance(content, list):
            return value, text
        parts = [{k: v for k, v in part.items() if k != "cache_control"} if isinstance(part, dict) else part
                 for part in content]
        count = sum(1 for part in content if isinstance(part, dict) and "cache_control" in part)
        clean = {**value, "content": parts}
        return (clean, without_cache_control(text, clean, count)) if count else (value, text)

    def units(self, values: Sequence[Any], texts: Sequence[str]) -> list[Unit]:
        return [Unit((text,), (value,)) for value, text in zip(values, texts, strict=True)]

    def identity(self, unit: Unit) -> str:
        message = unit.values[0]
        calls = [[c.get("id"), (c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments")]
                 for c in message.get("tool_calls") or ()]
        content = message.get("content")
        if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            content = content_text(content)  # text in parts says what the same text in one string says
        said = [message.get("role"), content or "", calls, message.get("tool_call_id"), message.get("name")]
        return json.dumps(said, sort_keys=True, ensure_ascii=False, separators=(",", ":"))

    def parts(self, unit: Unit) -> list[dict[str, Any]]:
        message = {key: value for key, value in unit.values[0].items() if key in KEPT and value is not None}
        if message["role"] == "developer":
            message["role"] = "system"
        if message["role"] != "assistant" and message.get("content") is None:
            message["content"] = ""
        for call in message.get("tool_calls") or ():
            function = call.setdefault("function", {})
            if not isinstance(function.get("arguments", ""), str):
                function["arguments"] = compact(function["arguments"])
        reasoning = unit.values[0].get("reasoning_content") or unit.values[0].get("reasoning")
        if message["role"] == "assistant" and isinstance(reasoning, str) and reasoning:
            message["reasoning"] = reasoning
        return [message]

    def render_unit(self, unit: Unit, items: Sequence[Item]) -> list[str]:
        item, original = items[0], unit.values[0]
        if item.pruned and original.get("role") == "tool":
            return [compact({"role": "tool", "tool_call_id": original.get("tool_call_id"),
                             "content": item.message.get("content")})]
        wanted = [call["id"] for call in item.message.get("tool_calls") or ()]
        if original.get("role") == "assistant" and wanted != [c.get("id") for c in original.get("tool_calls") or ()]:
            trimmed = {**original, "tool_calls": [c for c in original["tool_calls"] if c.get("id") in wanted]}
            if not trimmed["tool_calls"]:
                del trimmed["tool_calls"]
            return [compact(trimmed)]
        return [unit.texts[0]]

    def render_others(self, items: Sequence[Item]) -> list[str]:
        return [compact(item.message) for item in items]

    def recorder(self, stream: bool) -> Recorder:
        return StreamRecorder() if stream else CompletionRecorder()

    def error_body(self, status: int, message: str) -> bytes:
        return error_body(status, message)


class StreamRecorder(Recorder):
    """An answer from ``chat.completion.chunk`` deltas, complete at its finish reason (or ``[DONE]``)."""

    def __init__(self) -> None:
        self._events = EventReader()
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._usage: Any = None
        self._done = False

    def feed(self, data: bytes) -> None:
        for _, text in self._events.feed(data):
            if text.strip() == "[DONE]":
                self._done = True
                continue
            try:
                chunk = json.loads(text)
            except ValueError:
                continue
            if not isinstance(chunk, dict):
                continue
            if isinstance(chunk.get("usage"), dict):
                self._usage = chunk["usage"]
            for choice in chunk.get("choices") or ():
                if isinstance(choice, dict) and choice.get("index", 0) == 0:
                    self._delta(choice.get("delta") or {})
                    self._done = self._done or bool(choice.get("finish_reason"))

    def _delta(self, delta: dict[str, Any]) -> None:
        if isinstance(delta.get("content"), str):
            self._text.append(delta["content"])
        thinking = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(thinking, str):
            self._reasoning.append(thinking)
        for call in delta.get("tool_calls") or ():
            entry = self._calls.setdefault(call.get("index", len(self._calls)),
                                           {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
            entry["id"] = call.get("id") or entry["id"]
            function = call.get("function") or {}
            entry["function"]["name"] += function.get("name") or ""
            entry["function"]["arguments"] += function.get("arguments") or ""

    def finish(self) -> Recorded | None:
        if not self._done:
            return None
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._text) or None}
        if self._calls:
            message["tool_calls"] = [self._calls[index] for index in sorted(self._calls)]
        if self._reasoning:
            message["reasoning_content"] = "".join(self._reasoning)
        return recorded(Unit((compact(message),), (message,)), self._usage)


class CompletionRecorder(BodyRecorder):
    """An answer from a plain JSON completion: its message kept as the provider wrote it."""

    def answer(self, text: str) -> Recorded | None:
        values, _, _ = object_members(text)
        choices = values.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return None
        message = choices[0].get("message")
        if not isinstance(message, dict) or message.get("role") != "assistant":
            return None
        return recorded(Unit((compact(message),), (message,)), values.get("usage"))
