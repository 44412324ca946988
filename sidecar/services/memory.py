"""The memory/* methods as plain functions: ingest, expand, grep, describe, sessions, deleteSession."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Collection
from typing import Any

from protocol import errors as codes
from protocol.types import (
    DeleteSessionParams,
    DeleteSessionResult,
    DescribeParams,
    DescribeResult,
    ExpandItem,
    ExpandParams,
    ExpandResult,
    GrepMatch,
    GrepParams,
    GrepResult,
    IngestParams,
    IngestResult,
    PinParams,
    PinResult,
    RulesParams,
    RulesResult,
    SessionsResult,
    SessionSummary,
)
from sidecar.config.project import of_workspace, project_of
from sidecar.engine.assembly import is_prunable_output
from sidecar.engine.footer import session_standing
from sidecar.engine.messages import check_message, message_row
from sidecar.engine.rules import footer_rules
from sidecar.rows import StoredMessage, SummaryRow, iso
from sidecar.services.errors import SidecarError, id_not_found, invalid_params
from sidecar.services.state import Sidecar
from sidecar.wire import ParamsError

DEFAULT_TOKEN_CAP = 4000
DEFAULT_GREP_LIMIT = 20
MAX_GREP_LIMIT = 1000
SNIPPET_RADIUS = 80
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
"""Legal in JSON strings, not in UTF-8: DuckDB cannot store them."""

log = logging.getLogger(__name__)


def check_session_id(session_id: str) -> None:
    """-32602 for an empty or oversized session id."""
    if not session_id.strip() or len(session_id) > 512:
        raise invalid_params("sessionId must be a non-empty string of at most 512 characters", "sessionId")


PRERENDER_MAX = 16
"""Ingests of at most this many messages render them for assemble at once; bulk loads do not."""


def ingest(sidecar: Sidecar, params: IngestParams) -> IngestResult:
    """Store a batch of messages, all or none; ids already stored are not stored again."""
    check_session_id(params.session_id)
    for index, message in enumerate(params.messages):
        try:
            check_message(message, f"messages[{index}]")
        except ParamsError as error:
            raise invalid_params(str(error), error.field) from None
    info: dict[str, Any] = {}
    if params.session is not None:
        window = params.session.context_window
        if window is not None and not 0 < window < 2**31:
            raise invalid_params("contextWindow must be a positive integer below 2^31", "session.contextWindow")
        info = {"context_window": window, "model": params.session.model, "title": params.session.title,
                "metadata": params.session.metadata}
    store = sidecar.store()
    existing = store.session(params.session_id)
    if params.after is not None:
        last = store.last_message_id(params.session_id) if existing is not None else None
        if last != (params.after or None):
            raise SidecarError(codes.CONVERSATION_MOVED,
                               f"session {params.session_id!r} has moved on: its newest message is "
                               f"{last!r}, not {params.after or None!r}; nothing was stored", {"lastId": last})
    if sidecar.workspace is not None and (existing is None or existing.workspace is None):
        info["workspace"] = sidecar.workspace
        info["project"] = project_of(sidecar.workspace)
    calls = _tool_names(params.messages)
    names = dict(calls)
    state = sidecar.runtime.of(params.session_id)
    recent = state.recent_calls
    pending = [m["tool_call_id"] for m in params.messages if m["role"] == "tool" and m["tool_call_id"] not in names]
    names.update({call_id: recent[call_id] for call_id in pending if call_id in recent})
    pending = [call_id for call_id in pending if call_id not in names]
    for call_id in pending:  # checked before DuckDB sees them in the lookup below
        if LONE_SURROGATE.search(call_id):
            index = next(i for i, m in enumerate(params.messages) if m.get("tool_call_id") == call_id)
            raise invalid_params("contains invalid Unicode (a lone surrogate)", f"messages[{index}].tool_call_id")
    if pending and existing is not None:
        names.update(store.tool_names(params.session_id, pending, existing.last_position))
    max_part = sidecar.settings.prune.max_tokens_per_part
    rows = [message_row(message, max_part, names) for message in params.messages]
    for index, row in enumerate(rows):
        if not row.raw.isascii() and (found := LONE_SURROGATE.search(row.raw)) is not None:
            raise invalid_params(f"contains invalid Unicode (a lone surrogate at {found.start()})",
                                 f"messages[{index}]")
    rule = sidecar.prune_rule()
    prunable = [is_prunable_output(row.role, row.tokens, row.tool_name, rule) for row in rows]
    warnings = _unanswered_results(params.messages, names.keys() - calls.keys())
    for warning in warnings:
        log.warning("ingest into %s: %s", params.session_id, warning)
    originals = [message.get("original") for message in params.messages]
    ids, duplicates = store.ingest(params.session_id, rows, info, prunable, sidecar.prune_signature(),
                                   originals if any(lines is not None for lines in originals) else None)
    session = sidecar.session(params.session_id)
    if not duplicates and len(rows) <= PRERENDER_MAX and session.last_position is not None:
        # An agent's turn: its next assemble (a delta) then renders nothing and reads no row.
        first = session.last_position - len(rows) + 1
        for offset, (message_id, row) in enumerate(zip(ids, rows, strict=True)):
            sidecar.runtime.rendered.put_new(first + offset, message_id, row.raw)
    # Results usually follow their calls by one ingest: remembering the calls spares a query per result.
    state.remember_calls(calls)
    return IngestResult(ids=ids, duplicates=duplicates, usage=sidecar.usage(session), warnings=warnings or None)


def _unanswered_results(messages: list[dict[str, Any]], stored_calls: Collection[str]) -> list[str]:
    """A warning for each tool result that answers no earlier tool call: assembly leaves such a result out."""
    warnings = []
    calls = set(stored_calls)
    for index, message in enumerate(messages):
        if message["role"] == "tool" and message["tool_call_id"] not in calls:
            warnings.append(f"messages[{index}]: the tool result for {message['tool_call_id']!r} answers no tool "
                            "call before it in this session: it is stored, but left out of every assembled context "
                            "(ingest the assistant message with that call first)")
        calls.update(call["id"] for call in message.get("tool_calls") or ())
    return warnings


def _tool_names(messages: list[dict[str, Any]]) -> dict[str, str]:
    return {call["id"]: call["function"]["name"]
            for message in messages for call in message.get("tool_calls") or ()}


def expand(sidecar: Sidecar, params: ExpandParams) -> ExpandResult:
    """A summary's direct sources in order, or a message's full original content."""
    cap = DEFAULT_TOKEN_CAP if params.token_cap is None else params.token_cap
    if cap <= 0:
        raise invalid_params("tokenCap must be a positive integer", "tokenCap")
    sidecar.session(params.session_id)
    store = sidecar.store()
    summary = store.summary(params.session_id, params.id)
    if summary is None:
        message = store.message(params.session_id, params.id)
        if message is None:
            raise id_not_found(params.session_id, params.id)
        original = store.message_sources(params.session_id, [message.id]).get(message.id)
        item = ExpandItem(kind="message", id=message.id, tokens=message.tokens, message=json.loads(message.raw),
                          original=original)
        return ExpandResult(id=params.id, kind="message", items=[item], truncated=False)
    sources = store.sources(params.session_id, summary.id)
    messages = store.messages_by_id(params.session_id, [i for k, i in sources if k == "message"])
    summaries = store.summaries(params.session_id, [i for k, i in sources if k == "summary"])
    items: list[ExpandItem] = []
    used = 0
    truncated = False
    for kind, source_id in sources:
        item = _expand_item(kind, source_id, messages, summaries)
        if items and used + item.tokens > cap:
            truncated = True
            break
        items.append(item)
        used += item.tokens
    return ExpandResult(id=summary.id, kind=summary.kind, items=items, truncated=truncated)


def _expand_item(kind: str, source_id: str, messages: dict[str, StoredMessage],
                 summaries: dict[str, SummaryRow]) -> ExpandItem:
    if kind == "message":
        message = messages[source_id]
        return ExpandItem(kind="message", id=source_id, tokens=message.tokens, message=json.loads(message.raw))
    child = summaries[source_id]
    return ExpandItem(kind="summary", id=source_id, tokens=child.tokens, summary=child.content)


def grep(sidecar: Sidecar, params: GrepParams) -> GrepResult:
    """Search the whole stored history, compacted or not, newest first."""
    if not params.pattern:
        raise invalid_params("pattern must not be empty", "pattern")
    limit = DEFAULT_GREP_LIMIT if params.limit is None else params.limit
    if not 0 < limit <= MAX_GREP_LIMIT:
        raise invalid_params(f"limit must be between 1 and {MAX_GREP_LIMIT}", "limit")
    sidecar.session(params.session_id)
    store = sidecar.store()
    case_sensitive = bool(params.case_sensitive)
    if params.regex:
        problem = store.check_regex(params.pattern)
        if problem:
            raise invalid_params(f"invalid regular expression: {problem}", "pattern")
    hits = store.search(params.session_id, params.scope or "both", params.pattern, regex=bool(params.regex),
                        case_sensitive=case_sensitive, limit=limit + 1)
    finder = _finder(params.pattern if params.regex else re.escape(params.pattern), case_sensitive)
    covered = store.covering_summaries(params.session_id, [hit.id for hit in hits[:limit] if hit.kind == "message"])
    matches = [GrepMatch(kind=hit.kind, id=hit.id, snippet=snippet(hit.text, finder),
                         covered_by=covered.get(hit.id) if hit.kind == "message" else None)
               for hit in hits[:limit]]
    return GrepResult(matches=matches, truncated=len(hits) > limit)


def _finder(pattern: str, case_sensitive: bool) -> re.Pattern[str] | None:
    try:
        return re.compile(pattern, 0 if case_sensitive else re.IGNORECASE)
    except re.error:
        return None  # RE2 syntax Python lacks; the snippet then starts at the text's beginning.


def snippet(text: str, finder: re.Pattern[str] | None) -> str:
    """About 160 characters of ``text`` around the first match, whitespace folded."""
    match = finder.search(text) if finder else None
    start, end = (match.start(), match.end()) if match else (0, 0)
    lo = max(0, start - SNIPPET_RADIUS)
    hi = min(len(text), max(end, start) + SNIPPET_RADIUS)
    piece = " ".join(text[lo:hi].split())
    return f"{'…' if lo > 0 else ''}{piece}{'…' if hi < len(text) else ''}"


def describe(sidecar: Sidecar, params: DescribeParams) -> DescribeResult:
    """A summary's place in the DAG (or a message's), with its content."""
    sidecar.session(params.session_id)
    store = sidecar.store()
    summary = store.summary(params.session_id, params.id)
    if summary is not None:
        sources = store.sources(params.session_id, summary.id)
        return DescribeResult(
            id=summary.id, kind=summary.kind, depth=summary.depth, tokens=summary.tokens,
            source_tokens=summary.source_tokens, earliest_at=iso(summary.earliest_at),
            latest_at=iso(summary.latest_at), message_count=summary.message_count,
            parents=store.parents(params.session_id, "summary", summary.id),
            children=[source_id for _, source_id in sources], content=summary.content,
            rules=summary.rules if summary.rules is not None else footer_rules(summary.content),
            rules_left_out=summary.rules_left_out or [],
        )
    message = store.message(params.session_id, params.id)
    if message is None:
        raise id_not_found(params.session_id, params.id)
    return DescribeResult(
        id=message.id, kind="message", depth=0, tokens=message.tokens, source_tokens=message.tokens,
        earliest_at=iso(message.message_at), latest_at=iso(message.message_at), message_count=1,
        parents=store.parents(params.session_id, "message", message.id), children=[],
        content=json.loads(message.raw), pinned=message.pinned,
    )


def pin(sidecar: Sidecar, params: PinParams) -> PinResult:
    """Pin or unpin messages: all or none; an id that is not a message of the session changes nothing."""
    session = sidecar.session(params.session_id)
    changed, missing = sidecar.store().set_pinned(session.session_id, params.ids, params.pinned)
    if missing:
        raise SidecarError(codes.ID_NOT_FOUND, f"no message {missing[0]!r} in session {params.session_id!r}; "
                           "nothing was changed", {"id": missing[0], "ids": missing})
    return PinResult(ids=changed, usage=sidecar.usage(sidecar.session(session.session_id)))


def rules(sidecar: Sidecar, params: RulesParams) -> RulesResult:
    """The session's standing rules and the files it read and modified, over its whole stored history."""
    session = sidecar.session(params.session_id)
    rows = sidecar.store().rule_and_call_messages(session.session_id)
    standing = session_standing((json.loads(raw), text) for raw, text in rows)
    return RulesResult(session_id=session.session_id, rules=standing.rules, rules_left_out=standing.rules_left_out,
                       read=standing.read, modified=standing.modified)


def sessions(sidecar: Sidecar, workspace: str | None = None) -> SessionsResult:
    """Every stored session (of ``workspace``, if given), most recently updated first."""
    rows = sidecar.store().sessions()
    if workspace is not None:
        belongs = of_workspace(workspace)
        rows = [row for row in rows if belongs(row)]
    return SessionsResult(sessions=[
        SessionSummary(session_id=row.session_id, messages=row.message_count, summaries=row.summary_count,
                       tokens=sidecar.estimated_tokens(row), updated_at=iso(row.updated_at) or "",
                       title=row.title, model=row.model, context_window=sidecar.context_window(row),
                       workspace=row.workspace)
        for row in rows
    ])


def delete_session(sidecar: Sidecar, params: DeleteSessionParams) -> DeleteSessionResult:
    """Remove every row of a session; ``deleted: false`` when there was none."""
    check_session_id(params.session_id)
    return DeleteSessionResult(deleted=sidecar.store().delete_session(params.session_id))
