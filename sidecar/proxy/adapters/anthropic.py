"""The Anthropic Messages API (``POST /v1/messages``): Claude Code and the ``anthropic`` SDKs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sidecar.importers.common import blocks_to_text, image_part, parts_content, reasoning_text, text_content, tool_call
from sidecar.proxy.adapters.base import Adapter, BadRequest, BodyRecorder, Item, Recorded, Recorder, Request, Unit
from sidecar.proxy.jsontext import JsonTextError, array_elements, compact, object_members, without_cache_control
from sidecar.proxy.sse import EventReader, json_events

ROLES = ("user", "assistant", "system")
"""``system`` in messages: Claude Code's mid-conversation system entries."""
NO_MARKER_BLOCKS = ("thinking", "redacted_thinking")
DEFAULT_MARKER = '{"type":"ephemeral"}'
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}


class AnthropicAdapter(Adapter):
    """Messages: one unit per message; a user message's tool results are one sidecar message each."""

    name = "anthropic"
    conversation_key = "messages"

    def check(self, request: Request) -> None:
        messages = request.values["messages"]
        if not isinstance(messages, list):
            raise BadRequest("messages: Input should be a valid list")
        for index in range(request.body.reused, len(messages)):
            message = messages[index]
            where = f"messages.{index}"
            if not isinstance(message, dict):
                raise BadRequest(f"{where}: Input should be a valid dictionary")
            if message.get("role") not in ROLES:
                raise BadRequest(f"{where}.role: Input should be 'user' or 'assistant'")
            content = message.get("content")
            if isinstance(content, str):
                continue
            if not isinstance(content, list):
                raise BadRequest(f"{where}.content: Input should be a valid list")
            for number, block in enumerate(content):
                if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                    raise BadRequest(f"{where}.content.{number}: Input should be a valid dictionary with a type")

    def clean(self, value: Any, text: str) -> tuple[Any, str]:
        if '"cache_control"' not in text or not isinstance(value.get("content"), list):
            return value, text
        count = 0
        blocks = []
        for block in value["content"]:
            if "cache_control" in block:
                block = {key: item for key, item in block.items() if key != "cache_control"}
                count += 1
            inner = block.get("content") if block.get("type") == "tool_result" else None
            if isinstance(inner, list) and any(isinstance(b, dict) and "cache_control" in b for b in inner):
                count += sum(1 for b in inner if isinstance(b, dict) and "cache_control" in b)
                block = {**block, "content": [{k: v for k, v in b.items() if k != "cache_control"}
                                              if isinstance(b, dict) else b for b in inner]}
            blocks.append(block)
        if not count:
            return value, text
        clean = {**value, "content": blocks}
        return clean, without_cache_control(text, clean, count)

    def units(self, values: Sequence[Any], texts: Sequence[str]) -> list[Unit]:
        return [Unit((text,), (value,)) for value, text in zip(values, texts, strict=True)]

    def identity(self, unit: Unit) -> str:
        """Role and blocks; an assistant's text and tool calls only, as a resend keeps them."""
        message = unit.values[0]
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if message["role"] == "assistant":
            said: list[Any] = []
            for block in blocks:
                kind = block.get("type")
                if kind == "text":
                    if block.get("text"):
                        said.append(["text", block["text"]])
                elif kind == "tool_use":
                    said.append(["tool_use", block.get("id"), block.get("name"), block.get("input")])
                elif kind not in NO_MARKER_BLOCKS:
                    said.append(block)
            blocks = said
        return json.dumps([message["role"], blocks], sort_keys=True, ensure_ascii=False, separators=(",", ":"))

    def parts(self, unit: Unit) -> list[dict[str, Any]]:
        return [message for message, _ in split(unit.values[0])]

    def marker(self, request: Request) -> tuple[int, str | None]:
        own = 0
        system = request.values.get("system")
        for entry in (system if isinstance(system, list) else []) + list(request.values.get("tools") or []):
            own += 1 if isinstance(entry, dict) and "cache_control" in entry else 0
        span = request.body.span
        if span is not None and request.body.raw.find(b'"cache_control"', *span) == -1:
            return own, None  # one scan of the bytes, where a walk of every block took a millisecond at 100k tokens
        for message in reversed(request.values["messages"]):  # agents mark their newest message: found at once
            for block in (message or {}).get("content") or ():
                if isinstance(block, dict) and isinstance(block.get("cache_control"), dict):
                    return own, compact(block["cache_control"])
        return own, None

    def render_unit(self, unit: Unit, items: Sequence[Item]) -> list[str]:
        return [_render_unit(unit, items)]

    def render_others(self, items: Sequence[Item]) -> list[str]:
        out: list[str] = []
        results: list[str] = []  # consecutive tool results go back as one user message, as the API wants them
        for item in items:
            if item.kind == "message" and item.message.get("role") == "tool":
                results.append(compact(_result_block(item.message["tool_call_id"], item.message)))
                continue
            _flush(out, results)
            out.append(compact(from_openai(item.message)))
        _flush(out, results)
        return out

    def finish(self, elements: list[bytes], breakpoints: Sequence[int], marker: str | None) -> list[bytes]:
        if elements and json.loads(elements[0]).get("role") != "user":
            # The budget left out the user message before it (an assistant's turn, or a pinned system entry that
            # stays in its place): the API wants a user message first.
            elements.insert(0, compact({"role": "user", "content": "[earlier conversation in memory]"}).encode())
            breakpoints = [index + 1 for index in breakpoints]
        marked: set[int] = set()
        for index in sorted(breakpoints, reverse=True):
            # A message whose content is a string takes no marker without being rewritten (and so unlike the
            # same message in the next request): the marker goes on the nearest message before it that takes one.
            while 0 <= index < len(elements) and index not in marked:
                changed = with_marker(elements[index].decode(), marker or DEFAULT_MARKER)
                if changed is not None:
                    elements[index] = changed.encode()
                    marked.add(index)
                    break
                index -= 1
        return elements

    def recorder(self, stream: bool) -> Recorder:
        return StreamRecorder() if stream else MessageRecorder()

    def error_body(self, status: int, message: str) -> bytes:
        kind = ERROR_TYPES.get(status, "api_error")
        return compact({"type": "error", "error": {"type": kind, "message": message}}).encode()


