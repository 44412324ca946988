"""Parser for pi coding agent session files (~/.pi/agent/sessions/*/*.jsonl, versions 1 to 3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sidecar.importers.common import (
    AgentCompaction,
    ParsedTranscript,
    base_metadata,
    blocks_to_text,
    image_part,
    iter_json_lines,
    parsed,
    parts_content,
    reasoning_text,
    stable_id,
    text_content,
    tool_call,
)

SOURCE = "pi"
# Entries that never carry conversation text (pi's buildSessionContext ignores them too).
_SILENT_TYPES = {
    "model_change",
    "thinking_level_change",
    "compaction",
    "custom",
    "label",
    "session_info",
    "context_transform",
    "ephemeral",
}
_MESSAGE_TYPES = {"message", "custom_message", "branch_summary"}
SIDECAR_COMPACTION = "context-sidecar"
"""``details.source`` of the compactions pi records for the sidecar's pi extension (editors/pi): the sidecar's own
summaries, already in the session, so not an agent's compaction to record."""
# pi's own wrapper for branch summaries, so the imported text reads as pi sent it.
_BRANCH_PREFIX = (
    "The following is a summary of a branch that this conversation came back from:\n\n<summary>\n"
)
_BRANCH_SUFFIX = "</summary>"

Entry = tuple[int, str, dict[str, Any]]


def parse(path: Path, follow: bool = False) -> ParsedTranscript:
    """Parse a pi session JSONL file."""
    skipped: list[str] = []
    lines: dict[int, str] = {}
    header: dict[str, Any] | None = None
    context_lines: list[int] = []
    entries: list[Entry] = []
    for lineno, raw, obj in iter_json_lines(path, skipped, lines, follow):
        kind = obj.get("type")
        if kind == "session":
            if header is None:
                header = obj
                context_lines.append(lineno)
            continue
        if not isinstance(kind, str):
            skipped.append(f"line {lineno}: entry without a type")
            continue
        entries.append((lineno, raw, obj))
    entries = _active_branch(entries, header, skipped)

    session = _session_facts(header)
    messages: list[dict[str, Any]] = []
    compactions: list[AgentCompaction] = []
    incomplete = False
    lines_of = {obj.get("id"): lineno for lineno, _, obj in entries}
    for lineno, raw, obj in entries:
        kind = obj["type"]
        _note_session_fact(session, obj)
        if kind == "compaction" and isinstance(obj.get("summary"), str) and obj["summary"].strip() \
                and not _from_sidecar(obj):
            kept = obj.get("firstKeptEntryId")
            incomplete = incomplete or (isinstance(kept, str) and kept not in lines_of)
            compactions.append(AgentCompaction(id=obj.get("id") or stable_id(SOURCE, lineno, raw),
                                               summary=obj["summary"].strip(), line=lineno,
                                               kept_from=lines_of.get(kept) if isinstance(kept, str) else None))
            continue
        if kind in _SILENT_TYPES:
            continue  # Settings changes pi never sends to the model; read into the session facts above.
        if kind not in _MESSAGE_TYPES:
            skipped.append(f"line {lineno}: unknown entry type {kind!r}")
            continue
        msg = _convert(lineno, raw, obj, skipped)
        if msg is not None:
            msg["_lines"] = [lineno]
            messages.append(msg)
    suggested = header.get("id") if header and isinstance(header.get("id"), str) else None
    return parsed(SOURCE, messages, skipped, lines, compactions, session=_tidy_session(session),
                  suggested_session_id=suggested, incomplete=incomplete, context_lines=context_lines)


def _from_sidecar(entry: dict[str, Any]) -> bool:
    """True for a compaction the sidecar made through pi's extension."""
    details = entry.get("details")
    return isinstance(details, dict) and details.get("source") == SIDECAR_COMPACTION


