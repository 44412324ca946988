"""The storage interface: what the services may ask of a store, whichever backend holds the rows.

Two implementations: ``database.Storage`` (DuckDB, one file, the embedded default) and
``postgres.database.PgStorage`` (a team's PostgreSQL server). The services type against ``Store`` only and never
learn which one they talk to; ``sidecar.storage.open_store`` picks it from the target (a path or a URL).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from sidecar.engine.messages import MessageRow
from sidecar.rows import (
    AgentCompactionRow,
    Anchors,
    ItemRow,
    ReplacedSpan,
    SearchHit,
    SessionDump,
    SessionRow,
    SourceMessage,
    StoredMessage,
    SummaryRow,
)


class SessionLock(Protocol):
    """The right to compact one session, across every host of the database."""

    def acquire(self) -> bool:
        """Take it if it is free (never waits); whether this holds it now."""

    def release(self) -> None:
        """Let it go (once held; otherwise nothing)."""


class Store(Protocol):
    """A database of sessions, their verbatim messages, summaries, lineage and current context."""

    path: str
    """What the store was opened on, as shown to users: a file path, or a URL without its password."""
    invalidated: bool
    """The backend refuses the store until ``reopen`` (DuckDB after a failed checkpoint); never true for others."""

    # Lifecycle

    def migrations(self) -> list[str]:
        """Names of the applied migrations, oldest first."""

    def close(self) -> None:
        """Flush what is pending and close."""

    def checkpoint(self) -> None:
        """Settle what was written while requests paused (a backend with nothing to settle does nothing)."""

    def reopen(self) -> None:
        """Open again after the backend refused the store."""

    def note_failure(self, error: BaseException) -> None:
        """Look at a request's failure, in case it means the store must be reopened."""

    def listen(self, on_change: Callable[[str | None], None]) -> None:
        """Call ``on_change`` (on another thread) with the id of each session another process changed, or None
        when any may have; a store no other process writes never calls it."""

    # Sessions

    def session(self, session_id: str) -> SessionRow | None:
        """The session, or None."""

    def sessions(self) -> list[SessionRow]:
        """Every session this user may read, most recently updated first."""

    def session_ids(self, prefix: str) -> list[str]:
        """The ids of the sessions whose id starts with ``prefix``."""

    def delete_session(self, session_id: str) -> bool:
        """Remove every row of the session; whether it existed."""

    def record_reported_usage(self, session_id: str, tokens: int, calibration: float) -> None:
        """Store provider-reported tokens, valid until the session's next change."""

    # Writes of messages

    def ingest(self, session_id: str, rows: Sequence[MessageRow], info: dict[str, Any], prunable: Sequence[bool],
               prune_rule: str, originals: Sequence[Sequence[str] | None] | None = None) -> tuple[list[str], int]:
        """Store new messages at the end of the session's context, atomically; returns (ids, duplicates)."""

    def last_message_id(self, session_id: str) -> str | None:
        """The id of the session's newest message; None when it has none."""

    def recount_prunable(self, session_id: str, prune_rule: str) -> None:
        """Recount the prunable totals under ``prune_rule``."""

    def advance_prune(self, session_id: str, upto: int, count: int, tokens: int) -> SessionRow | None:
        """Move the prune frontier forward: a new revision."""

    def tool_names(self, session_id: str, call_ids: Sequence[str], near_position: int | None) -> dict[str, str]:
        """Tool names of recent assistant tool calls by call id."""

    def replace_messages(self, session_id: str, replacements: Sequence[tuple[str, MessageRow]]) -> int:
        """Rewrite stored messages at their positions, atomically; returns how many changed."""

    def store_sources(self, session_id: str, sources: Mapping[str, Sequence[str]]) -> None:
        """Keep each message's original transcript lines beside it."""

    def message_sources(self, session_id: str, ids: Sequence[str]) -> dict[str, list[str]]:
        """The original transcript lines of imported messages, by message id."""

    def set_pinned(self, session_id: str, ids: Sequence[str], pinned: bool) -> tuple[list[str], list[str]]:
        """Pin or unpin messages: (ids changed, ids not messages of the session)."""

    # The context

    def items(self, session: SessionRow, after: int | None = None, upto: int | None = None) -> list[ItemRow]:
        """Context items with ``after < position <= upto``, in order."""

    def tail(self, session: SessionRow, min_tokens: int, min_count: int,
             before: int | None = None) -> tuple[list[ItemRow], bool]:
        """The newest items covering ``min_tokens`` and ``min_count``; and whether they reach the start."""

    def items_after(self, session: SessionRow, position: int) -> list[ItemRow]:
        """The context items newer than ``position``."""

    def context(self, session: SessionRow) -> list[ItemRow]:
        """The session's whole current context, in order."""

    def anchors(self, session: SessionRow) -> Anchors:
        """The session's anchored items (system and pinned messages with their tool-call units)."""

    def summary_items(self, session: SessionRow) -> list[ItemRow]:
        """The summaries in the session's context, in order (every assembled prompt sends them)."""

    def message_raws(self, session_id: str, seqs: Sequence[int]) -> dict[int, str]:
        """Verbatim JSON of messages by seq."""

    def message(self, session_id: str, message_id: str) -> StoredMessage | None:
        """A stored message by id."""

    def messages_by_id(self, session_id: str, ids: Sequence[str]) -> dict[str, StoredMessage]:
        """Stored messages by id."""

    def rule_and_call_messages(self, session_id: str) -> list[tuple[str, str]]:
        """(raw, text) of the session's user and system messages and tool calls, in order."""

    def source_messages(self, session_id: str, spans: Sequence[tuple[int, int]]) -> list[SourceMessage]:
        """The text and time of the messages whose seq lies in one of the (first, last) spans."""

    def session_lock(self, session_id: str) -> SessionLock:
        """The lock a compaction of the session holds, so that two hosts never both compact it."""

    # Summaries and lineage

    def summaries(self, session_id: str, ids: Sequence[str]) -> dict[str, SummaryRow]:
        """Summaries by id."""

    def summary(self, session_id: str, summary_id: str) -> SummaryRow | None:
        """A summary by id."""

    def sources(self, session_id: str, summary_id: str) -> list[tuple[str, str]]:
        """What a summary replaced, in order, as (kind, id)."""

    def parents(self, session_id: str, kind: str, ref_id: str) -> list[str]:
        """Summaries that list this message or summary among their sources."""

    def covering_summaries(self, session_id: str, message_ids: Sequence[str]) -> dict[str, str]:
        """For each compacted message, the summary of the current context that stands for it."""

    def agent_compactions(self, session_id: str) -> list[AgentCompactionRow]:
        """The compactions the session's agent made itself, oldest first."""

    def apply_compaction(self, session_id: str, summaries: Sequence[SummaryRow],
                         sources: Sequence[tuple[str, Sequence[tuple[str, str]]]], replaced: ReplacedSpan,
                         added: Sequence[tuple[int, str, int]], pruned: tuple[int, int, int] | None = None,
                         agent: AgentCompactionRow | None = None) -> None:
        """Store summaries and lineage and swap context items in one transaction; fails if the context moved."""

    # Search and workspaces

    def search(self, session_id: str, scope: str, pattern: str, *, regex: bool, case_sensitive: bool,
               limit: int) -> list[SearchHit]:
        """Messages and/or summaries whose text matches ``pattern``, newest first."""

    def check_regex(self, pattern: str) -> str | None:
        """The complaint about a regular expression the backend searches with, or None when it compiles."""

    def message_spans(self, session_ids: Sequence[str]) -> dict[str, tuple[datetime, datetime]]:
        """Per session that has messages: the times of its first and last message."""

    def holders(self, item_id: str, session_ids: Sequence[str]) -> list[tuple[str, str]]:
        """``(kind, session_id)`` of every summary or message with this id among the sessions."""

    # Whole sessions, between stores (db copy)

    def dump_session(self, session_id: str) -> SessionDump | None:
        """Every row of a session, verbatim, for another store; None when there is none."""

    def load_session(self, dump: SessionDump) -> bool:
        """Store a dumped session under its ids (positions renumbered in order); False if one of that id exists."""
