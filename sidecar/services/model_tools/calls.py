"""``memory/callTool``: run a memory tool call the model made and render the result for it to read.

Bad arguments from the model are answered as a tool result that says what was wrong, so the model can
correct itself; only protocol-level mistakes (params of the wrong type, an unknown session) are errors.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

import attrs

from protocol import errors as codes
from protocol.types import DescribeParams, ExpandParams, GrepMatch, GrepParams
from sidecar.engine.messages import message_text
from sidecar.rows import StoredMessage, SummaryRow, iso
from sidecar.services import memory
from sidecar.services.errors import SidecarError
from sidecar.services.model_tools import definitions as d
from sidecar.services.model_tools.scope import Scope, locate
from sidecar.services.state import Sidecar
from sidecar.summarizers.deterministic import truncate_to_tokens

RESULT_TOKENS = 4000
"""Cap on a grep, describe or query result; expand's is its tokenCap."""
HEADER_TOKENS = 200
"""Room for an expand result's header and source labels beyond the sources' own tokens."""
SNIPPET_CHARS = 240
SEARCHES_SKIPPED = 8
"""Extra matches memory_grep reads per session, so that skipping the model's own searches still fills the limit."""



@attrs.define(frozen=True)
class Answerer:
    """The summarizer's model, for memory_query."""

    complete: Callable[[list[dict[str, str]]], Awaitable[str]]
    """Sends chat messages, returns the answer; raises SummarizerError."""
    window: int
    """The model's context window, which the prompt must fit with room for the answer."""


class ToolArgumentError(Exception):
    """The model's arguments are wrong; the message tells it how."""


def parse_arguments(name: str, arguments: str) -> dict[str, Any]:
    """The model's JSON arguments as an object, checked against the tool's declared properties."""
    if name not in d.NAMES:
        raise ToolArgumentError(f"there is no tool {name!r}; the memory tools are {', '.join(d.NAMES)}.")
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError as error:
        raise ToolArgumentError(f"the arguments of {name} are not valid JSON ({error.msg} at character "
                                f"{error.pos}); send a JSON object such as {_example(name)}.") from None
    if not isinstance(value, dict):
        raise ToolArgumentError(f"the arguments of {name} must be a JSON object such as {_example(name)}.")
    schema = next(t["function"]["parameters"] for t in d.DEFINITIONS if t["function"]["name"] == name)
    unknown = sorted(set(value) - set(schema["properties"]))
    if unknown:
        raise ToolArgumentError(f"{name} has no argument {unknown[0]!r}; its arguments are "
                                f"{', '.join(schema['properties'])}.")
    for key in schema["required"]:
        if key not in value:
            raise ToolArgumentError(f"{name} needs the argument {key!r}, e.g. {_example(name)}.")
    return value


def _example(name: str) -> str:
    return {d.GREP: '{"pattern": "ECONNRESET"}', d.DESCRIBE: '{"id": "sum_…"}',
            d.EXPAND: '{"id": "sum_…", "tokenCap": 4000}', d.QUERY: '{"question": "…"}'}[name]


def model_words(error: SidecarError) -> str:
    """A protocol error about the model's arguments, in the tool's terms."""
    text = str(error.message)
    if error.code == codes.ID_NOT_FOUND:
        return (f"{text.split(' in session ')[0]} in this conversation. Use an id from a <summary> tag or from "
                "memory_grep results.")
    return text


def string_argument(arguments: dict[str, Any], key: str, limit: int) -> str:
    value = arguments.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ToolArgumentError(f"{key!r} must be a non-empty string.")
    if len(value) > limit:
        raise ToolArgumentError(f"{key!r} must be at most {limit} characters.")
    return value


