"""Shared pieces of the transcript parsers: result type, line reading, ids, tool-call pairing."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs

NO_RESULT = "[no result recorded]"
ROLES = ("system", "user", "assistant", "tool")


class ImportFormatError(ValueError):
    """The file is not in a transcript format this package can read."""


@attrs.define
class Window:
    """The part of a transcript file to read: the ``prelude`` lines (line number, byte offset), then the lines from
    byte ``offset`` on, numbered from ``line``. Reading fills ``offsets`` with the byte offset of every line read.

    The default is the whole file."""

    offset: int = 0
    line: int = 1
    prelude: list[tuple[int, int]] = attrs.field(factory=list)
    offsets: dict[int, int] = attrs.field(factory=dict)


WINDOW: ContextVar[Window | None] = ContextVar("transcript_window", default=None)
"""Set by ``parse_transcript`` for the parser that runs: the part of the file ``iter_json_lines`` reads."""


@attrs.frozen
class AgentCompaction:
    """A compaction the agent made itself, as its transcript records it."""

    id: str
    """The agent's id of it (Claude Code's boundary uuid, pi's entry id, a stable id of Codex's line)."""
    summary: str
    line: int
    """The line that records it; the messages before it are what it replaced."""
    trigger: str | None = None
    kept_from: int | None = None
    """The first line of the history the agent kept verbatim after the summary (pi's ``firstKeptEntryId``)."""
    preserved: frozenset[str] = frozenset()
    """Messages the agent kept verbatim after the summary (Claude Code's ``preservedMessages``), by entry id."""
    upto: str | None = None
    """The id of the last message it replaced (found by ``parsed``); None when it replaced none of them."""


@attrs.frozen
class ParsedTranscript:
    """A transcript turned into OpenAI Chat Completions messages."""

    format: str
    messages: list[dict[str, Any]] = attrs.field(factory=list)
    skipped: list[str] = attrs.field(factory=list)
    session: dict[str, Any] = attrs.field(factory=dict)
    suggested_session_id: str | None = None
    sources: dict[str, list[str]] = attrs.field(factory=dict)
    """Each message's original transcript lines, verbatim, by message id (stand-ins have none)."""
    lines_read: int = 0
    """JSON lines read, for saying why none counted."""
    compactions: list[AgentCompaction] = attrs.field(factory=list)
    """The agent's own compactions, in the order it made them."""
    spans: dict[str, tuple[int, int]] = attrs.field(factory=dict)
    """Per message id, the first and last line it was converted from (stand-ins have none)."""
    context_lines: list[int] = attrs.field(factory=list)
    """Lines whose state later messages take (pi's session header; Codex's session_meta and turn_context)."""
    incomplete: bool = False
    """Read from a window, the parser needed lines before it (a compaction keeping entries written earlier)."""


def parsed(format: str, messages: list[dict[str, Any]], skipped: list[str], lines: dict[int, str],
           compactions: list[AgentCompaction] | None = None, **facts: Any) -> ParsedTranscript:
    """The result of a parser: messages finalized, each with its original lines, and what each compaction replaced."""
    final = finalize(messages, skipped, format)
    found = [_replaced(compaction, final) for compaction in compactions or ()]
    spans = {m["id"]: (min(m["_lines"]), max(m["_lines"])) for m in final if m.get("_lines")}
    sources = {m["id"]: [lines[n] for n in m.pop("_lines") if n in lines] for m in final if "_lines" in m}
    return ParsedTranscript(format=format, messages=final, skipped=skipped, sources=sources,
                            lines_read=len(lines), compactions=found, spans=spans, **facts)


def _replaced(compaction: AgentCompaction, messages: list[dict[str, Any]]) -> AgentCompaction:
    """The compaction with ``upto``: the last message written before it (and before what it kept) and not kept."""
    end = compaction.line if compaction.kept_from is None else min(compaction.line, compaction.kept_from)
    upto = None
    first = 0
    for message in messages:
        first = min(message["_lines"]) if message.get("_lines") else first  # a stand-in result goes with its call
        if first < end and message["id"].partition("#")[0] not in compaction.preserved:
            upto = message["id"]
    return attrs.evolve(compaction, upto=upto)


def iter_json_lines(path: Path, skipped: list[str], lines: dict[int, str] | None = None,
                    follow: bool = False) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """Yield (line number, raw line, object) for each JSON-object line, reporting the others.

    ``lines`` collects the raw lines read; ``follow`` leaves a last line without its newline unread, as a file
    being written has its last entry half written. Within ``parse_transcript(..., window=...)`` only that window of
    the file is read.
    """
    window = WINDOW.get()
    with path.open("rb") as fh:
        for lineno, offset, data in _numbered(fh, window):
            if follow and not data.endswith(b"\n"):
                return
            if window is not None:
                window.offsets[lineno] = offset
            # A BOM at the start goes; undecodable bytes must not abort a whole import.
            raw = data.decode("utf-8", errors="replace")
            line = (raw.removeprefix("\ufeff") if offset == 0 else raw).strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as exc:
                skipped.append(f"line {lineno}: invalid JSON ({_short(str(exc))})")
                continue
            if not isinstance(obj, dict):
                skipped.append(f"line {lineno}: not a JSON object")
                continue
            if lines is not None:
                lines[lineno] = line
            yield lineno, line, obj


def _numbered(fh: Any, window: Window | None) -> Iterator[tuple[int, int, bytes]]:
    """(line number, byte offset, bytes) of the file's lines, or of the window's."""
    for lineno, offset in window.prelude if window is not None else ():
        if offset < window.offset:  # type: ignore[union-attr]
            fh.seek(offset)
            yield lineno, offset, fh.readline()
    offset = window.offset if window is not None else 0
    fh.seek(offset)
    for lineno, data in enumerate(fh, start=window.line if window is not None else 1):
        yield lineno, offset, data
        offset += len(data)


def resume_line(parsed: ParsedTranscript, roles: tuple[str, ...]) -> tuple[int, list[int]] | None:
    """The last line from which reading the file again (after the prelude lines returned with it) yields what
    reading it whole would, for what follows.

    It starts a message of one of ``roles`` (a prompt, or a response) written after every line of every message
    before it, with no tool call before it unanswered: nothing later changes what came before. The prelude is the
    first and the last of the context lines before it (a session's header; the turn settings in force).
    """
    latest = 0
    found = None
    open_call = False
    for message in parsed.messages:
        facts = message.get("metadata") or {}
        if facts.get("synthetic"):
            open_call = True  # a stand-in: its call's result may come yet
        span = parsed.spans.get(message["id"])
        if span is None:
            continue
        if not open_call and span[0] > latest and message["role"] in roles and not facts.get("injected"):
            found = span[0]
        latest = max(latest, span[1])
    if found is None:
        return None
    before = [line for line in parsed.context_lines if line < found]
    return found, sorted(set(before[:1] + before[-1:]))


def stable_id(source: str, position: int | str, raw: str) -> str:
    """Id for an entry that has none of its own: a hash of where it is and what it says."""
    digest = hashlib.sha256(f"{source}\n{position}\n{raw}".encode()).hexdigest()
    return f"{source}-{digest[:24]}"


def iso_timestamp(value: Any) -> str | None:
    """ISO-8601 string from an ISO string or a Unix time in milliseconds (or seconds)."""
    if isinstance(value, str) and value:
        try:
            datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return value
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        seconds = value / 1000 if value > 1e11 else value
        try:
            moment = datetime.fromtimestamp(seconds, tz=UTC)
        except (OverflowError, OSError, ValueError):
            return None
        return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return None


def base_metadata(source: str, timestamp: Any, **facts: Any) -> dict[str, Any]:
    """Message metadata: source, timestamp when known, and the given facts that are not None."""
    meta: dict[str, Any] = {"source": source}
    ts = iso_timestamp(timestamp)
    if ts:
        meta["timestamp"] = ts
    meta.update({k: v for k, v in facts.items() if v is not None})
    return meta


def text_content(texts: list[str]) -> str | list[dict[str, str]] | None:
    """OpenAI content from text pieces: None, one string, or a list of text parts."""
    texts = [t for t in texts if t]
    if not texts:
        return None
    if len(texts) == 1:
        return texts[0]
    return [{"type": "text", "text": t} for t in texts]


def image_part(media_type: Any, data: Any, url: Any = None) -> dict[str, Any] | None:
    """An OpenAI image part from base64 data and its media type, or from a URL; None when neither is there."""
    if isinstance(url, str) and url:
        return {"type": "image_url", "image_url": {"url": url}}
    if not isinstance(data, str) or not data:
        return None
    kind = media_type if isinstance(media_type, str) and media_type else "image/png"
    return {"type": "image_url", "image_url": {"url": f"data:{kind};base64,{data}"}}


def parts_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]] | None:
    """OpenAI content from text and image parts: text alone as text_content makes it, else the parts."""
    if all(part.get("type") == "text" for part in parts):
        return text_content([part["text"] for part in parts])
    return [part for part in parts if part.get("type") != "text" or part.get("text")]