def _active_branch(entries: list[Entry], header: dict[str, Any] | None, skipped: list[str]) -> list[Entry]:
    """Entries on the path from the last entry back to the root (v2+ files form a tree)."""
    version = header.get("version") if header else None
    tree = (isinstance(version, int) and version >= 2) or any("parentId" in obj for _, _, obj in entries)
    if not tree:
        return entries
    by_id: dict[str, Entry] = {}
    kept: list[Entry] = []
    for entry in entries:
        entry_id = entry[2].get("id")
        if not isinstance(entry_id, str) or not entry_id:
            skipped.append(f"line {entry[0]}: entry without an id in a tree-structured session")
            continue
        by_id.setdefault(entry_id, entry)
        kept.append(entry)
    if not kept:
        return []
    on_path: set[int] = set()
    current: Entry | None = kept[-1]
    while current is not None and current[0] not in on_path:
        on_path.add(current[0])
        parent = current[2].get("parentId")
        current = by_id.get(parent) if isinstance(parent, str) else None
    for lineno, _, obj in kept:
        if lineno not in on_path and obj["type"] in _MESSAGE_TYPES:
            skipped.append(f"line {lineno}: on an abandoned branch (not on the path to the last entry)")
    return [entry for entry in kept if entry[0] in on_path]


def _convert(lineno: int, raw: str, obj: dict[str, Any], skipped: list[str]) -> dict[str, Any] | None:
    """One pi entry as an OpenAI message, or None when it holds nothing to import."""
    entry_id = obj.get("id") if isinstance(obj.get("id"), str) and obj.get("id") else None
    msg_id = entry_id or stable_id(SOURCE, lineno, raw)
    where = f"line {lineno}"
    kind = obj["type"]
    if kind == "custom_message":
        return _user(
            msg_id, where, obj.get("content"), obj.get("timestamp"), customType=obj.get("customType")
        )
    if kind == "branch_summary":
        summary = obj.get("summary")
        if not isinstance(summary, str) or not summary:
            return None
        return _user(msg_id, where, _BRANCH_PREFIX + summary + _BRANCH_SUFFIX, obj.get("timestamp"))
    message = obj.get("message")
    if not isinstance(message, dict):
        skipped.append(f"{where}: message entry without a message object")
        return None
    role = message.get("role")
    timestamp = obj.get("timestamp") or message.get("timestamp")
    if role in ("user", "custom", "hookMessage") and not isinstance(message.get("content"), str | list):
        skipped.append(f"{where}: {role} message without content")
        return None
    if role == "user":
        return _user(msg_id, where, message.get("content"), timestamp)
    if role in ("custom", "hookMessage"):
        return _user(msg_id, where, message.get("content"), timestamp, customType=message.get("customType"))
    if role == "assistant":
        return _assistant(msg_id, where, message, timestamp, skipped)
    if role == "toolResult":
        return _tool_result(msg_id, where, message, timestamp, skipped)
    if role == "bashExecution":
        if message.get("excludeFromContext"):
            return None
        return _user(msg_id, where, _bash_text(message), timestamp, bashExecution=True)
    if role in ("branchSummary", "compactionSummary"):
        # Written only by pi's context builder, never to a file; the real entries are handled above.
        return None
    skipped.append(f"{where}: unknown message role {role!r}")
    return None


def _user(msg_id: str, where: str, content: Any, timestamp: Any, **facts: Any) -> dict[str, Any] | None:
    """A user message from pi content (string or text/image blocks)."""
    if isinstance(content, str):
        parts = [{"type": "text", "text": content}]
    elif isinstance(content, list):
        parts = [_block_part(b) for b in content if isinstance(b, dict)]
    else:
        return None
    body = parts_content(parts)
    if body is None:
        return None
    return {
        "role": "user",
        "content": body,
        "id": msg_id,
        "metadata": base_metadata(SOURCE, timestamp, **facts),
        "_where": where,
    }


def _assistant(
    msg_id: str, where: str, message: dict[str, Any], timestamp: Any, skipped: list[str]
) -> dict[str, Any] | None:
    """An assistant message: text kept, thinking as ``reasoning``, toolCall blocks as tool_calls."""
    content = message.get("content")
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if not isinstance(content, list):
        skipped.append(f"{where}: assistant message without content")
        return None
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            thinking.append(block["thinking"])
        elif kind == "toolCall":
            if isinstance(block.get("id"), str) and block["id"] and isinstance(block.get("name"), str):
                calls.append(tool_call(block["id"], block["name"], block.get("arguments")))
            else:
                skipped.append(f"{where}: tool call without an id or name dropped")
    msg: dict[str, Any] = {"role": "assistant", "content": text_content(texts), "id": msg_id}
    if calls:
        msg["tool_calls"] = calls
    reasoning = reasoning_text(thinking)
    if reasoning:
        msg["reasoning"] = reasoning
    error = message.get("errorMessage")
    msg["metadata"] = base_metadata(
        SOURCE,
        timestamp,
        model=message.get("model"),
        provider=message.get("provider"),
        usage=_usage(message.get("usage")),
        stopReason=message.get("stopReason"),
        errorMessage=error[:200] if isinstance(error, str) else None,
    )
    msg["_where"] = where
    return msg


