"""The Storage class: the DuckDB connection, the schema, and the SQL of sessions, context and search."""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import itemgetter
from typing import Any

import attrs
import duckdb

from sidecar.config.settings import DEFAULT_MEMORY_LIMIT
from sidecar.rows import (
    Anchors,
    ItemRow,
    SearchHit,
    SessionRow,
    StorageFailure,
    StoredMessage,
    utcnow,
)
from sidecar.storage.anchors import AnchorQueries
from sidecar.storage.connection import (
    CHECKPOINT_WAL_BYTES,
    MEMORY,
    SCAN_MEMORY_LIMIT,
    TRIMMED_MEMORY_LIMIT,
    connect,
    invalidating,
)
from sidecar.storage.context_reads import ContextReads
from sidecar.storage.imports import ImportWrites
from sidecar.storage.ingest import IngestWrites, prunable_condition
from sidecar.storage.lineage import LineageQueries
from sidecar.storage.live import SESSION_COLUMNS, session_from_row, with_live
from sidecar.storage.merge import MergeFiles
from sidecar.storage.migrations import MIGRATIONS
from sidecar.storage.sessions_copy import SessionCopies
from sidecar.storage.tail import TailCache
from sidecar.storage.workspace import WorkspaceQueries

log = logging.getLogger(__name__)


_ITEM_COLUMNS = "position, kind, ref_id, role, tokens, tool_name, tool_call_id, tool_call_ids"
_LIVE_ITEM_COLUMNS = "seq, 'message', id, role, tokens, tool_name, tool_call_id, tool_call_ids"
"""A live message read as a context item (see ``SessionRow.live_after``)."""


