"""Parser for plain OpenAI chat messages: a JSON array, {"messages": [...]}, or one message per line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sidecar.importers.common import (
    ROLES,
    ParsedTranscript,
    arguments_json,
    blocks_to_text,
    iso_timestamp,
    iter_json_lines,
    parsed,
    stable_id,
)

SOURCE = "openai"


def parse(path: Path, follow: bool = False) -> ParsedTranscript:
    """Parse an OpenAI messages file (or a SWE-agent trajectory's history), validating each message."""
    skipped: list[str] = []
    with path.open(encoding="utf-8-sig", errors="replace") as fh:
        text = fh.read()
    if not text.strip():
        return ParsedTranscript(format=SOURCE)
    wrapper: dict[str, Any] = {}
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        data = None
    if isinstance(data, dict) and isinstance(data.get("messages"), list):
        wrapper, data = data, data["messages"]
    elif isinstance(data, dict) and isinstance(data.get("history"), list):
        wrapper, data = data, data["history"]  # A SWE-agent .traj file: the model's messages are its history.
    lines: dict[int, str] = {}
    if isinstance(data, list):
        entries = [(f"entry {index}", index, item) for index, item in enumerate(data)]
        lines = {index: json.dumps(item, ensure_ascii=False) for index, item in enumerate(data)}
    elif data is None or isinstance(data, dict):
        # Not one JSON document: read it as JSON Lines, one message per line.
        entries = [(f"line {n}", n, obj) for n, _, obj in iter_json_lines(path, skipped, lines, follow)]
    else:
        skipped.append("file: top-level JSON is neither a list of messages nor {messages: [...]}")
        entries = []
    messages = []
    for where, key, item in entries:
        msg = _validate(where, item, skipped)
        if msg is not None:
            msg["_lines"] = [key]
            messages.append(msg)
    return parsed(SOURCE, messages, skipped, lines, session=_session(wrapper),
                  suggested_session_id=_string(wrapper.get("sessionId")) or _string(wrapper.get("id")))


def _validate(where: str, item: Any, skipped: list[str]) -> dict[str, Any] | None:
    """The message cleaned to OpenAI fields plus id and metadata, or None (reported) if unusable."""
    if not isinstance(item, dict):
        skipped.append(f"{where}: not an object")
        return None
    role = item.get("role")
    if role == "developer":
        role = "system"
    if role not in ROLES:
        skipped.append(f"{where}: role {item.get('role')!r} is not one of {', '.join(ROLES)}")
        return None
    content, problem = _content(item.get("content"), role)
    if problem:
        skipped.append(f"{where}: {problem}")
        return None
    msg: dict[str, Any] = {"role": role, "content": content}
    if isinstance(item.get("name"), str) and item["name"] and role in ("system", "user", "assistant"):
        msg["name"] = item["name"]
    if role == "assistant" and item.get("tool_calls") is not None:
        calls, problem = _tool_calls(item["tool_calls"])
        if problem:
            skipped.append(f"{where}: {problem}")
            return None
        if calls:
            msg["tool_calls"] = calls
    if role == "tool":
        call_id = item.get("tool_call_id")
        ids = item.get("tool_call_ids")
        if not call_id and isinstance(ids, list) and ids and all(isinstance(i, str) and i for i in ids):
            # SWE-agent names the calls a tool message answers in a list (one call per step in practice).
            call_id = ids[0]
            if len(ids) > 1:
                skipped.append(f"{where}: tool message answers {len(ids)} calls; kept as the answer to {ids[0]!r}")
        if not isinstance(call_id, str) or not call_id:
            skipped.append(f"{where}: tool message without a tool_call_id")
            return None
        msg["tool_call_id"] = call_id
    if role == "assistant" and not msg["content"] and not msg.get("tool_calls"):
        skipped.append(f"{where}: assistant message with neither content nor tool_calls")
        return None
    reasoning = item.get("reasoning") or item.get("reasoning_content")
    if role == "assistant" and isinstance(reasoning, str) and reasoning.strip() and reasoning != msg["content"]:
        msg["reasoning"] = reasoning
    msg["id"] = _string(item.get("id")) or _hash_id(where, item)
    msg["metadata"] = _metadata(item)
    msg["_where"] = where
    return msg


def _content(content: Any, role: str) -> tuple[Any, str | None]:
    """Content normalised to a string or text parts; an error text when it cannot be."""
    if role == "tool":
        if isinstance(content, str | list) or content is None:
            return blocks_to_text(content), None
        return None, "tool content must be a string or a list of parts"
    if content is None:
        return (None, None) if role == "assistant" else (None, f"{role} message without content")
    if isinstance(content, str):
        return content, None
    if not isinstance(content, list):
        return None, "content must be a string, a list of parts, or null"
    parts: list[dict[str, Any]] = []
    for part in content:
        if isinstance(part, str):
            parts.append({"type": "text", "text": part})
        elif isinstance(part, dict) and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif isinstance(part, dict) and part.get("type") == "image_url" and isinstance(part.get("image_url"), dict) \
                and isinstance(part["image_url"].get("url"), str) and part["image_url"]["url"]:
            parts.append({"type": "image_url", "image_url": part["image_url"]})
        elif isinstance(part, dict) and "image" in str(part.get("type", "")):
            parts.append({"type": "text", "text": "[image]"})
        elif isinstance(part, dict) and part.get("type") in ("refusal", "input_audio", "file"):
            refusal = part.get("refusal")
            text = refusal if isinstance(refusal, str) else f"[{part['type']}]"
            parts.append({"type": "text", "text": text})
        else:
            return None, f"content part {part!r:.60} not understood"
    return parts, None


def _tool_calls(calls: Any) -> tuple[list[dict[str, Any]], str | None]:
    """Validated tool_calls with arguments as JSON strings."""
    if not isinstance(calls, list):
        return [], "tool_calls must be a list"
    out: list[dict[str, Any]] = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            return [], "tool call without a function object"
        call_id, name = call.get("id"), function.get("name")
        if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
            return [], "tool call without an id or function name"
        arguments = arguments_json(function.get("arguments"))
        out.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
    return out, None


def _metadata(item: dict[str, Any]) -> dict[str, Any]:
    """The message's own metadata, with the source and any timestamp it carries."""
    meta = dict(item["metadata"]) if isinstance(item.get("metadata"), dict) else {}
    meta["source"] = SOURCE
    if "timestamp" not in meta:
        for key in ("timestamp", "created_at", "created"):
            ts = iso_timestamp(item.get(key))
            if ts:
                meta["timestamp"] = ts
                break
    return meta


def _hash_id(where: str, item: dict[str, Any]) -> str:
    """Stable id from the message's position and content."""
    return stable_id(SOURCE, where, json.dumps(item, sort_keys=True, ensure_ascii=False))


def _session(wrapper: dict[str, Any]) -> dict[str, Any]:
    """Session facts given beside the messages, when the file wraps them in an object."""
    session: dict[str, Any] = {}
    for key in ("title", "model"):
        if _string(wrapper.get(key)):
            session[key] = wrapper[key]
    if isinstance(wrapper.get("metadata"), dict) and wrapper["metadata"]:
        session["metadata"] = dict(wrapper["metadata"])
    return session


def _string(value: Any) -> str | None:
    """The value when it is a non-empty string."""
    return value if isinstance(value, str) and value else None
