"""A ``Reply`` in Anthropic Messages' shapes: the message JSON, its SSE events, errors."""

from __future__ import annotations

import json
from typing import Any

from sidecar.testing.replies import Event, Reply, Usage, fake_signature, halves, new_id

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
               403: "permission_error", 404: "not_found_error", 408: "timeout_error", 413: "request_too_large",
               429: "rate_limit_error", 500: "api_error", 504: "timeout_error", 529: "overloaded_error"}


def error_body(status: int, message: str, kind: str | None = None) -> dict[str, Any]:
    """Anthropic's error body for this status."""
    kind = kind or ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": new_id("req_")}


def usage_json(usage: Usage, output: int | None = None) -> dict[str, Any]:
    """The ``usage`` object of a message."""
    return {"input_tokens": usage.input, "cache_creation_input_tokens": usage.cache_write,
            "cache_read_input_tokens": usage.cache_read,
            "output_tokens": usage.output if output is None else output, "service_tier": "standard"}


def _stop_reason(reply: Reply) -> str:
    if reply.tool_calls:
        return "tool_use"
    return {"stop": "end_turn", "length": "max_tokens"}.get(reply.finish_reason, reply.finish_reason)


def _blocks(reply: Reply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.thinking is not None:
        blocks.append({"type": "thinking", "thinking": reply.thinking,
                       "signature": reply.signature or fake_signature(reply.thinking)})
    if reply.answer or not reply.tool_calls:
        blocks.append({"type": "text", "text": reply.answer})
    for call in reply.calls:
        blocks.append({"type": "tool_use", "id": call.id or new_id("toolu_"), "name": call.name,
                       "input": _parsed(call.arguments), "_json": call.arguments_json})
    return blocks


def message(reply: Reply, body: dict[str, Any], usage: Usage) -> dict[str, Any]:
    """The non-streamed answer."""
    content = [{k: v for k, v in b.items() if k != "_json"} for b in _blocks(reply)]
    return {"id": new_id("msg_"), "type": "message", "role": "assistant", "model": _model(body),
            "content": content, "stop_reason": _stop_reason(reply), "stop_sequence": None,
            "usage": usage_json(usage)}


def events(reply: Reply, body: dict[str, Any], usage: Usage) -> list[Event]:
    """The streamed answer, event by event, as Anthropic sends it."""
    start: dict[str, Any] = {"id": new_id("msg_"), "type": "message", "role": "assistant", "model": _model(body),
                             "content": [], "stop_reason": None, "stop_sequence": None,
                             "usage": usage_json(usage, output=1)}
    out = [Event("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(_blocks(reply)):
        kind = block["type"]
        opening = {"thinking": {"type": "thinking", "thinking": "", "signature": ""},
                   "text": {"type": "text", "text": ""},
                   "tool_use": {"type": "tool_use", "id": block.get("id"), "name": block.get("name"), "input": {}}}
        out.append(Event("content_block_start", {"type": "content_block_start", "index": index,
                                                 "content_block": opening[kind]}))
        if index == 0:
            out.append(Event("ping", {"type": "ping"}))
        if kind == "thinking":
            deltas = [{"type": "thinking_delta", "thinking": p} for p in halves(block["thinking"])]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        elif kind == "text":
            deltas = [{"type": "text_delta", "text": p} for p in reply.pieces()]
        else:
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in ["", *halves(block["_json"])]]
        out.extend(Event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d},
                         delta=True) for d in deltas)
        if reply.malformed and kind == "text":
            out.append(Event("content_block_delta", '{"type": "content_block_delta", "index": '))
        out.append(Event("content_block_stop", {"type": "content_block_stop", "index": index}))
    if reply.stream_error is not None:
        kind = reply.error_type or "overloaded_error"
        out.append(Event("error", {"type": "error", "error": {"type": kind, "message": reply.stream_error}}))
        return out
    out.append(Event("message_delta", {"type": "message_delta",
                                       "delta": {"stop_reason": _stop_reason(reply), "stop_sequence": None},
                                       "usage": usage_json(usage)}))
    out.append(Event("message_stop", {"type": "message_stop"}))
    return out


def count_tokens(prompt_tokens: int) -> dict[str, Any]:
    """The answer to ``count_tokens``."""
    return {"input_tokens": prompt_tokens}


def models(names: tuple[str, ...]) -> dict[str, Any]:
    """``GET /v1/models`` in Anthropic's shape."""
    data = [{"type": "model", "id": m, "display_name": m, "created_at": "2025-01-01T00:00:00Z"} for m in names]
    return {"data": data, "has_more": False, "first_id": names[0] if names else None,
            "last_id": names[-1] if names else None}


def _parsed(arguments: object) -> object:
    """Arguments given as JSON text, parsed (kept as text when they are not JSON)."""
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _model(body: dict[str, Any]) -> str:
    return str(body.get("model") or "fake-model")
