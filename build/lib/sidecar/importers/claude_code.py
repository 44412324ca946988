"""Parser for Claude Code project transcripts (~/.claude/projects/<project>/<session>.jsonl)."""

from __future__ import annotations

import bisect
import json
import re
from pathlib import Path
from typing import Any

from sidecar.importers.claude_attachments import attachment_messages
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
    text_content,
    tool_call,
)

SOURCE = "claude-code"
# Entry types that carry no conversation: titles, UI state, progress, timing, undo snapshots, modes.
_HARNESS_TYPES = {
    "summary",
    "system",
    "custom-title",
    "ai-title",
    "agent-name",
    "file-history-snapshot",
    "queue-operation",
    "progress",
    "pr-link",
    "last-prompt",
    "permission-mode",
    "mode",
    "tag",
}
# Server-side tool blocks: the model's own web search, with no client tool call to answer.
_SERVER_BLOCKS = {"server_tool_use", "web_search_tool_result"}

Entry = tuple[int, dict[str, Any]]
# How Claude Code wraps a compaction summary where it writes it down (1.x and 2.x); the PostCompact hook gets it bare.
_COMPACT_PREFACE = re.compile(
    r"^\s*This session is being continued from a previous conversation[^\n]*\n"
    r"(?:(?:The conversation is summarized below|The summary below covers)[^\n]*\n)?\s*(?:Summary:\s*\n)?")
_COMPACT_TRAILER = re.compile(
    r"\n\s*(?:If you need specific details from before compaction|Please continue the conversation from where"
    r"|Continue the conversation from where it left off|Recent messages are preserved verbatim)", re.IGNORECASE)


def parse(path: Path, follow: bool = False) -> ParsedTranscript:
    """Parse a Claude Code transcript JSONL file (a main session, or a subagent's agent-*.jsonl)."""
    skipped: list[str] = []
    lines: dict[int, str] = {}
    nodes: dict[str, Entry] = {}
    conversation: list[Entry] = []
    sidechain: list[Entry] = []
    superseded: set[int] = set()
    titles: dict[str, str] = {}
    summaries: list[tuple[str, str]] = []
    boundaries: dict[str, Entry] = {}
    for lineno, _, obj in iter_json_lines(path, skipped, lines, follow):
        kind = obj.get("type")
        uuid = obj.get("uuid")
        if isinstance(uuid, str) and uuid:
            earlier = nodes.get(uuid)
            if earlier is not None and earlier[1] == obj:
                skipped.append(f"line {lineno}: a verbatim copy of line {earlier[0]} (resumed session)")
                continue
            if earlier is not None:
                superseded.add(earlier[0])  # A retried response can reuse the uuid; the later one is live.
            nodes[uuid] = (lineno, obj)
        if kind in ("user", "assistant", "attachment"):
            body = "attachment" if kind == "attachment" else "message"
            if not isinstance(uuid, str) or not uuid or not isinstance(obj.get(body), dict):
                skipped.append(f"line {lineno}: {kind} entry without a uuid or {body}")
            elif obj.get("isSidechain"):
                sidechain.append((lineno, obj))
            else:
                conversation.append((lineno, obj))
        elif kind == "custom-title" and isinstance(obj.get("customTitle"), str):
            titles["custom"] = obj["customTitle"]
            skipped.append(f"line {lineno}: 'custom-title' entry read as the session title")
        elif kind == "ai-title" and isinstance(obj.get("aiTitle"), str):
            titles["ai"] = obj["aiTitle"]
            skipped.append(f"line {lineno}: 'ai-title' entry read as the session title")
        elif kind == "system" and obj.get("subtype") == "compact_boundary" and isinstance(uuid, str):
            boundaries[uuid] = (lineno, obj)
            skipped.append(f"line {lineno}: Claude Code's compaction boundary (its summary is recorded as a "
                           "compaction)")
        elif kind == "summary" and isinstance(obj.get("summary"), str):
            summaries.append((str(obj.get("leafUuid")), obj["summary"]))
            skipped.append(f"line {lineno}: 'summary' entry (a title Claude Code wrote)")
        elif kind in _HARNESS_TYPES:
            skipped.append(f"line {lineno}: {kind!r} entry (Claude Code's own state, not conversation)")
        else:
            skipped.append(f"line {lineno}: unknown entry type {kind!r}")
    subagent = not conversation and bool(sidechain)
    if subagent:
        conversation = sidechain  # A subagent's own file: every entry is on its sidechain.
    else:
        skipped.extend(f"line {n}: sidechain (subagent) entry; Claude Code 2 keeps those in agent-*.jsonl, "
                       "import that file as its own session" for n, _ in sidechain)
    for lineno, _ in conversation:
        if lineno in superseded:
            skipped.append(f"line {lineno}: superseded by a later entry with the same uuid")
    conversation = [entry for entry in conversation if entry[0] not in superseded]
    conversation = _active_path(conversation, nodes, skipped)
    compactions = [_compaction(lineno, obj, boundaries) for lineno, obj in conversation if obj.get("isCompactSummary")]
    messages = _convert(conversation, skipped)
    # Claude Code has written other sessions' summaries into a file; trust only ones that point here.
    own = [text for leaf, text in summaries if leaf in nodes]
    title = titles.get("custom") or titles.get("ai") or (own[-1] if own else None)
    session = _session(conversation, title)
    suggested = _first(conversation, "sessionId")
    if subagent:
        agent = _first(conversation, "agentId")
        facts = session.setdefault("metadata", {})
        facts.pop("sourceSessionId", None)
        if suggested:
            facts["parentSession"] = suggested  # A subagent's entries carry the session that spawned it.
        if agent:
            facts["agentId"] = agent
        suggested = f"{suggested}:agent-{agent}" if suggested and agent else path.stem
    return parsed(SOURCE, messages, skipped, lines, [c for c in compactions if c is not None], session=session,
                  suggested_session_id=suggested)


