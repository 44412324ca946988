"""Claude Code ``attachment`` entries: the context a user gave (a selection, a file) as user messages."""

from __future__ import annotations

import json
from typing import Any

from sidecar.importers.common import base_metadata, blocks_to_text

SOURCE = "claude-code"
# Attachments that carry what the user gave the model (a selection, a file, a queued prompt); the other
# attachment types are Claude Code's own reminders and listings.
_USER_ATTACHMENTS = {
    "selected_lines_in_ide",
    "selected_lines_in_diff",
    "opened_file_in_ide",
    "file",
    "new_file",
    "directory",
    "edited_text_file",
    "edited_image_file",
    "already_read_file",
    "compact_file_reference",
    "pdf_reference",
    "diagnostics",
    "nested_memory",
    "queued_command",
    "mcp_resource",
    "agent_mention",
    "hook_additional_context",
}


def attachment_messages(obj: dict[str, Any], lineno: int, skipped: list[str]) -> list[dict[str, Any]]:
    """A user-context attachment as a user message; Claude Code's own reminders are listed as skipped."""
    attachment = obj["attachment"]
    kind = attachment.get("type")
    if kind not in _USER_ATTACHMENTS:
        skipped.append(f"line {lineno}: attachment {kind!r} (a reminder or listing Claude Code adds itself)")
        return []
    meta = base_metadata(SOURCE, obj.get("timestamp"), attachment=kind, injected=True)
    msg = {"role": "user", "content": _attachment_text(attachment), "id": obj["uuid"], "metadata": meta,
           "_where": f"line {lineno}", "_lines": [lineno]}
    return [msg]


def _attachment_text(attachment: dict[str, Any]) -> str:
    """The attachment as the text Claude Code shows the model, close enough to search and read."""
    kind = attachment.get("type")
    name = attachment.get("filename") or attachment.get("path") or ""
    content = attachment.get("content")
    if kind in ("selected_lines_in_ide", "selected_lines_in_diff"):
        span = f"lines {attachment.get('lineStart')} to {attachment.get('lineEnd')}"
        return f"The user selected {span} from {name}:\n{blocks_to_text(content)}"
    if kind == "opened_file_in_ide":
        return f"The user opened the file {name} in the IDE."
    if kind == "queued_command" and isinstance(attachment.get("prompt"), str):
        return attachment["prompt"]
    if isinstance(content, str | list):
        return f"[{kind}] {name}\n{blocks_to_text(content)}".strip()
    rest = {k: v for k, v in attachment.items() if k != "type"}
    return f"[{kind}] {json.dumps(rest, ensure_ascii=False)}"
