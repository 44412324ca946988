"""Recognise a transcript's format from its first meaningful lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sidecar.importers.common import ImportFormatError

_PROBE_LINES = 50
CODEX_ENVELOPES = {"session_meta", "response_item", "event_msg", "turn_context", "compacted"}
"""Types of the lines of a Codex CLI rollout that wrap their content in ``payload``."""
_CODEX_ITEMS = {
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "local_shell_call",
    "reasoning",
    "web_search_call",
}
_CLAUDE_TYPES = {
    "user",
    "assistant",
    "system",
    "summary",
    "file-history-snapshot",
    "queue-operation",
    "progress",
    "custom-title",
    "ai-title",
    "agent-name",
    "pr-link",
}
_PI_ENTRY_TYPES = {
    "model_change",
    "thinking_level_change",
    "compaction",
    "branch_summary",
    "custom_message",
    "session_info",
    "label",
}
_OPENAI_ROLES = {"system", "developer", "user", "assistant", "tool"}


def detect_format(path: Path) -> str | None:
    """The format name of the file, None when it is empty; ImportFormatError when unknown."""
    first_char = ""
    seen_lines = 0
    # Whole lines, however long: a first prompt with a pasted image can run to megabytes.
    with path.open(encoding="utf-8-sig", errors="replace") as fh:
        for raw in fh:
            line = raw.strip()
            if not line:
                continue
            first_char = first_char or line[0]
            if first_char == "[":
                return "openai"
            seen_lines += 1
            if seen_lines > _PROBE_LINES:
                break
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                continue
            found = classify_line(obj) if isinstance(obj, dict) else None
            if found:
                return found
    if not first_char:
        return None
    if first_char == "{" and _is_wrapped_messages(path):
        return "openai"
    raise ImportFormatError(
        f"cannot tell the transcript format of {path}: its first {min(seen_lines, _PROBE_LINES)} "
        "lines match none of pi, claude-code, codex or openai; pass the format explicitly"
    )


def classify_line(obj: dict[str, Any]) -> str | None:
    """The format one JSON line belongs to, or None when it does not tell."""
    kind = obj.get("type")
    if kind == "session" and ("cwd" in obj or "version" in obj) and "id" in obj:
        return "pi"
    if kind == "message" and isinstance(obj.get("message"), dict) and "uuid" not in obj:
        return "pi"
    if kind in _PI_ENTRY_TYPES and "parentId" in obj:
        return "pi"
    if kind in CODEX_ENVELOPES and isinstance(obj.get("payload"), dict):
        return "codex"
    if kind in _CODEX_ITEMS or obj.get("record_type") == "state":
        return "codex"
    if kind == "message" and "role" in obj and isinstance(obj.get("content"), list):
        return "codex"
    if (
        kind is None
        and isinstance(obj.get("id"), str)
        and "timestamp" in obj
        and ("instructions" in obj or "git" in obj)
    ):
        return "codex"
    if kind in _CLAUDE_TYPES and any(k in obj for k in ("uuid", "sessionId", "leafUuid", "messageId")):
        return "claude-code"
    if kind is None and obj.get("role") in _OPENAI_ROLES:
        return "openai"
    return None


def _is_wrapped_messages(path: Path) -> bool:
    """True when the whole file is one JSON object with a messages list (or a SWE-agent trajectory's history)."""
    try:
        with path.open(encoding="utf-8-sig", errors="replace") as fh:
            obj = json.load(fh)
    except (json.JSONDecodeError, RecursionError):
        return False
    return isinstance(obj, dict) and (isinstance(obj.get("messages"), list) or isinstance(obj.get("history"), list))