def split(message: dict[str, Any]) -> list[tuple[dict[str, Any], list[int]]]:
    """The sidecar messages of a provider message, each with the indexes of the content blocks it holds."""
    role, content = message["role"], message.get("content")
    if isinstance(content, str):
        kind = "user" if role == "system" else role
        return [(_tagged({"role": kind, "content": content}, role), [])]
    blocks: list[dict[str, Any]] = content or []
    if role == "assistant":
        texts = [b["text"] for b in blocks if b.get("type") == "text" and isinstance(b.get("text"), str)]
        thinking = [b["thinking"] for b in blocks if b.get("type") == "thinking" and isinstance(b.get("thinking"), str)]
        calls = [tool_call(b["id"], b["name"], b.get("input")) for b in blocks
                 if b.get("type") == "tool_use" and isinstance(b.get("id"), str) and isinstance(b.get("name"), str)]
        reply: dict[str, Any] = {"role": "assistant", "content": text_content(texts)}
        if calls:
            reply["tool_calls"] = calls
        reasoning = reasoning_text(thinking)
        if reasoning:
            reply["reasoning"] = reasoning
        return [(reply, list(range(len(blocks))))]
    parts: list[tuple[dict[str, Any], list[int]]] = []
    rest: list[int] = []
    for index, block in enumerate(blocks):
        if role == "user" and block.get("type") == "tool_result" and isinstance(block.get("tool_use_id"), str):
            result = {"role": "tool", "tool_call_id": block["tool_use_id"],
                      "content": blocks_to_text(block.get("content"))}
            if block.get("is_error"):
                result["metadata"] = {"isError": True}
            parts.append((result, [index]))
        else:
            rest.append(index)
    if rest or not parts:
        pieces = [_user_part(blocks[index]) for index in rest]
        body = parts_content(pieces)
        parts.append((_tagged({"role": "user", "content": body if body is not None else ""}, role), rest))
    return parts


def _tagged(message: dict[str, Any], role: str) -> dict[str, Any]:
    """A mid-conversation system entry is kept in its place: pinned, so never compacted, pruned or left out."""
    if role == "system":
        message["pinned"] = True
        message["metadata"] = {"providerRole": "system"}
    return message


def _user_part(block: dict[str, Any]) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        return {"type": "text", "text": block["text"]}
    if kind == "image":
        source = block["source"] if isinstance(block.get("source"), dict) else {}
        return image_part(source.get("media_type"), source.get("data"), source.get("url")) or \
            {"type": "text", "text": "[image]"}
    return {"type": "text", "text": f"[{kind}]"}


def _render_unit(unit: Unit, items: Sequence[Item]) -> str:
    """A unit from its original: verbatim when all of it is there as it was, else the blocks that are."""
    text, message = unit.texts[0], unit.values[0]
    pieces = split(message)
    present = {int(item.id.rpartition(".")[2]) if len(pieces) > 1 else 0: item for item in items}
    whole = len(present) == len(pieces) and not any(item.pruned for item in items)
    calls = None
    if message["role"] == "assistant" and items:
        wanted = {call["id"] for call in items[0].message.get("tool_calls") or ()}
        if wanted != {call["id"] for call in pieces[0][0].get("tool_calls") or ()}:
            calls, whole = wanted, False
    if whole:
        return text
    _, spans = object_members(text)[:2]
    start, _ = spans["content"]
    blocks, _, _ = array_elements(text, start)
    kept: list[tuple[int, str]] = []
    for index, (_, indexes) in enumerate(pieces):
        item = present.get(index)
        if item is None:
            continue
        for block_index in indexes:
            block = message["content"][block_index]
            if calls is not None and block.get("type") == "tool_use" and block.get("id") not in calls:
                continue
            if item.pruned and block.get("type") == "tool_result":
                kept.append((block_index, compact(_result_block(block["tool_use_id"], item.message))))
            else:
                begin, end = blocks[block_index]
                kept.append((block_index, text[begin:end]))
    kept.sort()
    return '{"role":' + json.dumps(message["role"]) + ',"content":[' + ",".join(piece for _, piece in kept) + "]}"