def _compaction(lineno: int, obj: dict[str, Any], boundaries: dict[str, Entry]) -> AgentCompaction | None:
    """Claude Code's own compaction from its summary entry and the boundary entry before it."""
    text = summary_text(blocks_to_text(obj["message"].get("content")))
    if not text:
        return None
    boundary = boundaries.get(obj.get("parentUuid") or "")
    line, facts = (boundary[0], boundary[1].get("compactMetadata")) if boundary else (lineno, None)
    facts = facts if isinstance(facts, dict) else {}
    trigger = facts.get("trigger") if facts.get("trigger") in ("manual", "auto") else None
    kept = facts.get("preservedMessages")
    preserved = kept.get("uuids") if isinstance(kept, dict) else None
    return AgentCompaction(id=boundary[1]["uuid"] if boundary else obj["uuid"], summary=text, line=line,
                           trigger=trigger, preserved=frozenset(u for u in preserved or () if isinstance(u, str)))


def summary_text(text: str) -> str:
    """A compaction summary as Claude Code wrote it down, without the preface and the instructions it adds."""
    body = _COMPACT_PREFACE.sub("", text, count=1)
    found = _COMPACT_TRAILER.search(body)
    return (body[:found.start()] if found else body).strip()


def _active_path(conversation: list[Entry], nodes: dict[str, Entry], skipped: list[str]) -> list[Entry]:
    """Conversation entries on the chain ending at the last entry, root first (rewound branches left out)."""
    if not conversation:
        return []
    order = [entry[0] for entry in conversation]
    chain: list[Entry] = []
    seen: set[int] = set()
    scan = len(conversation) - 1
    current: Entry | None = conversation[-1]
    while current is not None:
        seen.add(current[0])
        chain.append(current)
        obj = current[1]
        parent = obj.get("parentUuid") or obj.get("logicalParentUuid")
        following = nodes.get(parent) if isinstance(parent, str) else None
        if following is None or following[0] in seen:
            # A fresh root (resume, compaction) or a link out of the file: the history goes on
            # before it, so carry on from the latest earlier entry rather than drop it all.
            scan = min(scan, bisect.bisect_left(order, current[0]) - 1)
            while scan >= 0 and order[scan] in seen:
                scan -= 1
            following = conversation[scan] if scan >= 0 else None
        current = following
    lines = set(order)
    kept = [entry for entry in reversed(chain) if entry[0] in lines]
    kept_lines = {entry[0] for entry in kept}
    # Claude Code writes each block of one response (thinking, text, every parallel tool_use) as its own entry,
    # chained one after the other, and the conversation goes on from one of them: the others are still on it.
    responses = {_response_id(obj) for _, obj in kept} - {None}
    for entry in conversation:
        if entry[0] not in kept_lines and _response_id(entry[1]) in responses:
            kept.append(entry)
            kept_lines.add(entry[0])
    calls = {call for _, obj in kept for call in _block_ids(obj, "tool_use", "id")}
    answered = {call for _, obj in kept for call in _block_ids(obj, "tool_result", "tool_use_id")}
    for entry in conversation:
        if entry[0] in kept_lines:
            continue
        results = _block_ids(entry[1], "tool_result", "tool_use_id")
        if results and _only_tool_results(entry[1]) and all(r in calls - answered for r in results):
            # Parallel tool results hang off the chain as siblings; they still answer calls on it.
            kept.append(entry)
            answered.update(results)
        else:
            skipped.append(f"line {entry[0]}: on an abandoned branch (rewound or edited)")
    return sorted(kept, key=lambda entry: entry[0])