def _tool_result(
    msg_id: str, where: str, message: dict[str, Any], timestamp: Any, skipped: list[str]
) -> dict[str, Any] | None:
    """A toolResult message as an OpenAI tool message."""
    call_id = message.get("toolCallId")
    if not isinstance(call_id, str) or not call_id:
        skipped.append(f"{where}: tool result without a toolCallId")
        return None
    return {
        "role": "tool",
        "tool_call_id": call_id,
        "content": blocks_to_text(message.get("content")),
        "id": msg_id,
        "metadata": base_metadata(
            SOURCE, timestamp, toolName=message.get("toolName"), isError=bool(message.get("isError"))
        ),
        "_where": where,
    }


def _block_part(block: dict[str, Any]) -> dict[str, Any]:
    """A user content block as an OpenAI part: text, or an image part from pi's base64 data."""
    if block.get("type") == "text" and isinstance(block.get("text"), str):
        return {"type": "text", "text": block["text"]}
    if block.get("type") == "image":
        return image_part(block.get("mimeType"), block.get("data")) or {"type": "text", "text": "[image]"}
    return {"type": "text", "text": ""}


def _bash_text(message: dict[str, Any]) -> str:
    """A user-run bash command rendered the way pi shows it to the model."""
    text = f"Ran `{message.get('command', '')}`\n"
    output = message.get("output")
    text += f"```\n{output}\n```" if output else "(no output)"
    if message.get("cancelled"):
        text += "\n\n(command cancelled)"
    elif isinstance(message.get("exitCode"), int) and message["exitCode"] != 0:
        text += f"\n\nCommand exited with code {message['exitCode']}"
    return text


def _usage(usage: Any) -> dict[str, int] | None:
    """Provider token usage reduced to input, output, cacheRead, cacheWrite."""
    if not isinstance(usage, dict):
        return None
    keys = ("input", "output", "cacheRead", "cacheWrite")
    return {k: usage[k] for k in keys if isinstance(usage.get(k), int)} or None


def _session_facts(header: dict[str, Any] | None) -> dict[str, Any]:
    """Session facts from the header line."""
    session: dict[str, Any] = {"metadata": {}}
    if not header:
        return session
    meta = session["metadata"]
    for key, out in (("cwd", "cwd"), ("id", "sourceSessionId"), ("provider", "provider")):
        if isinstance(header.get(key), str) and header[key]:
            meta[out] = header[key]
    for key in ("parentSession", "branchedFrom"):
        if isinstance(header.get(key), str) and header[key]:
            meta["parentSession"] = header[key]
    if isinstance(header.get("thinkingLevel"), str):
        meta["thinkingLevel"] = header["thinkingLevel"]
    if isinstance(header.get("modelId"), str) and header["modelId"]:
        session["model"] = header["modelId"]
    return session


def _note_session_fact(session: dict[str, Any], obj: dict[str, Any]) -> None:
    """Track the latest model, thinking level and session name along the branch."""
    kind = obj["type"]
    if kind == "model_change" and isinstance(obj.get("modelId"), str):
        session["model"] = obj["modelId"]
        if isinstance(obj.get("provider"), str):
            session["metadata"]["provider"] = obj["provider"]
    elif kind == "thinking_level_change" and isinstance(obj.get("thinkingLevel"), str):
        session["metadata"]["thinkingLevel"] = obj["thinkingLevel"]
    elif kind == "session_info" and isinstance(obj.get("name"), str) and obj["name"].strip():
        session["title"] = obj["name"].strip()
    elif kind == "message" and isinstance(obj.get("message"), dict):
        message = obj["message"]
        if message.get("role") == "assistant" and isinstance(message.get("model"), str):
            session["model"] = message["model"]
            if isinstance(message.get("provider"), str):
                session["metadata"]["provider"] = message["provider"]


def _tidy_session(session: dict[str, Any]) -> dict[str, Any]:
    """Drop an empty metadata object so only known keys remain."""
    if not session.get("metadata"):
        session.pop("metadata", None)
    return session
