"""The OpenAI Responses API (``POST /v1/responses``): Codex and the ``openai`` SDK's ``responses``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sidecar.importers.common import reasoning_text, text_content, tool_call
from sidecar.proxy.adapters.base import Adapter, BadRequest, BodyRecorder, Item, Recorded, Recorder, Request, Unit
from sidecar.proxy.adapters.openai_common import content_text, error_body, recorded
from sidecar.proxy.jsontext import array_elements, compact, object_members
from sidecar.proxy.sse import EventReader, json_events

OUTPUTS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")
"""Items that answer a call: a tool message each."""
CALLS = ("function_call", "custom_tool_call", "local_shell_call")


def answers(item: dict[str, Any]) -> bool:
    """Whether an item is the model's (an assistant turn's): everything but input messages and call outputs."""
    role = item.get("role")
    return item.get("type") not in OUTPUTS and (role is None or role == "assistant")


class ResponsesAdapter(Adapter):
    """Responses: an input item is a unit, but the model's consecutive items make one (one assistant message)."""

    name = "responses"
    conversation_key = "input"

    def check(self, request: Request) -> None:
        items = request.values["input"]
        if not isinstance(items, list):
            raise BadRequest("Invalid type for 'input': expected a string or an array of input items.")
        for index in range(request.body.reused, len(items)):
            if not isinstance(items[index], dict):
                raise BadRequest(f"Invalid type for 'input[{index}]': expected an object.")

    def manageable(self, values: dict[str, Any]) -> bool:
        """Not a conversation kept by the provider (``previous_response_id``), nor a plain string input."""
        return not values.get("previous_response_id") and isinstance(values.get("input"), list)

    def clean(self, value: Any, text: str) -> tuple[Any, str]:
        return value, text

    def units(self, values: Sequence[Any], texts: Sequence[str]) -> list[Unit]:
        out: list[Unit] = []
        run_texts: list[str] = []
        run_values: list[Any] = []
        for value, text in zip(values, texts, strict=True):
            if answers(value):
                run_texts.append(text)
                run_values.append(value)
                continue
            if run_values:
                out.append(Unit(tuple(run_texts), tuple(run_values)))
                run_texts, run_values = [], []
            out.append(Unit((text,), (value,)))
        if run_values:
            out.append(Unit(tuple(run_texts), tuple(run_values)))
        return out

    def identity(self, unit: Unit) -> str:
        return json.dumps([_said(item) for item in unit.values], sort_keys=True, ensure_ascii=False,
                          separators=(",", ":"))

    def parts(self, unit: Unit) -> list[dict[str, Any]]:
        first = unit.values[0]
        if not answers(first):
            if first.get("type") in OUTPUTS:
                output = first.get("output")
                return [{"role": "tool", "tool_call_id": str(first.get("call_id") or ""),
                         "content": output if isinstance(output, str) else content_text(output) or compact(output)}]
            message: dict[str, Any] = {"role": "user", "content": content_text(first.get("content")) or ""}
            if first.get("role") in ("developer", "system"):
                message["pinned"] = True  # kept in its place, never compacted, as the instructions it is
                message["metadata"] = {"providerRole": first["role"]}
            return [message]
        texts = [content_text(item.get("content")) for item in unit.values if item.get("type") == "message"]
        thinking = [content_text(item.get("summary")) for item in unit.values if item.get("type") == "reasoning"]
        calls = [_call(item) for item in unit.values if item.get("type") in CALLS]
        reply: dict[str, Any] = {"role": "assistant", "content": text_content(texts)}
        if calls:
            reply["tool_calls"] = calls
        reasoning = reasoning_text(thinking)
        if reasoning:
            reply["reasoning"] = reasoning
        return [reply]

    def render_unit(self, unit: Unit, items: Sequence[Item]) -> list[str]:
        item = items[0]
        if item.pruned and unit.values[0].get("type") in OUTPUTS:
            return [compact({"type": unit.values[0]["type"], "call_id": unit.values[0].get("call_id"),
                             "output": item.message.get("content")})]
        if unit.values[0].get("type") in OUTPUTS or not answers(unit.values[0]):
            return list(unit.texts)
        wanted = {call["id"] for call in item.message.get("tool_calls") or ()}
        kept = [(text, value) for text, value in zip(unit.texts, unit.values, strict=True)
                if value.get("type") not in CALLS or _call(value)["id"] in wanted]
        while kept and kept[-1][1].get("type") == "reasoning":
            kept.pop()  # the API refuses a reasoning item without the item it led to (its calls were left out)
        return [text for text, _ in kept]

    def render_others(self, items: Sequence[Item]) -> list[str]:
        out: list[str] = []
        for item in items:
            message = item.message
            role = message.get("role")
            if role == "tool":
                out.append(compact({"type": "function_call_output", "call_id": message["tool_call_id"],
                                    "output": content_text(message.get("content"))}))
                continue
            if role == "assistant":
                text = content_text(message.get("content"))
                if text:
                    out.append(compact({"type": "message", "role": "assistant",
                                        "content": [{"type": "output_text", "text": text}]}))
                for call in message.get("tool_calls") or ():
                    out.append(compact({"type": "function_call", "call_id": call["id"],
                                        "name": call["function"]["name"],
                                        "arguments": call["function"].get("arguments") or "{}"}))
                continue
            out.append(compact({"type": "message", "role": "user",
                                "content": [{"type": "input_text", "text": content_text(message.get("content"))}]}))
        return out

    def recorder(self, stream: bool) -> Recorder:
        return StreamRecorder() if stream else ResponseRecorder()

    def error_body(self, status: int, message: str) -> bytes:
        return error_body(status, message)