def integer_argument(arguments: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = arguments.get(key, default)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ToolArgumentError(f"{key!r} must be an integer from {low} to {high} (default {default}).")
    if not low <= value <= high:
        raise ToolArgumentError(f"{key!r} must be from {low} to {high} (default {default}); got {value}.")
    return value


def choice_argument(arguments: dict[str, Any], key: str, default: str, choices: Sequence[str]) -> str:
    value = arguments.get(key, default)
    if value not in choices:
        raise ToolArgumentError(f"{key!r} must be one of {', '.join(choices)} (default {default}).")
    return str(value)


def boolean_argument(arguments: dict[str, Any], key: str) -> bool:
    value = arguments.get(key, False)
    if not isinstance(value, bool):
        raise ToolArgumentError(f"{key!r} must be true or false.")
    return value


# Rendering

def span(earliest: datetime | None, latest: datetime | None) -> str:
    """A time range as the model reads it."""
    first, last = iso(earliest), iso(latest)
    if not first:
        return "time unknown"
    return first if first == last else f"{first} to {last}"


def summary_label(row: SummaryRow) -> str:
    """``summary sum_… (leaf, depth 0, 12 messages, <time range>)``."""
    return (f"summary {row.id} ({row.kind}, depth {row.depth}, {row.message_count} messages, "
            f"{span(row.earliest_at, row.latest_at)})")


def message_label(message: StoredMessage, tool: str | None = None) -> str:
    """``message m12 (user, <time>)``."""
    role = f"tool result of {tool}" if tool else message.role
    return f"message {message.id} ({role}, {iso(message.message_at)})"


def stored_text(message: StoredMessage) -> str:
    """A stored message's text: its content and tool calls."""
    return message_text(json.loads(message.raw))


def grep(sidecar: Sidecar, scope: Scope, arguments: dict[str, Any]) -> str:
    """memory_grep rendered: each match with its kind, id, time and what covers it (and its session)."""
    pattern = string_argument(arguments, "pattern", d.PATTERN_MAX_CHARS)
    where = choice_argument(arguments, "scope", "both", ("messages", "summaries", "both"))
    limit = integer_argument(arguments, "limit", d.GREP_DEFAULT_LIMIT, 1, d.GREP_MAX_LIMIT)
    regex = boolean_argument(arguments, "regex")
    found: list[tuple[str, GrepMatch]] = []
    truncated = False
    for session_id in scope.ids:
        need = max(1, limit - len(found))  # once full: does any later session match at all?
        result = memory.grep(sidecar, GrepParams(session_id, pattern, regex=regex, scope=where,  # type: ignore[arg-type]
                                                 limit=need + SEARCHES_SKIPPED))
        matches = _history(sidecar, session_id, result.matches)
        if len(found) >= limit:
            truncated = bool(matches)
        else:
            found += [(session_id, match) for match in matches[:need]]
            truncated = result.truncated or len(matches) > need
        if truncated:
            break
    if scope.workspace is not None and not scope.sessions:
        return empty_workspace(scope, "memory_grep")
    count = len(scope.sessions)
    among = "" if scope.workspace is None else f" in the {count} session{'s' * (count != 1)} of this workspace"
    if not found:
        return note_first(scope, f"memory_grep {json.dumps(pattern)} ({where}): no matches{among}. Try fewer or other "
                                 f"words, scope \"both\", or a regex with alternatives (\"regex\": true).")
    store = sidecar.store()
    more = f"; more exist, raise limit (at most {d.GREP_MAX_LIMIT})" if truncated else ""
    sessions = list(dict.fromkeys(session_id for session_id, _ in found))
    counted = f"{len(found)} match{'es' * (len(found) != 1)}"
    if scope.workspace is None:
        header = f"{counted}, summaries first, then messages newest first{more}."
    else:
        header = (f"{counted} in {len(sessions)} of the {count} sessions of this workspace, the current "
                  f"session first, then earlier ones, most recent first; in each, summaries first, then messages "
                  f"newest first{more}.")
    lines = [f"memory_grep {json.dumps(pattern)} ({where}): {header}"]
    number = 0
    for session_id in sessions:
        matches = [match for owner, match in found if owner == session_id]
        current = scope.workspace is None or scope.sessions[scope.ids.index(session_id)].current
        if scope.workspace is not None:
            lines.append(f"In {scope.label(session_id)}:")
        summary_ids = {m.id for m in matches if m.kind == "summary"} | {m.covered_by for m in matches if m.covered_by}
        summaries = store.summaries(session_id, sorted(summary_ids))
        messages = store.messages_by_id(session_id, [m.id for m in matches if m.kind == "message"])
        for match in matches:
            number += 1
            if match.kind == "summary":
                label = summary_label(summaries[match.id])
            else:
                label = message_label(messages[match.id])
                cover = summaries.get(match.covered_by) if match.covered_by else None
                label += (f", compacted into {cover.id} ({cover.kind}, depth {cover.depth})" if cover
                          else ", in the current context" if current else ", not compacted")
            lines.append(f"{number}. {label}\n   {match.snippet[:SNIPPET_CHARS]}")
    lines.append("Next: memory_expand a message id for its full text, or the summary it was compacted into for "
                 "the messages around it; memory_describe a summary id for its place in the history.")
    return note_first(scope, "\n".join(lines))


def empty_workspace(scope: Scope, tool: str) -> str:
    """The result of a call on a workspace that has no session stored."""
    return f"{tool}: no session of this workspace ({scope.workspace}) is stored yet, so there is nothing to search."


def _history(sidecar: Sidecar, session_id: str, matches: list[GrepMatch]) -> list[GrepMatch]:
    """The matches but the model's own searches: calls of the memory tools and their results.

    The call a model is making always matches its own pattern, and earlier results repeat what they found.
    """
    store = sidecar.store()
    messages = store.messages_by_id(session_id, [m.id for m in matches if m.kind == "message"])
    raws = {message_id: json.loads(message.raw) for message_id, message in messages.items()}
    results = {raw["tool_call_id"]: message_id for message_id, raw in raws.items()
               if raw.get("role") == "tool" and raw.get("tool_call_id")}
    session = sidecar.session(session_id)
    names = store.tool_names(session_id, list(results), session.last_position) if results else {}
    searches = {message_id for call_id, message_id in results.items() if _memory_tool(names.get(call_id, ""))}
    searches |= {message_id for message_id, raw in raws.items()
                 if raw.get("tool_calls") and not message_text({"content": raw.get("content")}).strip()
                 and all(_memory_tool(call["function"]["name"]) for call in raw["tool_calls"])}
    return [match for match in matches if match.id not in searches or match.kind != "message"]


def _memory_tool(name: str) -> bool:
    """A memory tool's name, as an agent names it (``mcp__context-sidecar__memory_grep``, ``memory_grep``)."""
    return any(name == tool or name.endswith("__" + tool) for tool in d.NAMES)


def note_first(scope: Scope, text: str) -> str:
    """A result with the scope's note about the current session, if any, before it."""
    return f"{scope.note}\n{text}" if scope.note else text


def located(sidecar: Sidecar, scope: Scope, item_id: str) -> tuple[str, str]:
    """The session holding ``item_id``, and the line that names it in a workspace's result ('' for one session)."""
    session_id, note = locate(sidecar, scope, item_id)
    if scope.workspace is None:
        return session_id, ""
    return session_id, f"From {scope.label(session_id)}." + (f" {note}" if note else "") + "\n"


def describe(sidecar: Sidecar, scope: Scope, arguments: dict[str, Any]) -> str:
    """memory_describe rendered: the summary's place in the DAG, its sources and its text."""
    item_id = string_argument(arguments, "id", d.ID_MAX_CHARS)
    session_id, origin = located(sidecar, scope, item_id)
    return origin + _describe(sidecar, session_id, item_id)


def _describe(sidecar: Sidecar, session_id: str, item_id: str) -> str:
    found = memory.describe(sidecar, DescribeParams(session_id, item_id))
    above = ", ".join(found.parents) if found.parents else "none (it is in the current context)"
    if found.kind == "message":
        text = message_text(found.content) if isinstance(found.content, dict) else str(found.content)
        return (f"message {found.id} ({found.content.get('role', '?')}, {found.earliest_at}), {found.tokens} tokens; "
                f"summarized by: {above}.\n{text}")
    sources = ", ".join(found.children)
    return (f"summary {found.id}: {found.kind}, depth {found.depth}, {found.message_count} messages from "
            f"{found.earliest_at or '?'} to {found.latest_at or '?'}, {found.tokens} tokens standing for "
            f"{found.source_tokens}.\nAbove it: {above}.\nIts sources, oldest first ({len(found.children)}): "
            f"{sources}.\nText:\n{found.content}\n"
            f"Next: memory_expand {{\"id\": {json.dumps(found.id)}}} to read its sources.")


def expand(sidecar: Sidecar, scope: Scope, arguments: dict[str, Any], cap: int) -> str:
    """memory_expand rendered: each source with its label, within ``cap`` tokens."""
    item_id = string_argument(arguments, "id", d.ID_MAX_CHARS)
    session_id, origin = located(sidecar, scope, item_id)
    return origin + _expand(sidecar, session_id, item_id, cap)


def _expand(sidecar: Sidecar, session_id: str, item_id: str, cap: int) -> str:
    found = memory.expand(sidecar, ExpandParams(session_id, item_id, cap))
    store = sidecar.store()
    if found.kind == "message":
        message = store.message(session_id, found.id)
        assert message is not None  # memory.expand found it
        return f"{message_label(message)}, full text:\n{truncate_to_tokens(stored_text(message), cap)}"
    total = len(store.sources(session_id, found.id))
    summary = store.summaries(session_id, [found.id])[found.id]
    children = store.summaries(session_id, [i.id for i in found.items if i.kind == "summary"])
    messages = store.messages_by_id(session_id, [i.id for i in found.items if i.kind == "message"])
    names = {call["id"]: call["function"]["name"] for m in messages.values()
             for call in json.loads(m.raw).get("tool_calls") or ()}
    more = ""
    if found.truncated:
        more = (f"; tokenCap {cap} reached, {total - len(found.items)} more not shown: memory_expand with a "
                f"larger tokenCap (at most {d.EXPAND_MAX_TOKEN_CAP}), or a source id")
    lines = [f"memory_expand {summary_label(summary)}: {len(found.items)} of {total} sources, oldest first{more}."]
    share = max(64, cap // max(1, len(found.items)))  # the first source alone may exceed the cap
    for item in found.items:
        if item.kind == "summary":
            child = children[item.id]
            lines.append(f"[{summary_label(child)}; memory_expand it for its sources]\n"
                         f"{truncate_to_tokens(child.content, max(share, item.tokens))}")
        else:
            message = messages[item.id]
            tool = names.get(json.loads(message.raw).get("tool_call_id") or "")
            lines.append(f"[{message_label(message, tool)}]\n"
                         f"{truncate_to_tokens(stored_text(message), max(share, min(item.tokens, cap)))}")
    return "\n\n".join(lines)
