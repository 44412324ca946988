"""A ``Reply`` in OpenAI's shapes: Responses and Chat Completions, JSON and SSE, and OpenAI's error body."""

from __future__ import annotations

import time
from typing import Any

from sidecar.testing.replies import Event, Reply, Usage, estimate, fake_signature, halves, new_id


def error_body(status: int, message: str, kind: str | None = None, code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    """OpenAI's error body."""
    kind = kind or ("server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def models(names: tuple[str, ...]) -> dict[str, Any]:
    """``GET /v1/models`` in OpenAI's shape."""
    return {"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in names]}


# ---- Responses -----------------------------------------------------------------------------------

def responses_usage(usage: Usage, reasoning: int = 0) -> dict[str, Any]:
    """The ``usage`` object of a response; ``input_tokens`` counts cached tokens too."""
    total_input = (usage.input or 0) + usage.cache_read + usage.cache_write
    return {"input_tokens": total_input, "input_tokens_details": {"cached_tokens": usage.cache_read},
            "output_tokens": usage.output, "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": total_input + (usage.output or 0)}


def _items(reply: Reply) -> list[dict[str, Any]]:
    """The response's output items, completed."""
    items: list[dict[str, Any]] = []
    if reply.thinking is not None:
        items.append({"id": new_id("rs_"), "type": "reasoning",
                      "summary": [{"type": "summary_text", "text": reply.thinking}],
                      "encrypted_content": reply.signature or fake_signature(reply.thinking)})
    if reply.answer or not reply.tool_calls:
        items.append({"id": new_id("msg_"), "type": "message", "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": reply.answer}]})
    for call in reply.calls:
        item = {"id": new_id("fc_"), "type": "function_call", "status": "completed",
                "arguments": call.arguments_json, "call_id": call.id or new_id("call_"), "name": call.name}
        if call.namespace:
            item["namespace"] = call.namespace
        items.append(item)
    return items


def _response(body: dict[str, Any], status: str, output: list[dict[str, Any]],
              usage: dict[str, Any] | None, rid: str) -> dict[str, Any]:
    return {"id": rid, "object": "response", "created_at": int(time.time()), "status": status, "error": None,
            "incomplete_details": None, "instructions": body.get("instructions"), "model": _model(body),
            "output": output, "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
            "previous_response_id": body.get("previous_response_id"), "store": bool(body.get("store", False)),
            "tool_choice": body.get("tool_choice", "auto"), "tools": [], "usage": usage, "metadata": {}}


def _finished(reply: Reply, response: dict[str, Any]) -> dict[str, Any]:
    if reply.finish_reason == "length" and not reply.tool_calls:
        return {**response, "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
    return response


def response(reply: Reply, body: dict[str, Any], usage: Usage) -> dict[str, Any]:
    """The non-streamed response."""
    reasoning = estimate(len(reply.thinking or ""))
    return _finished(reply, _response(body, "completed", _items(reply), responses_usage(usage, reasoning),
                                      new_id("resp_")))


def response_events(reply: Reply, body: dict[str, Any], usage: Usage) -> list[Event]:
    """The streamed response, event by event, numbered as the Responses API numbers them."""
    rid = new_id("resp_")
    out: list[Event] = []

    def emit(kind: str, is_delta: bool = False, /, **fields: Any) -> None:
        out.append(Event(kind, {"type": kind, "sequence_number": len(out), **fields}, is_delta))

    emit("response.created", response=_response(body, "in_progress", [], None, rid))
    emit("response.in_progress", response=_response(body, "in_progress", [], None, rid))
    items = _items(reply)
    for index, item in enumerate(items):
        at = {"item_id": item["id"], "output_index": index}
        if item["type"] == "reasoning":
            emit("response.output_item.added", output_index=index, item={**item, "summary": []})
            emit("response.reasoning_summary_part.added", **at, summary_index=0,
                 part={"type": "summary_text", "text": ""})
            for piece in halves(reply.thinking or ""):
                emit("response.reasoning_summary_text.delta", True, **at, summary_index=0, delta=piece)
            emit("response.reasoning_summary_text.done", **at, summary_index=0, text=reply.thinking)
            emit("response.reasoning_summary_part.done", **at, summary_index=0, part=item["summary"][0])
        elif item["type"] == "message":
            emit("response.output_item.added", output_index=index,
                 item={**item, "status": "in_progress", "content": []})
            part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
            emit("response.content_part.added", **at, content_index=0, part=part)
            for piece in reply.pieces():
                emit("response.output_text.delta", True, **at, content_index=0, delta=piece, logprobs=[])
            if reply.malformed:
                out.append(Event("response.output_text.delta", '{"type": "response.output_text.delta", "delta": '))
            emit("response.output_text.done", **at, content_index=0, text=reply.answer, logprobs=[])
            emit("response.content_part.done", **at, content_index=0, part=item["content"][0])
        else:
            emit("response.output_item.added", output_index=index,
                 item={**item, "status": "in_progress", "arguments": ""})
            for piece in halves(item["arguments"]):
                emit("response.function_call_arguments.delta", True, **at, delta=piece)
            emit("response.function_call_arguments.done", **at, name=item["name"], arguments=item["arguments"])
        emit("response.output_item.done", output_index=index, item=item)
    if reply.stream_error is not None:
        failed = {**_response(body, "failed", items, None, rid),
                  "error": {"code": reply.error_type or "server_error", "message": reply.stream_error}}
        emit("response.failed", response=failed)
        return out
    done = _finished(reply, _response(body, "completed", items,
                                      responses_usage(usage, estimate(len(reply.thinking or ""))), rid))
    emit("response.incomplete" if done["status"] == "incomplete" else "response.completed", response=done)
    return out


# ---- Chat Completions ----------------------------------------------------------------------------

def chat_usage(usage: Usage) -> dict[str, Any]:
    """The ``usage`` object of a chat completion; ``prompt_tokens`` counts cached tokens too."""
    prompt = (usage.input or 0) + usage.cache_read + usage.cache_write
    return {"prompt_tokens": prompt, "completion_tokens": usage.output, "total_tokens": prompt + (usage.output or 0),
            "prompt_tokens_details": {"cached_tokens": usage.cache_read}}


def _finish_reason(reply: Reply) -> str:
    return "tool_calls" if reply.tool_calls else reply.finish_reason


def _tool_calls(reply: Reply) -> list[dict[str, Any]]:
    return [{"id": call.id or new_id("call_"), "type": "function",
             "function": {"name": call.name, "arguments": call.arguments_json}} for call in reply.calls]


def _envelope(body: dict[str, Any], kind: str, cid: str) -> dict[str, Any]:
    return {"id": cid, "object": kind, "created": int(time.time()), "model": _model(body),
            "system_fingerprint": None}


def completion(reply: Reply, body: dict[str, Any], usage: Usage) -> dict[str, Any]:
    """The non-streamed chat completion."""
    text = reply.answer
    message: dict[str, Any] = {"role": "assistant", "content": (text or None) if reply.tool_calls else text,
                               "refusal": None}
    if reply.thinking is not None:
        message["reasoning_content"] = reply.thinking
    if reply.tool_calls:
        message["tool_calls"] = _tool_calls(reply)
    return {**_envelope(body, "chat.completion", new_id("chatcmpl-")),
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": _finish_reason(reply)}],
            "usage": chat_usage(usage)}


def completion_events(reply: Reply, body: dict[str, Any], usage: Usage) -> list[Event]:
    """The streamed chat completion, chunk by chunk, tool calls streamed as OpenAI streams them."""
    envelope = _envelope(body, "chat.completion.chunk", new_id("chatcmpl-"))
    out: list[Event] = []

    def chunk(content: dict[str, Any], finish: str | None = None, delta: bool = False) -> None:
        choice = {"index": 0, "delta": content, "logprobs": None, "finish_reason": finish}
        out.append(Event(None, {**envelope, "choices": [choice]}, delta))

    chunk({"role": "assistant", "content": "", "refusal": None})
    for piece in halves(reply.thinking) if reply.thinking else ():
        chunk({"reasoning_content": piece}, delta=True)
    for piece in reply.pieces():
        chunk({"content": piece}, delta=True)
    for index, call in enumerate(_tool_calls(reply)):
        opening = {"index": index, "id": call["id"], "type": "function",
                   "function": {"name": call["function"]["name"], "arguments": ""}}
        chunk({"tool_calls": [opening]})
        for piece in halves(call["function"]["arguments"]):
            chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}, delta=True)
    if reply.stream_error is not None:
        error = error_body(500, reply.stream_error, reply.error_type or "invalid_request_error", "stream_error")
        out.append(Event(None, error))
        return out
    if reply.malformed:
        out.append(Event(None, '{"id": "chatcmpl-broken", "choices": ['))
    chunk({}, _finish_reason(reply))
    if (body.get("stream_options") or {}).get("include_usage"):
        out.append(Event(None, {**envelope, "choices": [], "usage": chat_usage(usage)}))
    out.append(Event(None, "[DONE]"))
    return out


def _model(body: dict[str, Any]) -> str:
    return str(body.get("model") or "fake-model")