def _said(item: dict[str, Any]) -> Any:
    """What an item says, without the ids and statuses a resend may drop or add."""
    kind = item.get("type", "message")
    if kind == "message":
        return [kind, item.get("role"), content_text(item.get("content"))]
    if kind == "reasoning":
        return [kind, item.get("encrypted_content") or content_text(item.get("summary"))]
    if kind in CALLS:
        return [kind, item.get("call_id"), item.get("name"),
                item.get("arguments", item.get("input", item.get("action")))]
    if kind in OUTPUTS:
        return [kind, item.get("call_id"), item.get("output")]
    return {key: value for key, value in item.items() if key not in ("id", "status")}


def _call(item: dict[str, Any]) -> dict[str, Any]:
    name = item.get("name") or ("local_shell" if item.get("type") == "local_shell_call" else "tool")
    arguments = item.get("arguments", item.get("input", item.get("action")))
    return tool_call(str(item.get("call_id") or item.get("id") or ""), str(name), arguments)


class StreamRecorder(Recorder):
    """An answer from ``response.output_item.done`` events, complete at ``response.completed``."""

    def __init__(self) -> None:
        self._events = EventReader()
        self._items: list[dict[str, Any]] = []
        self._usage: Any = None
        self._done = False

    def feed(self, data: bytes) -> None:
        for name, event in json_events(self._events, data):
            if name == "response.output_item.done" and isinstance(event.get("item"), dict):
                self._items.append(event["item"])
            elif name in ("response.completed", "response.incomplete"):
                response = event.get("response") or {}
                self._usage = response.get("usage")
                if not self._items and isinstance(response.get("output"), list):
                    self._items = [item for item in response["output"] if isinstance(item, dict)]
                self._done = True

    def finish(self) -> Recorded | None:
        if not self._done:
            return None
        unit = Unit(tuple(compact(item) for item in self._items), tuple(self._items)) if self._items else None
        return recorded(unit, self._usage)


class ResponseRecorder(BodyRecorder):
    """An answer from a plain JSON response: its output items kept as the provider wrote them."""

    def answer(self, text: str) -> Recorded | None:
        values, _, _ = object_members(text, 0, {"output": _items})
        output = values.get("output")
        if not isinstance(output, tuple) or values.get("status") not in ("completed", "incomplete"):
            return None
        texts, items = output
        unit = Unit(texts, items) if items else None
        return recorded(unit, values.get("usage"))


def _items(text: str, index: int) -> tuple[Any, int]:
    spans, values, end = array_elements(text, index)
    return (tuple(text[a:b] for a, b in spans), tuple(values)), end
