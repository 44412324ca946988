"""Chat messages: validation on ingest, derived columns, and the OpenAI view of a stored one."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import attrs

from sidecar.assemble_reply import context_item_head
from sidecar.engine.tokens import estimate_message_tokens
from sidecar.wire import ParamsError, dumps, utf8

ROLES = ("system", "user", "assistant", "tool")
OPENAI_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id", "refusal")
"""Fields an assembled message keeps; ``id`` and ``metadata`` travel beside it, in ``items``."""

MAX_ID_LENGTH = 512


@attrs.define(frozen=True)
class MessageRow:
    """A message ready to store: the verbatim JSON and what is derived from it once."""

    id: str | None
    role: str
    raw: str
    text: str
    tool_call_id: str | None
    tool_call_ids: list[str] | None
    tool_name: str | None
    tokens: int
    message_at: datetime | None
    pinned: bool = False


def check_message(message: Any, field: str) -> None:
    """Raise ParamsError naming the field when ``message`` is not a valid chat message."""
    if not isinstance(message, dict):
        raise ParamsError("expected a message object", field)
    role = message.get("role")
    if role not in ROLES:
        raise ParamsError(f"role must be one of {', '.join(ROLES)}, got {role!r}", f"{field}.role")
    _check_content(message, role, field)
    _check_optional_str(message, "name", field)
    if "id" in message:
        msg_id = message["id"]
        if not isinstance(msg_id, str) or not msg_id or len(msg_id) > MAX_ID_LENGTH:
            raise ParamsError(f"id must be a non-empty string of at most {MAX_ID_LENGTH} characters",
                              f"{field}.id")
    if "pinned" in message and not isinstance(message["pinned"], bool):
        raise ParamsError("pinned must be a boolean", f"{field}.pinned")
    if "original" in message and not (isinstance(message["original"], list)
                                      and all(isinstance(line, str) for line in message["original"])):
        raise ParamsError("original must be an array of strings", f"{field}.original")
    if "metadata" in message and message["metadata"] is not None and not isinstance(message["metadata"], dict):
        raise ParamsError("metadata must be an object", f"{field}.metadata")
    if message.get("reasoning") is not None and (role != "assistant" or not isinstance(message["reasoning"], str)):
        raise ParamsError("reasoning must be a string, on an assistant message", f"{field}.reasoning")
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise ParamsError("a tool message needs a non-empty tool_call_id", f"{field}.tool_call_id")
    elif "tool_call_id" in message:
        raise ParamsError("only tool messages carry tool_call_id", f"{field}.tool_call_id")
    if "tool_calls" in message and message["tool_calls"] is not None:
        if role != "assistant":
            raise ParamsError("only assistant messages carry tool_calls", f"{field}.tool_calls")
        _check_tool_calls(message["tool_calls"], f"{field}.tool_calls")


def _check_content(message: dict[str, Any], role: str, field: str) -> None:
    content = message.get("content")
    where = f"{field}.content"
    if content is None:
        if role == "assistant":
            return
        raise ParamsError(f"a {role} message needs content", where)
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise ParamsError("content must be a string, an array of parts, or null", where)
    for index, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise ParamsError("a content part must be an object with a string type", f"{where}[{index}]")
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise ParamsError("a text part needs a string text", f"{where}[{index}].text")


def _check_tool_calls(calls: Any, where: str) -> None:
    if not isinstance(calls, list):
        raise ParamsError("tool_calls must be an array", where)
    seen: set[str] = set()
    for index, call in enumerate(calls):
        at = f"{where}[{index}]"
        if not isinstance(call, dict):
            raise ParamsError("a tool call must be an object", at)
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            raise ParamsError("a tool call needs a non-empty string id", f"{at}.id")
        if call_id in seen:
            raise ParamsError(f"tool call id {call_id!r} appears twice", f"{at}.id")
        seen.add(call_id)
        function = call.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ParamsError("a tool call needs function.name", f"{at}.function.name")
        if not isinstance(function.get("arguments", ""), str):
            raise ParamsError("function.arguments must be a JSON string", f"{at}.function.arguments")


def _check_optional_str(message: dict[str, Any], key: str, field: str) -> None:
    if key in message and message[key] is not None and not isinstance(message[key], str):
        raise ParamsError(f"{key} must be a string", f"{field}.{key}")


def message_row(message: dict[str, Any], max_tokens_per_part: int, tool_names: dict[str, str]) -> MessageRow:
    """Derive the stored columns of a checked message; ``tool_names`` maps call ids to tool names."""
    calls = message.get("tool_calls") or []
    call_ids = [call["id"] for call in calls] or None
    call_id = message.get("tool_call_id")
    tool_name: str | None
    if calls:
        tool_name = ",".join(call["function"]["name"] for call in calls)
    elif call_id is not None:
        tool_name = tool_names.get(call_id) or (message.get("name") if isinstance(message.get("name"), str) else None)
    else:
        tool_name = None
    pinned = message.get("pinned") is True
    if "pinned" in message or "original" in message:
        # A flag of the stored row (memory/pin changes it) and the provider's own JSON (stored beside the message,
        # as an import's lines are), not parts of the verbatim message.
        message = {key: value for key, value in message.items() if key not in ("pinned", "original")}
    return MessageRow(
        id=message.get("id"),
        role=message["role"],
        raw=json.dumps(message, ensure_ascii=False, separators=(",", ":")),
        text=message_text(message),
        tool_call_id=call_id,
        tool_call_ids=call_ids,
        tool_name=tool_name,
        tokens=estimate_message_tokens(message, max_tokens_per_part),
        message_at=_timestamp((message.get("metadata") or {}).get("timestamp")),
        pinned=pinned,
    )


def message_text(message: dict[str, Any]) -> str:
    """The searchable text of a message: content text, tool calls and their arguments."""
    pieces: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        pieces.append(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part.get("text"), str):
                pieces.append(part["text"])
            elif part.get("type") != "text":
                pieces.append(f"[{part.get('type')}]")
    for call in message.get("tool_calls") or ():
        function = call["function"]
        pieces.append(f"{function['name']}({function.get('arguments', '')})")
    if isinstance(message.get("reasoning"), str):
        pieces.append(message["reasoning"])  # searchable, though not sent unless asked for
    return "\n".join(pieces)


def openai_view(raw: str, reasoning: bool = False) -> dict[str, Any]:
    """The stored message with only the fields an OpenAI-compatible API accepts (and its reasoning, if asked)."""
    message = json.loads(raw)
    view = {key: message[key] for key in OPENAI_FIELDS if key in message}
    if reasoning and isinstance(message.get("reasoning"), str):
        view["reasoning"] = message["reasoning"]
    return view


class RenderedMessages:
    """Assembled messages as JSON text, by (position, pruned), bounded by total size.

    Stored messages never change and positions are never reused, so an entry stays true while it is kept.
    Each entry is the message as UTF-8 JSON (bytes join without widening, whatever the characters) and the
    start of its entry in ``items``, up to its token count.
    """

    def __init__(self, max_chars: int = 16 * 1024 * 1024) -> None:
        self._texts: dict[tuple[int, bool], tuple[bytes, str]] = {}
        self._chars = 0
        self.max_chars = max_chars

    def get(self, position: int, pruned: bool) -> tuple[bytes, str] | None:
        """The rendered message and item head, if kept."""
        return self._texts.get((position, pruned))

    def put(self, position: int, pruned: bool, message: bytes, item_head: str) -> tuple[bytes, str]:
        """Keep a rendering, evicting the oldest kept when over the bound; returns it."""
        entry = self._texts[(position, pruned)] = (message, item_head)
        self._chars += len(message) + len(item_head)
        while self._chars > self.max_chars and self._texts:
            old_message, old_head = self._texts.pop(next(iter(self._texts)))
            self._chars -= len(old_message) + len(old_head)
        return entry

    def put_new(self, position: int, message_id: str, raw: str) -> None:
        """Keep the rendering of a message just ingested (never pruned yet), as assemble would make it."""
        self.put(position, False, utf8(dumps(openai_view(raw))), context_item_head("message", message_id))

    def clear(self) -> None:
        """Forget everything."""
        self._texts.clear()
        self._chars = 0


def _timestamp(value: Any) -> datetime | None:
    """A message's own time from metadata: ISO-8601 text or epoch milliseconds."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        seconds = value / 1000 if value > 1e11 else value
        try:
            return datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None)
        except (OverflowError, OSError, ValueError):
            return None
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        if parsed.tzinfo is not None:
            try:
                parsed = parsed.astimezone(UTC).replace(tzinfo=None)
            except OverflowError:
                return None
        return parsed
    return None