def _result_block(call_id: str, message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    return {"type": "tool_result", "tool_use_id": call_id,
            "content": content if isinstance(content, str) else blocks_to_text(content)}


def _flush(out: list[str], results: list[str]) -> None:
    if results:
        out.append('{"role":"user","content":[' + ",".join(results) + "]}")
        results.clear()


def from_openai(message: dict[str, Any]) -> dict[str, Any]:
    """A message some other client stored (or a summary), as an Anthropic message."""
    role = message.get("role")
    content = message.get("content")
    if role == "assistant":
        blocks: list[dict[str, Any]] = []
        text = content if isinstance(content, str) else blocks_to_text(content)
        if text:
            blocks.append({"type": "text", "text": text})
        for call in message.get("tool_calls") or ():
            try:
                arguments = json.loads(call["function"].get("arguments") or "{}")
            except ValueError:
                arguments = {"arguments": call["function"].get("arguments")}
            blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                           "input": arguments if isinstance(arguments, dict) else {"value": arguments}})
        return {"role": "assistant", "content": blocks or [{"type": "text", "text": "…"}]}
    text = content if isinstance(content, str) else blocks_to_text(content)
    return {"role": "user", "content": [{"type": "text", "text": text or "…"}]}


def with_marker(text: str, marker: str) -> str | None:
    """A message's JSON with a cache marker on its last block that takes one, every other byte as it was; None
    when none does (string content, thinking only)."""
    try:
        _, spans, _ = object_members(text)
        start = spans["content"][0]
        if text[start] != "[":
            return None
        blocks, values, _ = array_elements(text, start)
    except (JsonTextError, KeyError, ValueError):
        return None
    for (begin, finish), block in zip(reversed(blocks), reversed(values), strict=True):
        if block.get("type") in NO_MARKER_BLOCKS or (block.get("type") == "text" and not block.get("text")):
            continue
        inside = text[begin:finish].rstrip()
        return text[:begin] + inside[:-1] + ',"cache_control":' + marker + "}" + text[finish:]
    return None


class StreamRecorder(Recorder):
    """An answer from ``message_start``, ``content_block_*``, ``message_delta``, ``message_stop`` events."""

    def __init__(self) -> None:
        self._events = EventReader()
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, str] = {}
        self._usage: dict[str, Any] = {}
        self._done = False

    def feed(self, data: bytes) -> None:
        for name, event in json_events(self._events, data):
            if name == "message_start":
                self._usage.update((event.get("message") or {}).get("usage") or {})
            elif name == "content_block_start":
                self._blocks[event.get("index", len(self._blocks))] = dict(event.get("content_block") or {})
            elif name == "content_block_delta":
                self._delta(event.get("index", 0), event.get("delta") or {})
            elif name == "content_block_stop":
                index = event.get("index", 0)
                if index in self._json and index in self._blocks:
                    try:
                        self._blocks[index]["input"] = json.loads(self._json.pop(index) or "{}")
                    except ValueError:
                        self._blocks[index]["input"] = {}
            elif name == "message_delta":
                self._usage.update({k: v for k, v in (event.get("usage") or {}).items() if v is not None})
            elif name == "message_stop":
                self._done = True

    def _delta(self, index: int, delta: dict[str, Any]) -> None:
        block = self._blocks.setdefault(index, {"type": "text", "text": ""})
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + str(delta.get("text", ""))
        elif kind == "input_json_delta":
            self._json[index] = self._json.get(index, "") + str(delta.get("partial_json", ""))
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
        elif kind == "signature_delta":
            block["signature"] = delta.get("signature")
        elif kind == "citations_delta":
            block.setdefault("citations", []).append(delta.get("citation"))

    def finish(self) -> Recorded | None:
        if not self._done:
            return None
        blocks = [self._blocks[index] for index in sorted(self._blocks)]
        return _recorded({"role": "assistant", "content": blocks}, None, self._usage)


class MessageRecorder(BodyRecorder):
    """An answer from a plain JSON response: its ``content`` kept as the provider wrote it."""

    def answer(self, text: str) -> Recorded | None:
        values, spans, _ = object_members(text)
        if values.get("type") != "message" or not isinstance(values.get("content"), list):
            return None
        start, end = spans["content"]
        message = {"role": "assistant", "content": values["content"]}
        return _recorded(message, '{"role":"assistant","content":' + text[start:end] + "}", values.get("usage") or {})


def _recorded(message: dict[str, Any], text: str | None, usage: dict[str, Any]) -> Recorded:
    def count(key: str) -> int | None:
        value = usage.get(key)
        return value if isinstance(value, int) else None

    unit = Unit((text or compact(message),), (message,))
    return Recorded(unit, count("input_tokens"), count("output_tokens"), count("cache_read_input_tokens"),
                    count("cache_creation_input_tokens"))