class Storage(IngestWrites, ImportWrites, LineageQueries, AnchorQueries, MergeFiles, WorkspaceQueries, ContextReads,
              SessionCopies):
    """A DuckDB database of sessions, messages, summaries and their lineage."""

    def __init__(self, db: duckdb.DuckDBPyConnection, path: str, memory_limit: str = DEFAULT_MEMORY_LIMIT) -> None:
        self._db = db
        self.path = path
        self.memory_limit = memory_limit
        self._start()

    def _start(self) -> None:
        """State kept beside the file, read from it afresh."""
        self._next_position = self._scalar(
            "SELECT greatest((SELECT max(seq) FROM messages), (SELECT max(position) FROM context_items))"
        )
        self._next_position = (self._next_position or 0) + 1
        # Opening replays a WAL without folding it in: its rows wait in memory like any write not checkpointed.
        self.dirty = self._wal_bytes() > 0
        self.invalidated = False
        """DuckDB refuses the database after a failure (a checkpoint out of memory, a full disk) until reopen()."""
        self._sessions: dict[str, SessionRow] = {}
        self._tails = TailCache()
        self._anchors: dict[str, Anchors] = {}
        self._summary_items: dict[str, tuple[int, list[ItemRow]]] = {}
        """Per session: (its summary count then, the summaries in its context), see ``summary_items``."""
        self._heads: dict[str, tuple[int, str]] = {}
        """Per session: (revision, id of its newest message), see ``last_message_id``."""

    @classmethod
    def open(cls, path: str, memory_limit: str = DEFAULT_MEMORY_LIMIT) -> Storage:
        """Open (creating and migrating) the database at ``path``."""
        db = connect(path, memory_limit)
        cls._migrate(db)
        return cls(db, path, memory_limit)

    @staticmethod
    def _migrate(db: duckdb.DuckDBPyConnection) -> None:
        db.execute("CREATE TABLE IF NOT EXISTS schema_migrations (name VARCHAR PRIMARY KEY, applied_at TIMESTAMP)")
        done = {row[0] for row in db.execute("SELECT name FROM schema_migrations").fetchall()}
        for name, migration in MIGRATIONS:
            if name in done:
                continue
            db.execute("BEGIN")
            try:
                migration(db)
                db.execute("INSERT INTO schema_migrations VALUES (?, ?)", [name, utcnow()])
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def session_lock(self, session_id: str) -> OneProcessLock:
        """Always free: one process holds the file, and its runtime knows which session it compacts."""
        return OneProcessLock()

    def listen(self, on_change: Callable[[str | None], None]) -> None:
        """Nothing to hear: no other process writes the file (it is locked)."""

    def migrations(self) -> list[str]:
        """Names of the applied migrations, oldest first."""
        return [row[0] for row in self._db.execute("SELECT name FROM schema_migrations ORDER BY applied_at, name")
                .fetchall()]

    def close(self) -> None:
        """Checkpoint and close; an invalidated database is closed as it is (its WAL is replayed on the next open)."""
        try:
            if not self.invalidated:
                self.checkpoint()
        finally:
            self._db.close()

    def checkpoint(self) -> None:
        """Fold the WAL into the file, if anything was written, and hand DuckDB's cached pages back."""
        if self.dirty:
            # Under DuckDB's default limit (80% of RAM), not memoryLimit: a checkpoint holds a whole row group,
            # one of 200 KB tool outputs failed under 64MB, and a failed checkpoint invalidates the database.
            with self._memory_limit(None):
                try:
                    self._db.execute("CHECKPOINT")
                except duckdb.Error as error:
                    self.note_failure(error)
                    raise
            self.dirty = False
        self.trim()

    def reopen(self) -> None:
        """Open the file again after DuckDB invalidated it: committed writes come back from its WAL, caches go."""
        if self.path == MEMORY:
            raise StorageFailure("the in-memory database was invalidated; its contents are lost")
        try:
            self._db.close()
        except duckdb.Error as error:
            log.info("closing the invalidated database: %s", error)
        self._db = connect(self.path, self.memory_limit)
        try:
            self._start()
        except duckdb.Error as error:
            raise StorageFailure(str(error)) from error

    @contextlib.contextmanager
    def _memory_limit(self, limit: str | None) -> Iterator[None]:
        """DuckDB's memory limit at ``limit`` (None: DuckDB's default) for the block, memoryLimit again after it."""
        try:
            self._db.execute("RESET memory_limit" if limit is None else f"SET memory_limit = '{limit}'")
            yield
        finally:
            self._db.execute(f"SET memory_limit = '{self.memory_limit}'")  # a setting: works on a refused file

    @property
    def _all_on_disk(self) -> bool:
        """Whether every row is in the file, so a low limit only evicts cached pages and spills nothing."""
        return not self.dirty and self.path != MEMORY

    def trim(self) -> None:
        """Empty DuckDB's page cache of what is on disk, unless writes wait for a checkpoint (they would spill)."""
        if not self._all_on_disk:
            return
        try:
            self._db.execute(f"SET memory_limit = '{TRIMMED_MEMORY_LIMIT}'")
        except duckdb.Error as error:  # it could not free enough: the cache stays as it is
            log.info("cache not trimmed: %s", error)
        finally:
            self._db.execute(f"SET memory_limit = '{self.memory_limit}'")

    def note_failure(self, error: BaseException) -> None:
        """Mark the store invalidated if ``error`` says DuckDB refuses it, and a probe agrees.

        The probe, because an error may only quote the words (an id, a regex) or come from a connection since reopened.
        """
        if not self.invalidated and invalidating(error) and self.refused():
            self.invalidated = True

    def refused(self) -> bool:
        """Whether DuckDB refuses this connection's database now: a probe that reads the file (SELECT 1 would not)."""
        try:
            self._db.execute("SELECT 1 FROM schema_migrations LIMIT 1").fetchall()
        except duckdb.Error as error:
            return invalidating(error)
        return False

    def _wal_bytes(self) -> int:
        if self.path == MEMORY:
            return 0
        try:
            return os.path.getsize(self.path + ".wal")
        except OSError:
            return 0

    def checkpoint_if_due(self) -> None:
        """Checkpoint once the WAL has grown past CHECKPOINT_WAL_BYTES, so that no load piles up in memory."""
        if self._wal_bytes() > CHECKPOINT_WAL_BYTES:
            try:
                self.checkpoint()
            except duckdb.Error as error:  # the write is committed; the idle checkpoint retries
                log.warning("checkpoint after a write failed: %s", error)

    def _scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        rows = self._db.execute(sql, params).fetchall()
        return rows[0][0] if rows else None

    def _write(self, statements: Iterable[tuple[str, Sequence[Any]]]) -> list[list[tuple[Any, ...]]]:
        """Run statements in one transaction; every result is fetched; rolled back on any error."""
        with self._transaction():
            return [self._db.execute(sql, params).fetchall() for sql, params in statements]

    def allocate_positions(self, count: int) -> int:
        """Reserve ``count`` consecutive positions; returns the first."""
        first = self._next_position
        self._next_position += count
        return first

    # Sessions

    def session(self, session_id: str) -> SessionRow | None:
        """The session, or None; cached, since this process is the only writer of the file."""
        cached = self._sessions.get(session_id)
        if cached is not None:
            return cached
        rows = self._db.execute(f"SELECT {SESSION_COLUMNS} FROM sessions WHERE session_id = ?",
                                [session_id]).fetchall()
        if not rows:
            return None
        self._sessions[session_id] = self._with_live(session_from_row(rows[0]))
        return self._sessions[session_id]

    def _with_live(self, stored: SessionRow) -> SessionRow:
        """The stored row plus its live messages, which ingest does not count in the row."""
        prunable, params = prunable_condition(stored.prunable_rule)
        count, tokens, prunable_count, prunable_tokens, first, last, latest = self._db.execute(
            f"SELECT count(*), coalesce(sum(tokens), 0), count(*) FILTER ({prunable}), "
            f"coalesce(sum(tokens) FILTER ({prunable}), 0), min(seq), max(seq), max(created_at) "
            "FROM messages WHERE session_id = ? AND seq > ?",
            [*params, *params, stored.session_id, stored.live_after]).fetchall()[0]
        return with_live(stored, count, tokens, prunable_count, prunable_tokens, first, last, latest)

    def sessions(self) -> list[SessionRow]:
        """Every session, most recently updated first."""
        rows = self._db.execute(f"SELECT {SESSION_COLUMNS} FROM sessions").fetchall()
        for row in rows:
            if row[0] not in self._sessions:
                self._sessions[row[0]] = self._with_live(session_from_row(row))
        found = [self._sessions[row[0]] for row in rows]
        return sorted(found, key=lambda session: session.updated_at, reverse=True)

    def session_ids(self, prefix: str) -> list[str]:
        """The ids of the sessions whose id starts with ``prefix``."""
        rows = self._db.execute("SELECT session_id FROM sessions WHERE starts_with(session_id, ?) ORDER BY session_id",
                                [prefix]).fetchall()
        return [row[0] for row in rows]

    def delete_session(self, session_id: str) -> bool:
        """Remove every row of the session; whether it existed."""
        if self.session(session_id) is None:
            return False
        self._tails.drop(session_id)  # a session made again under this id restarts its revisions
        self._sessions.pop(session_id, None)
        self._anchors.pop(session_id, None)
        self._summary_items.pop(session_id, None)
        self._heads.pop(session_id, None)
        self._write([(f"DELETE FROM {table} WHERE session_id = ?", [session_id])
                     for table in ("summary_sources", "context_items", "summaries", "message_sources", "messages",
                                   "agent_compactions", "sessions")])
        return True

    def record_reported_usage(self, session_id: str, tokens: int, calibration: float) -> None:
        """Store provider-reported tokens, valid until the session's next change."""
        session = self.session(session_id)
        if session is None:
            return
        self._write([("UPDATE sessions SET reported_tokens = ?, reported_revision = ?, calibration = ? "
                      "WHERE session_id = ?", [tokens, session.revision, calibration, session_id])])
        self._sessions[session_id] = attrs.evolve(session, reported_tokens=tokens, reported_revision=session.revision,
                                                  calibration=calibration)

    @contextlib.contextmanager
    def _transaction(self, raise_constraint: bool = False) -> Iterator[None]:
        """BEGIN … COMMIT, rolled back on any error; DuckDB's errors raised as StorageFailure."""
        self._db.execute("BEGIN")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException as error:
            try:
                self._db.execute("ROLLBACK")
            except duckdb.Error as rollback_error:  # the original error is the one to report
                log.error("rollback failed: %s", rollback_error)
                self.note_failure(rollback_error)
            self.note_failure(error)
            if raise_constraint and isinstance(error, duckdb.ConstraintException):
                raise
            if isinstance(error, duckdb.ConstraintException) and "changed during compaction" in str(error):
                raise StorageFailure(str(error)) from error
            if isinstance(error, duckdb.Error):
                raise StorageFailure(str(error)) from error
            raise
        self.dirty = True
        self.checkpoint_if_due()

    def _statement(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """One statement in its own transaction: a BEGIN and a COMMIT of our own would cost a third more."""
        try:
            rows = self._db.execute(sql, params).fetchall()
        except duckdb.ConstraintException:
            raise
        except duckdb.Error as error:
            self.note_failure(error)
            raise StorageFailure(str(error)) from error
        self.dirty = True
        self.checkpoint_if_due()
        return rows

    # The context

    def items(self, session: SessionRow, after: int | None = None, upto: int | None = None) -> list[ItemRow]:
        """Context items with ``after < position <= upto``, in order: stored items, then live messages."""
        low = (session.first_position or 0) - 1 if after is None else after
        high = session.last_position if upto is None else upto
        if high is None:
            return []
        parts: list[str] = []
        params: list[Any] = []
        if low < session.live_after:
            parts.append(f"SELECT {_ITEM_COLUMNS} FROM context_items WHERE session_id = ? AND position > ? "
                         "AND position <= ?")
            params += [session.session_id, low, min(high, session.live_after)]
        if high > session.live_after and session.live_count:
            parts.append(f"SELECT {_LIVE_ITEM_COLUMNS} FROM messages WHERE session_id = ? AND seq > ? AND seq <= ?")
            params += [session.session_id, max(low, session.live_after), high]
        if not parts:
            return []
        rows = self._db.execute(" UNION ALL ".join(parts), params).fetchall()
        rows.sort(key=itemgetter(0))  # cheaper here than ORDER BY
        return [ItemRow._make(row) if row[-1] is None else ItemRow._make((*row[:-1], tuple(row[-1]))) for row in rows]

    def message_raws(self, session_id: str, seqs: Sequence[int]) -> dict[int, str]:
        """Verbatim JSON of messages by seq."""
        if not seqs:
            return {}
        rows = self._db.execute(
            "SELECT seq, raw FROM messages WHERE session_id = ? AND seq BETWEEN ? AND ? AND seq IN (SELECT unnest(?))",
            [session_id, min(seqs), max(seqs), list(seqs)],
        ).fetchall()
        return dict(rows)

    # Lookups

    def message(self, session_id: str, message_id: str) -> StoredMessage | None:
        """A stored message by id."""
        rows = self._db.execute(
            "SELECT id, seq, role, raw, tokens, created_at, message_at, pinned FROM messages "
            "WHERE session_id = ? AND id = ?",
            [session_id, message_id],
        ).fetchall()
        return StoredMessage(*rows[0]) if rows else None

    def messages_by_id(self, session_id: str, ids: Sequence[str]) -> dict[str, StoredMessage]:
        """Stored messages by id."""
        if not ids:
            return {}
        rows = self._db.execute(
            "SELECT id, seq, role, raw, tokens, created_at, message_at, pinned FROM messages "
            "WHERE session_id = ? AND id IN (SELECT unnest(?))",
            [session_id, list(ids)],
        ).fetchall()
        return {row[0]: StoredMessage(*row) for row in rows}

    def rule_and_call_messages(self, session_id: str) -> list[tuple[str, str]]:
        """(raw, text) of the session's user and system messages and tool calls, in order: what its footers read."""
        return self._scan("SELECT raw, text FROM messages WHERE session_id = ? "
                          "AND (role IN ('user', 'system') OR tool_call_ids IS NOT NULL) ORDER BY seq", [session_id])

    # Search

    def search(self, session_id: str, scope: str, pattern: str, *, regex: bool, case_sensitive: bool,
               limit: int) -> list[SearchHit]:
        """Messages and/or summaries whose text matches ``pattern`` (an RE2 regex, or a literal), newest first."""
        if regex or not case_sensitive:
            # A literal searched without case goes through RE2 too: ILIKE was three times slower (ENGINEERING.md).
            condition = f"regexp_matches({{col}}, ?, '{'c' if case_sensitive else 'i'}')"
            pattern = pattern if regex else re2_escape(pattern)
        else:
            condition = "contains({col}, ?)"
        parts: list[str] = []
        params: list[Any] = []
        if scope in ("messages", "both"):
            parts.append(f"SELECT 'message' AS kind, id, seq AS position FROM messages "
                         f"WHERE session_id = ? AND {condition.format(col='text')}")
            params += [session_id, pattern]
        if scope in ("summaries", "both"):
            parts.append(f"SELECT 'summary' AS kind, id, epoch_ms(created_at) AS position "
                         f"FROM summaries WHERE session_id = ? AND {condition.format(col='content')}")
            params += [session_id, pattern]
        # The texts are read after the sort, for the hits only: sorted along, 455 matches of 200 KB needed 128 MiB.
        sql = " UNION ALL ".join(parts) + " ORDER BY kind = 'summary' DESC, position DESC LIMIT ?"
        hits = self._scan(sql, [*params, limit])
        texts = self._hit_texts(session_id, hits)
        self.trim()  # what is left of the text it read
        return [SearchHit(kind, hit_id, texts[kind, hit_id], position) for kind, hit_id, position in hits]

    def _hit_texts(self, session_id: str, hits: list[tuple[Any, ...]]) -> dict[tuple[str, str], str]:
        seqs = [position for kind, _, position in hits if kind == "message"]
        summary_ids = [hit_id for kind, hit_id, _ in hits if kind == "summary"]
        texts: dict[tuple[str, str], str] = {}
        if seqs:  # by seq, which is in insertion order: the scan skips row groups by their min and max
            rows = self._db.execute("SELECT id, text FROM messages WHERE session_id = ? AND seq BETWEEN ? AND ? "
                                    "AND list_contains(?, seq)", [session_id, min(seqs), max(seqs), seqs]).fetchall()
            texts.update((("message", hit_id), text) for hit_id, text in rows)
        if summary_ids:
            rows = self._db.execute("SELECT id, content FROM summaries WHERE session_id = ? AND list_contains(?, id)",
                                    [session_id, summary_ids]).fetchall()
            texts.update((("summary", hit_id), text) for hit_id, text in rows)
        return texts

    def _scan(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Rows of a query that reads much of the file, under SCAN_MEMORY_LIMIT when nothing waits for a checkpoint."""
        if self._all_on_disk:
            try:
                with self._memory_limit(SCAN_MEMORY_LIMIT):
                    return self._db.execute(sql, params).fetchall()
            except duckdb.OutOfMemoryException:  # e.g. a vector of very long texts: read it at the full limit
                pass
        return self._db.execute(sql, params).fetchall()

    def check_regex(self, pattern: str) -> str | None:
        """DuckDB's (RE2's) complaint about a regular expression, or None when it compiles."""
        try:
            self._db.execute("SELECT regexp_matches('', ?)", [pattern]).fetchall()
        except duckdb.Error as error:
            return str(error).splitlines()[0]
        return None


class OneProcessLock:
    """A session's compaction lock in a file only one process opens: nothing to take."""

    def acquire(self) -> bool:
        return True

    def release(self) -> None:
        """Nothing was taken."""


_RE2_SPECIAL = re.compile(r"([\\.^$|?*+()\[\]{}])")


def re2_escape(text: str) -> str:
    """A literal as an RE2 pattern."""
    return _RE2_SPECIAL.sub(r"\\\1", text)