def _response_id(obj: dict[str, Any]) -> str | None:
    """The API response id of an assistant entry (shared by the entries of one streamed response)."""
    message = obj.get("message")
    if obj.get("type") != "assistant" or not isinstance(message, dict):
        return None
    return message["id"] if isinstance(message.get("id"), str) and message["id"] else None


def _block_ids(obj: dict[str, Any], kind: str, key: str) -> list[str]:
    """The key values of the entry's content blocks of the given type."""
    content = (obj.get("message") or {}).get("content")
    if not isinstance(content, list):
        return []
    return [
        b[key]
        for b in content
        if isinstance(b, dict) and b.get("type") == kind and isinstance(b.get(key), str)
    ]


def _only_tool_results(obj: dict[str, Any]) -> bool:
    """True when every content block of the entry is a tool_result."""
    content = (obj.get("message") or {}).get("content")
    return isinstance(content, list) and all(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )


def _convert(conversation: list[Entry], skipped: list[str]) -> list[dict[str, Any]]:
    """Claude Code entries as OpenAI messages, with streamed assistant pieces merged."""
    messages: list[dict[str, Any]] = []
    assistants: dict[str, dict[str, Any]] = {}
    for lineno, obj in conversation:
        where = f"line {lineno}"
        if obj["type"] == "attachment":
            messages.extend(attachment_messages(obj, lineno, skipped))
            continue
        message = obj["message"]
        if obj["type"] == "assistant":
            if obj.get("isApiErrorMessage") or message.get("model") == "<synthetic>":
                said = _short_text(message.get("content"))
                skipped.append(f"{where}: a notice Claude Code wrote itself (API error or interruption), "
                               f"not model output: {said!r}")
                continue
            key = message.get("id") if isinstance(message.get("id"), str) else obj["uuid"]
            target = assistants.get(key)
            if target is None:
                target = _new_assistant(obj, where)
                assistants[key] = target
                messages.append(target)
            target["_lines"].append(lineno)
            _merge_assistant(target, obj, where, skipped)
        elif obj.get("isCompactSummary") or obj.get("isVisibleInTranscriptOnly"):
            # A compact summary restates history that is imported in full: it is recorded as the compaction it is.
            skipped.append(f"{where}: compaction summary, recorded as Claude Code's own compaction (the history "
                           "it restates is imported)")
        else:
            converted = _user_messages(obj, where, skipped)
            for msg in converted:
                msg["_lines"] = [lineno]
            messages.extend(converted)
    for msg in messages:
        msg.pop("_blocks", None)
        texts = msg.pop("_texts", None)
        thinking = msg.pop("_thinking", None)
        if texts is not None:
            msg["content"] = text_content(texts)
            reasoning = reasoning_text(thinking or [])
            if reasoning:
                msg["reasoning"] = reasoning
    return messages


def _short_text(content: Any) -> str:
    """The first 80 characters of an entry's text."""
    said = " ".join(blocks_to_text(content).split())
    return said if len(said) <= 80 else said[:79] + "…"


def _new_assistant(obj: dict[str, Any], where: str) -> dict[str, Any]:
    """An empty assistant message that streamed pieces are merged into."""
    return {
        "role": "assistant",
        "content": None,
        "id": obj["uuid"],
        "metadata": base_metadata(SOURCE, obj.get("timestamp")),
        "_where": where,
        "_blocks": set(),
        "_texts": [],
        "_thinking": [],
        "_lines": [],
    }


