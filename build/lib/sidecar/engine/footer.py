"""What code, not the summarizer, carries into every summary: the files read and modified, the standing rules."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from sidecar.engine.compaction_plan import Node
from sidecar.engine.files import files_touched, footer_files, render_footer
from sidecar.engine.rules import carry, render_rules, rule_sentences


def carried_footer(members: Sequence[Node], summary: Callable[[str], tuple[str, list[str], list[str]]],
                   raws: Mapping[int, str], texts: Mapping[int, str]) -> tuple[str, list[str], list[str]]:
    """(footer, rules, rules left out) of a summary replacing ``members``, their own footers included.

    ``summary`` gives a member summary's (content, rules, rules left out); ``raws`` the verbatim JSON of
    member messages with tool calls, ``texts`` the text of the others, by position.
    """
    read: list[str] = []
    modified: list[str] = []
    rules: list[str] = []
    left_out: list[str] = []
    for node in members:
        if node.kind == "summary":
            content, carried, dropped = summary(node.ref_id)
            old_read, old_modified = footer_files(content)
            read += old_read
            modified += old_modified
            rules += carried
            left_out += dropped
        elif node.tool_call_ids and node.position in raws:
            new_read, new_modified = files_touched([json.loads(raws[node.position])])
            read += new_read
            modified += new_modified
        elif node.role in ("user", "system"):
            rules += rule_sentences(texts[node.position])
    kept, left_out = carry(rules, left_out)
    footer = "\n".join(part for part in (render_footer(read, modified), render_rules(kept)) if part)
    return footer, kept, left_out


@attrs.frozen
class Standing:
    """What every summary of a whole session would carry: its standing rules and the files it touched."""

    rules: list[str]
    rules_left_out: list[str]
    read: list[str]
    """Files read and not modified, most recent first."""
    modified: list[str]
    """Files modified, most recent first."""


def session_standing(messages: Iterable[tuple[dict[str, Any], str]]) -> Standing:
    """The standing rules and files of ``(message, text)`` pairs in order, as the footers would carry them.

    Rules come from the user and system messages a person or a system prompt wrote, not from context an agent
    added itself (metadata ``injected`` or ``isMeta``: environment notes, attachments, hook output).
    """
    rules: list[str] = []
    calls: list[dict[str, Any]] = []
    for message, text in messages:
        if message.get("tool_calls"):
            calls.append(message)
        elif message.get("role") in ("user", "system") and not _injected(message):
            rules += rule_sentences(text)
    kept, left_out = carry(rules)
    read, modified = files_touched(reversed(calls))
    changed = set(modified)
    return Standing(kept, left_out, [path for path in read if path not in changed], modified)


def _injected(message: dict[str, Any]) -> bool:
    metadata = message.get("metadata")
    return isinstance(metadata, dict) and bool(metadata.get("injected") or metadata.get("isMeta"))
