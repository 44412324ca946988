"""The files a span of history read and modified, from its tool calls: every summary's footer."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

PATH_KEYS = ("path", "file_path", "filePath", "file", "filename", "target_file", "notebook_path")
LIST_KEYS = ("paths", "files", "file_paths")
_MODIFIES = re.compile(r"edit|write|patch|create|replace|insert|apply|delete|remove|rename|move|multi_?edit", re.I)
_READS = re.compile(r"read|view|cat|open|grep|glob|list|ls|search|find|look", re.I)
_SECTION = re.compile(r"<(read-files|modified-files|rules)>\n(.*?)\n?</\1>", re.S)


def files_touched(messages: Iterable[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(read, modified) file paths named by the tool calls of ``messages``, in first-seen order."""
    read: dict[str, None] = {}
    modified: dict[str, None] = {}
    for message in messages:
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            name = str(function.get("name", ""))
            paths = _paths(function.get("arguments"))
            if _MODIFIES.search(name):
                modified.update(dict.fromkeys(paths))
            elif _READS.search(name):
                read.update(dict.fromkeys(paths))
    return list(read), list(modified)


def _paths(arguments: Any) -> list[str]:
    try:
        data = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return []
    if not isinstance(data, dict):
        return []
    found = [data[key] for key in PATH_KEYS if isinstance(data.get(key), str) and data[key].strip()]
    for key in LIST_KEYS:
        if isinstance(data.get(key), list):
            found += [p for p in data[key] if isinstance(p, str) and p.strip()]
    return found


def footer_files(text: str | None) -> tuple[list[str], list[str]]:
    """(read, modified) listed in an earlier footer."""
    sections = {name: [line.strip() for line in body.splitlines() if line.strip()]
                for name, body in _SECTION.findall(text or "")}
    return sections.get("read-files", []), sections.get("modified-files", [])


def strip_footer(text: str) -> str:
    """A summary without its footer (files and rules)."""
    return _SECTION.sub("", text).rstrip()


def render_footer(read: Iterable[str], modified: Iterable[str]) -> str:
    """The footer: files only read, then files modified (a modified file is not listed as read)."""
    modified_list = list(dict.fromkeys(modified))
    read_only = [path for path in dict.fromkeys(read) if path not in set(modified_list)]
    parts = []
    if read_only:
        parts.append("<read-files>\n" + "\n".join(read_only) + "\n</read-files>")
    if modified_list:
        parts.append("<modified-files>\n" + "\n".join(modified_list) + "\n</modified-files>")
    return "\n".join(parts)