def reasoning_text(texts: list[str]) -> str | None:
    """A message's ``reasoning`` field: its thinking or reasoning-summary texts, blank-line separated."""
    texts = [t for t in texts if t and t.strip()]
    return "\n\n".join(texts) if texts else None


def blocks_to_text(content: Any) -> str:
    """Flatten tool-result content (string or content blocks) into one string."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, list):
        return json.dumps(content, ensure_ascii=False)
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif not isinstance(block, dict):
            continue
        elif isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif "image" in str(block.get("type", "")):
            parts.append("[image]")
        elif block.get("type"):
            parts.append(f"[{block['type']}]")
    return "\n".join(parts)


def arguments_json(arguments: Any) -> str:
    """Tool-call arguments as the JSON string OpenAI expects."""
    if isinstance(arguments, str):
        return arguments
    if arguments is None:
        return "{}"
    return json.dumps(arguments, ensure_ascii=False)


def tool_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """One assistant tool_calls entry."""
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments_json(arguments)},
    }


def finalize(messages: list[dict[str, Any]], skipped: list[str], source: str) -> list[dict[str, Any]]:
    """Pair tool calls with results, drop (and list) empty assistants, strip private keys, make ids unique."""
    kept = []
    for msg in messages:
        if _is_empty_assistant(msg):
            what = "only reasoning" if msg.get("reasoning") else "no text"
            stop = (msg.get("metadata") or {}).get("stopReason")
            why = f", stop reason {stop!r}" if stop else ""
            skipped.append(f"{msg.get('_where', 'entry')}: assistant message with {what} and no tool call{why} "
                           "(an OpenAI assistant message needs one)")
        else:
            kept.append(msg)
    paired = _pair_tool_calls(kept, skipped, source)
    seen: dict[str, int] = {}
    out: list[dict[str, Any]] = []
    for msg in paired:
        msg.pop("_where", None)
        count = seen.get(msg["id"], 0)
        seen[msg["id"]] = count + 1
        if count:
            msg["id"] = f"{msg['id']}#{count + 1}"
        out.append(msg)
    return out


def _is_empty_assistant(msg: dict[str, Any]) -> bool:
    """True for an assistant message with neither text nor tool calls."""
    return msg["role"] == "assistant" and not msg.get("content") and not msg.get("tool_calls")


def _pair_tool_calls(messages: list[dict[str, Any]], skipped: list[str], source: str) -> list[dict[str, Any]]:
    """Put each tool call's result right after its assistant message; invent missing ones."""
    open_calls: dict[str, list[int]] = {}
    answers: dict[int, dict[str, dict[str, Any]]] = {}
    for index, msg in enumerate(messages):
        if msg["role"] == "assistant" and msg.get("tool_calls"):
            msg["tool_calls"] = _unique_calls(msg, skipped)
            for call in msg["tool_calls"]:
                open_calls.setdefault(call["id"], []).append(index)
        elif msg["role"] == "tool":
            owners = open_calls.get(msg["tool_call_id"])
            if owners:
                answers.setdefault(owners.pop(0), {})[msg["tool_call_id"]] = msg
            else:
                where = msg.get("_where", "entry")
                skipped.append(
                    f"{where}: tool result for call {msg['tool_call_id']!r} has no unanswered tool call"
                )
    out: list[dict[str, Any]] = []
    for index, msg in enumerate(messages):
        if msg["role"] == "tool":
            continue
        out.append(msg)
        for call in msg.get("tool_calls") or []:
            answer = answers.get(index, {}).get(call["id"])
            out.append(answer if answer is not None else _synthetic_result(msg, call, source))
    return out


def _unique_calls(msg: dict[str, Any], skipped: list[str]) -> list[dict[str, Any]]:
    """The message's tool calls with repeated ids removed (and reported)."""
    calls: list[dict[str, Any]] = []
    ids: set[str] = set()
    for call in msg["tool_calls"]:
        if call["id"] in ids:
            skipped.append(f"{msg.get('_where', 'entry')}: repeated tool call id {call['id']!r} dropped")
            continue
        ids.add(call["id"])
        calls.append(call)
    return calls


def _synthetic_result(assistant: dict[str, Any], call: dict[str, Any], source: str) -> dict[str, Any]:
    """Stand-in result for a tool call the transcript never answered (aborted, interrupted)."""
    meta = base_metadata(
        source,
        assistant.get("metadata", {}).get("timestamp"),
        toolName=call["function"]["name"],
        synthetic=True,
    )
    return {
        "role": "tool",
        "tool_call_id": call["id"],
        "content": NO_RESULT,
        "id": f"{assistant['id']}:{call['id']}:no-result",
        "metadata": meta,
    }


def _short(text: str, limit: int = 80) -> str:
    """Text cut to a readable length for a skip reason."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