def _merge_assistant(target: dict[str, Any], obj: dict[str, Any], where: str, skipped: list[str]) -> None:
    """Add one entry's content blocks and usage to the assistant message it belongs to."""
    message = obj["message"]
    content = message.get("content")
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        fingerprint = json.dumps(block, sort_keys=True)
        if fingerprint in target["_blocks"]:
            continue  # Older versions repeat the whole message in every streamed entry.
        target["_blocks"].add(fingerprint)
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            target["_texts"].append(block["text"])
        elif kind == "tool_use":
            if isinstance(block.get("id"), str) and isinstance(block.get("name"), str):
                target.setdefault("tool_calls", []).append(
                    tool_call(block["id"], block["name"], block.get("input"))
                )
            else:
                skipped.append(f"{where}: tool_use block without an id or name dropped")
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            target["_thinking"].append(block["thinking"])
        elif kind == "redacted_thinking":
            # Encrypted: nothing readable; the data stays in the original line stored beside the message.
            meta = target["metadata"]
            meta["redactedThinking"] = meta.get("redactedThinking", 0) + 1
        elif kind in _SERVER_BLOCKS:
            meta = target["metadata"]
            meta["serverToolBlocks"] = meta.get("serverToolBlocks", 0) + 1
        else:
            skipped.append(f"{where}: unknown assistant content block {kind!r} dropped")
    meta = target["metadata"]
    if isinstance(message.get("model"), str):
        meta["model"] = message["model"]
    usage = _usage(message.get("usage"))
    if usage:
        meta["usage"] = usage
    if isinstance(message.get("stop_reason"), str):
        meta["stopReason"] = message["stop_reason"]


def _user_messages(obj: dict[str, Any], where: str, skipped: list[str]) -> list[dict[str, Any]]:
    """A user entry as tool messages (one per tool_result) followed by a user message for its text and images."""
    content = obj["message"].get("content")
    facts = {"isMeta": True} if obj.get("isMeta") else {}
    meta = base_metadata(SOURCE, obj.get("timestamp"), **facts)
    if isinstance(content, str):
        return [_user(obj["uuid"], where, content, meta)] if content else []
    if not isinstance(content, list):
        skipped.append(f"{where}: user entry without content")
        return []
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "tool_result":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or not call_id:
                skipped.append(f"{where}: tool_result without a tool_use_id")
                continue
            results.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "content": blocks_to_text(block.get("content")),
                    "metadata": {**meta, "isError": bool(block.get("is_error"))},
                    "_where": where,
                }
            )
        elif kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            source = block["source"] if isinstance(block.get("source"), dict) else {}
            image = image_part(source.get("media_type"), source.get("data"), source.get("url"))
            parts.append(image or {"type": "text", "text": "[image]"})
        elif kind == "document":
            parts.append({"type": "text", "text": "[document]"})
        else:
            skipped.append(f"{where}: unknown user content block {kind!r} dropped")
    body = parts_content(parts)
    out = results + ([_user("", where, body, meta)] if body is not None else [])
    for index, msg in enumerate(out):
        msg["id"] = obj["uuid"] if len(out) == 1 else f"{obj['uuid']}#{index + 1}"
    return out


def _user(msg_id: str, where: str, body: Any, meta: dict[str, Any]) -> dict[str, Any]:
    """A user message."""
    return {"role": "user", "content": body, "id": msg_id, "metadata": dict(meta), "_where": where}


def _usage(usage: Any) -> dict[str, int] | None:
    """Anthropic usage renamed to input, output, cacheRead, cacheWrite."""
    if not isinstance(usage, dict):
        return None
    names = {
        "input_tokens": "input",
        "output_tokens": "output",
        "cache_read_input_tokens": "cacheRead",
        "cache_creation_input_tokens": "cacheWrite",
    }
    return {out: usage[key] for key, out in names.items() if isinstance(usage.get(key), int)} or None


def _first(conversation: list[Entry], key: str) -> str | None:
    """The first non-empty string value of key among the entries."""
    for _, obj in conversation:
        if isinstance(obj.get(key), str) and obj[key]:
            return obj[key]
    return None


def _session(conversation: list[Entry], title: str | None) -> dict[str, Any]:
    """Session facts: title, the last model used, working directory and source ids."""
    session: dict[str, Any] = {}
    if title:
        session["title"] = title
    models = [
        obj["message"].get("model")
        for _, obj in conversation
        if obj["type"] == "assistant" and obj["message"].get("model") not in (None, "<synthetic>")
    ]
    if models and isinstance(models[-1], str):
        session["model"] = models[-1]
    meta = {}
    for key, out in (("cwd", "cwd"), ("sessionId", "sourceSessionId"), ("gitBranch", "gitBranch")):
        value = _first(conversation, key)
        if value:
            meta[out] = value
    version = _first(conversation, "version")
    if version:
        meta["claudeCodeVersion"] = version
    if meta:
        session["metadata"] = meta
    return session
