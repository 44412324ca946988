"""Rows and errors of storage: plain types on the lowest layer, so every layer can hold them without DuckDB."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, NamedTuple

import attrs


class StorageLocked(Exception):
    """Another process holds the database file's lock."""

    def __init__(self, path: str, pid: int | None) -> None:
        holder = f"process {pid}" if pid else "another process"
        super().__init__(f"storage {path} is locked by {holder} (another context-sidecar?)")
        self.path = path
        self.pid = pid


class StorageFailure(Exception):
    """The database failed; the transaction was rolled back."""


class StorageUnavailable(StorageFailure):
    """The database server cannot be reached now (a team's PostgreSQL restarting, say); nothing was written."""


@attrs.define(frozen=True)
class SessionRow:
    """A session as the sidecar sees it: the stored row plus the messages not yet written to context_items."""

    session_id: str
    title: str | None
    model: str | None
    context_window: int | None
    metadata: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime
    message_count: int
    summary_count: int
    context_tokens: int
    context_count: int
    first_position: int | None
    last_position: int | None
    revision: int
    calibration: float
    reported_tokens: int | None
    reported_revision: int | None
    prunable_count: int = 0
    prunable_tokens: int = 0
    prunable_rule: str | None = None
    live_after: int = 0
    """Messages with a greater seq are in the context without a context_items row (see Storage.session)."""
    workspace: str | None = None
    """The workspace the session was first stored from (a directory), or None for sessions older than that."""
    pruned_upto: int = 0
    """Prune frontier: prunable tool outputs at positions up to this stay pruned (it only moves forward)."""
    pruned_count: int = 0
    pruned_tokens: int = 0
    """Count and raw tokens of the prunable outputs at positions up to ``pruned_upto``, live ones included."""
    project: str | None = None
    """The project the session belongs to: its workspace's git remote as host/owner/repo; None: private."""
    live_count: int = 0
    """How many such messages there are; not stored, counted when the session is read."""


@attrs.define(frozen=True)
class ReplacedSpan:
    """What a compaction replaces: the session's items from ``first`` to ``last`` but ``kept``, and their totals."""

    first: int
    last: int
    kept: tuple[int, ...]
    count: int
    tokens: int
    prunable_count: int
    prunable_tokens: int


@attrs.define
class SessionDump:
    """Every row of one session, by table, as column-to-value dicts: a session moved between two stores."""

    session_id: str
    tables: dict[str, list[dict[str, Any]]]


class ItemRow(NamedTuple):
    """One context item: a message or a summary at a position of the session's context.

    A named tuple rather than attrs: assemble builds thousands per call, and tuples are cheap.
    """

    position: int
    kind: str
    ref_id: str
    role: str
    tokens: int
    tool_name: str | None
    tool_call_id: str | None
    tool_call_ids: tuple[str, ...] | None


@attrs.define(frozen=True)
class StoredMessage:
    id: str
    seq: int
    role: str
    raw: str
    tokens: int
    created_at: datetime
    message_at: datetime
    pinned: bool = False


class SourceMessage(NamedTuple):
    """What a summarizer needs of a stored message: its searchable text and its time."""

    seq: int
    text: str
    message_at: datetime


@attrs.define(frozen=True)
class SummaryRow:
    id: str
    kind: str
    depth: int
    content: str
    tokens: int
    source_tokens: int
    message_count: int
    earliest_at: datetime | None
    latest_at: datetime | None
    summarizer: str
    created_at: datetime
    rules: list[str] | None = None
    """Standing rules carried verbatim from the sources (also in the content's ``<rules>`` footer)."""
    rules_left_out: list[str] | None = None
    """Rules the cap on carried rules left out."""


@attrs.define(frozen=True)
class AgentCompactionRow:
    """A compaction an agent made itself, recorded once, with the summary that stands for it."""

    summary_id: str
    compaction_id: str | None
    source: str
    trigger: str | None
    text: str
    """The summary with whitespace folded: how a second record of it is recognised."""
    recorded_at: datetime


class Anchors(NamedTuple):
    """Context items that are never compacted, pruned or dropped: system and pinned messages, with the
    other messages of their tool-call units, in order."""

    items: list[ItemRow]
    positions: frozenset[int]
    system: frozenset[int]
    """Positions of system messages: assembled first."""
    calls: frozenset[str]
    """Tool call ids of anchored assistant messages: their results are anchored too."""


NO_ANCHORS = Anchors([], frozenset(), frozenset(), frozenset())


@attrs.define(frozen=True)
class SearchHit:
    kind: str
    id: str
    text: str
    position: int


def utcnow() -> datetime:
    """Now, as naive UTC (how every timestamp is stored)."""
    return datetime.now(UTC).replace(tzinfo=None)


def iso(moment: datetime | None) -> str | None:
    """Stored naive-UTC time as ISO-8601 with a Z."""
    return None if moment is None else moment.isoformat(timespec="milliseconds") + "Z"


def prune_rule_key(placeholder_tokens: int, protected_tools: Iterable[str]) -> str:
    """A pruning rule as stored beside a session's running totals; ``prune_rule_parts`` reads it back."""
    return f"{placeholder_tokens}:{','.join(sorted(protected_tools))}"


def prune_rule_parts(key: str) -> tuple[int, list[str]]:
    """(placeholder tokens, protected tools) of a stored ``prune_rule_key``."""
    placeholder, _, protected = key.partition(":")
    return int(placeholder), protected.split(",") if protected else []
