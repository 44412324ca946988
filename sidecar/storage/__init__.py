"""Storage: the one class that owns the DuckDB connection and every SQL statement."""

from __future__ import annotations

import contextlib
import json
import os
import re
import uuid
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

import attrs
import duckdb

from sidecar.engine.messages import MessageRow
from sidecar.storage.lineage import LineageQueries
from sidecar.storage.migrations import MIGRATIONS
from sidecar.storage.rows import (
    ItemRow,
    SearchHit,
    SessionRow,
    StorageFailure,
    StorageLocked,
    StoredMessage,
    SummaryRow,
    utcnow,
)

__all__ = ["ItemRow", "SearchHit", "SessionRow", "Storage", "StorageFailure", "StorageLocked", "StoredMessage",
           "SummaryRow", "utcnow"]

MEMORY = ":memory:"
_LOCK_PID = re.compile(r"PID (\d+)")
MEMORY_LIMIT = re.compile(r"\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)", re.IGNORECASE)


_SESSION_COLUMNS = ", ".join(f.name for f in attrs.fields(SessionRow))
_ITEM_COLUMNS = "position, kind, ref_id, role, tokens, tool_name, tool_call_id, tool_call_ids"


class Storage(LineageQueries):
    """A DuckDB database of sessions, messages, summaries and their lineage."""

    def __init__(self, db: duckdb.DuckDBPyConnection, path: str, memory_limit: str = "512MB") -> None:
        self._db = db
        self.path = path
        self.memory_limit = memory_limit
        self._next_position = self._scalar(
            "SELECT greatest((SELECT max(seq) FROM messages), (SELECT max(position) FROM context_items))"
        )
        self._next_position = (self._next_position or 0) + 1
        self.dirty = False
        self._sessions: dict[str, SessionRow] = {}

    @classmethod
    def open(cls, path: str, memory_limit: str = "512MB") -> Storage:
        """Open (creating and migrating) the database at ``path``."""
        if not MEMORY_LIMIT.fullmatch(memory_limit):
            raise StorageFailure(f"memoryLimit {memory_limit!r} is not a size such as '512MB'")
        if path != MEMORY:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        try:
            db = duckdb.connect(path, config={"memory_limit": memory_limit, "threads": 2})
        except duckdb.IOException as error:
            if "lock" in str(error).lower():
                match = _LOCK_PID.search(str(error))
                raise StorageLocked(path, int(match.group(1)) if match else None) from error
            raise StorageFailure(f"cannot open {path}: {error}") from error
        except duckdb.Error as error:
            raise StorageFailure(f"cannot open {path}: {error}") from error
        # Default 16 MiB checkpoints stall writes; we checkpoint when idle and on close instead.
        db.execute("SET checkpoint_threshold = '256MB'")
        db.execute("SET preserve_insertion_order = true")
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

    def migrations(self) -> list[str]:
        """Names of the applied migrations, oldest first."""
        return [row[0] for row in self._db.execute("SELECT name FROM schema_migrations ORDER BY applied_at, name")
                .fetchall()]

    def close(self) -> None:
        """Checkpoint and close."""
        try:
            self._db.execute("CHECKPOINT")
        finally:
            self._db.close()

    def checkpoint(self, trim_to: str | None = None) -> None:
        """Fold the WAL into the file; with ``trim_to``, also hand cached pages back. Safe from another thread."""
        if not self.dirty:
            return
        self.dirty = False
        cursor = self._db.cursor()
        try:
            cursor.execute("CHECKPOINT")
            if trim_to is not None:
                # DuckDB keeps pages cached up to memory_limit; a brief lower limit evicts them.
                cursor.execute(f"SET memory_limit = '{trim_to}'")
                cursor.execute(f"SET memory_limit = '{self.memory_limit}'")
        finally:
            cursor.close()

    def _scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        rows = self._db.execute(sql, params).fetchall()
        return rows[0][0] if rows else None

    def _write(self, statements: Iterable[tuple[str, Sequence[Any]]]) -> list[list[tuple[Any, ...]]]:
        """Run statements in one transaction; every result is fetched; rolled back on any error."""
        results = []
        with self._transaction():
            for sql, params in statements:
                results.append(self._db.execute(sql, params).fetchall())
        self._sessions.clear()  # callers may have changed any session's row
        return results

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
        rows = self._db.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE session_id = ?",
                                [session_id]).fetchall()
        if not rows:
            return None
        self._sessions[session_id] = _session(rows[0])
        return self._sessions[session_id]

    def sessions(self) -> list[SessionRow]:
        """Every session, most recently updated first."""
        rows = self._db.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions ORDER BY updated_at DESC").fetchall()
        return [_session(row) for row in rows]

    def delete_session(self, session_id: str) -> bool:
        """Remove every row of the session; whether it existed."""
        if self.session(session_id) is None:
            return False
        self._write([(f"DELETE FROM {table} WHERE session_id = ?", [session_id])
                     for table in ("summary_sources", "context_items", "summaries", "messages", "sessions")])
        return True

    def set_calibration(self, session_id: str, calibration: float) -> None:
        """Store the session's estimate correction factor."""
        self._write([("UPDATE sessions SET calibration = ? WHERE session_id = ?", [calibration, session_id])])

    def record_reported_usage(self, session_id: str, tokens: int, calibration: float) -> None:
        """Store provider-reported tokens, valid until the session's next change."""
        self._write([("UPDATE sessions SET reported_tokens = ?, reported_revision = revision, calibration = ? "
                      "WHERE session_id = ?", [tokens, calibration, session_id])])

    # Ingest

    def ingest(self, session_id: str, rows: Sequence[MessageRow], info: dict[str, Any],
               prunable: Sequence[bool], prune_rule: str) -> tuple[list[str], int]:
        """Store new messages at the end of the session's context, atomically; returns (ids, duplicates).

        ``prunable`` says which rows are tool outputs pruning may replace, counted under ``prune_rule``.
        """
        now = utcnow()
        ids: list[str] = []
        fresh: list[tuple[str, MessageRow, bool]] = []
        seen: set[str] = set()
        for row, can_prune in zip(rows, prunable, strict=True):
            msg_id = row.id or f"msg_{uuid.uuid4().hex}"
            ids.append(msg_id)
            if msg_id not in seen:
                seen.add(msg_id)
                fresh.append((msg_id, row, can_prune))
        first = self.allocate_positions(len(fresh))
        seqs = list(range(first, first + len(fresh)))
        session = self.session(session_id)
        try:
            # Optimistic: a plain INSERT is twice as fast as ON CONFLICT, and duplicates are the exception.
            stored = self._ingest_rows(session_id, session, fresh, seqs, info, prune_rule, now, skip_duplicates=False)
        except duckdb.ConstraintException:
            stored = self._ingest_rows(session_id, session, fresh, seqs, info, prune_rule, now, skip_duplicates=True)
        return ids, len(rows) - stored

    def _ingest_rows(self, session_id: str, session: SessionRow | None, fresh: list[tuple[str, MessageRow, bool]],
                     seqs: list[int], info: dict[str, Any], prune_rule: str, now: datetime,
                     skip_duplicates: bool) -> int:
        """One ingest transaction; returns how many rows were stored."""
        kept: list[tuple[int, str, MessageRow, bool]] = []
        with self._transaction(raise_constraint=True):
            if session is None or any(value is not None for value in info.values()):
                self._db.execute(*self._upsert_session(session_id, info, now)).fetchall()
            if fresh:
                conflict = " ON CONFLICT DO NOTHING RETURNING seq" if skip_duplicates else ""
                returned = self._db.execute(
                    f"""
                    INSERT INTO messages
                    SELECT ?, unnest(?::VARCHAR[]), unnest(?::BIGINT[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[]),
                           unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[][]),
                           unnest(?::INTEGER[]), ?, unnest(?::TIMESTAMP[]){conflict}
                    """,
                    [session_id, [i for i, _, _ in fresh], seqs, [r.role for _, r, _ in fresh],
                     [r.raw for _, r, _ in fresh], [r.text for _, r, _ in fresh], [r.tool_name for _, r, _ in fresh],
                     [r.tool_call_id for _, r, _ in fresh], [r.tool_call_ids for _, r, _ in fresh],
                     [r.tokens for _, r, _ in fresh], now, [r.message_at or now for _, r, _ in fresh]],
                ).fetchall()
                stored = {seq for (seq,) in returned} if skip_duplicates else set(seqs)
                # Only stored rows join the context.
                kept = [(seq, *entry) for seq, entry in zip(seqs, fresh, strict=True) if seq in stored]
            if kept:
                self._db.execute(
                    "INSERT INTO context_items SELECT ?, unnest(?::BIGINT[]), 'message', unnest(?::VARCHAR[]), "
                    "unnest(?::VARCHAR[]), unnest(?::INTEGER[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), "
                    "unnest(?::VARCHAR[][])",
                    [session_id, [k[0] for k in kept], [k[1] for k in kept], [k[2].role for k in kept],
                     [k[2].tokens for k in kept], [k[2].tool_name for k in kept], [k[2].tool_call_id for k in kept],
                     [k[2].tool_call_ids for k in kept]],
                ).fetchall()
                self._db.execute(
                    """
                    UPDATE sessions SET
                        message_count = message_count + ?, context_count = context_count + ?,
                        context_tokens = context_tokens + ?, prunable_count = prunable_count + ?,
                        prunable_tokens = prunable_tokens + ?,
                        first_position = coalesce(first_position, ?), last_position = greatest(last_position, ?),
                        revision = revision + 1, updated_at = ?
                    WHERE session_id = ?
                    """,
                    [len(kept), len(kept), sum(k[2].tokens for k in kept), sum(1 for k in kept if k[3]),
                     sum(k[2].tokens for k in kept if k[3]), kept[0][0], kept[-1][0], now, session_id],
                ).fetchall()
            recount = session is None or session.prunable_rule != prune_rule
            if recount:
                self._db.execute(*self._prunable_recount(session_id, prune_rule)).fetchall()
        if session is not None and not recount and not any(value is not None for value in info.values()):
            self._sessions[session_id] = attrs.evolve(
                session, message_count=session.message_count + len(kept),
                context_count=session.context_count + len(kept),
                context_tokens=session.context_tokens + sum(k[2].tokens for k in kept),
                prunable_count=session.prunable_count + sum(1 for k in kept if k[3]),
                prunable_tokens=session.prunable_tokens + sum(k[2].tokens for k in kept if k[3]),
                first_position=session.first_position if session.first_position is not None
                else (kept[0][0] if kept else None),
                last_position=max(filter(None, [session.last_position, kept[-1][0] if kept else None]), default=None),
                revision=session.revision + (1 if kept else 0), updated_at=now if kept else session.updated_at)
        else:
            self._sessions.pop(session_id, None)
        return len(kept)

    def _upsert_session(self, session_id: str, info: dict[str, Any], now: datetime) -> tuple[str, list[Any]]:
        metadata = json.dumps(info["metadata"]) if info.get("metadata") is not None else None
        return (
            """
            INSERT INTO sessions (session_id, title, model, context_window, metadata, created_at, updated_at)
            VALUES (?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (session_id) DO UPDATE SET
                title = coalesce(excluded.title, sessions.title),
                model = coalesce(excluded.model, sessions.model),
                context_window = coalesce(excluded.context_window, sessions.context_window),
                metadata = coalesce(excluded.metadata, sessions.metadata)
            """,
            [session_id, info.get("title"), info.get("model"), info.get("context_window"), metadata, now, now],
        )

    @contextlib.contextmanager
    def _transaction(self, raise_constraint: bool = False) -> Iterator[None]:
        """BEGIN … COMMIT, rolled back on any error; DuckDB's errors raised as StorageFailure."""
        self._db.execute("BEGIN")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException as error:
            self._db.execute("ROLLBACK")
            if raise_constraint and isinstance(error, duckdb.ConstraintException):
                raise
            if isinstance(error, duckdb.Error):
                raise StorageFailure(str(error)) from error
            raise
        self.dirty = True

    @staticmethod
    def _prunable_recount(session_id: str, prune_rule: str) -> tuple[str, list[Any]]:
        """Recount a session's prunable totals from its context items under ``prune_rule``."""
        placeholder, _, protected = prune_rule.partition(":")
        return (
            """
            UPDATE sessions SET prunable_rule = ?,
                prunable_count = (SELECT count(*) FROM context_items c WHERE c.session_id = sessions.session_id
                    AND c.kind = 'message' AND c.role = 'tool' AND c.tokens > ?
                    AND NOT list_has_any(string_split(coalesce(c.tool_name, ''), ','), ?::VARCHAR[])),
                prunable_tokens = (SELECT coalesce(sum(tokens), 0) FROM context_items c
                    WHERE c.session_id = sessions.session_id AND c.kind = 'message' AND c.role = 'tool'
                    AND c.tokens > ? AND NOT list_has_any(string_split(coalesce(c.tool_name, ''), ','),
                    ?::VARCHAR[]))
            WHERE session_id = ?
            """,
            [prune_rule, int(placeholder), protected.split(",") if protected else [], int(placeholder),
             protected.split(",") if protected else [], session_id],
        )

    def recount_prunable(self, session_id: str, prune_rule: str) -> None:
        """Recount the prunable totals (after a compaction, or when the rule changed)."""
        with self._transaction():
            self._db.execute(*self._prunable_recount(session_id, prune_rule)).fetchall()
        self._sessions.pop(session_id, None)

    def tool_names(self, session_id: str, call_ids: Sequence[str], near_position: int | None) -> dict[str, str]:
        """Tool names of recent assistant tool calls by call id, looked up among the newest context items."""
        if not call_ids or near_position is None:
            return {}
        rows = self._db.execute(
            """
            SELECT tool_call_ids, raw FROM messages
            WHERE session_id = ? AND seq > ? AND role = 'assistant' AND tool_call_ids IS NOT NULL
              AND len(list_intersect(tool_call_ids, ?::VARCHAR[])) > 0
            """,
            [session_id, near_position - 5000, list(call_ids)],
        ).fetchall()
        names: dict[str, str] = {}
        for _, raw in rows:
            for call in json.loads(raw).get("tool_calls") or ():
                names[call["id"]] = call["function"]["name"]
        return names

    # The context

    def items(self, session_id: str, after: int | None = None, upto: int | None = None) -> list[ItemRow]:
        """Context items with ``after < position <= upto``, in order."""
        sql = f"SELECT {_ITEM_COLUMNS} FROM context_items WHERE session_id = ?"
        params: list[Any] = [session_id]
        if after is not None:
            sql += " AND position > ?"
            params.append(after)
        if upto is not None:
            sql += " AND position <= ?"
            params.append(upto)
        rows = self._db.execute(sql + " ORDER BY position", params).fetchall()
        return [ItemRow(*row[:-1], tuple(row[-1]) if row[-1] is not None else None) for row in rows]

    def tail(self, session: SessionRow, min_tokens: int, min_count: int,
             before: int | None = None) -> tuple[list[ItemRow], bool]:
        """The newest items (older than ``before``) covering ``min_tokens`` and ``min_count``; and whether
        they reach the start of the context."""
        if session.last_position is None:
            return [], True
        upto = session.last_position if before is None else before - 1
        # Positions are global, so a session's items may be spread out; start from its average density.
        average = session.context_tokens / max(1, session.context_count)
        span = (session.last_position - (session.first_position or 0) + 1) / max(1, session.context_count)
        window = int(max(min_tokens / max(average, 1.0), min_count, 64) * 1.25 * span)
        found: list[ItemRow] = []
        tokens = 0
        while True:
            after = upto - window
            complete = after < (session.first_position or 0)
            chunk = self.items(session.session_id, None if complete else after, upto)
            found = chunk + found
            tokens += sum(item.tokens for item in chunk)
            if complete or (tokens >= min_tokens and len(found) >= min_count):
                return found, complete
            upto = after
            window *= 4

    def messages_by_seq(self, session_id: str, seqs: Sequence[int]) -> list[StoredMessage]:
        """Stored messages at the given positions, in order."""
        if not seqs:
            return []
        rows = self._db.execute(
            "SELECT id, seq, role, raw, tokens, created_at, message_at FROM messages "
            "WHERE session_id = ? AND seq BETWEEN ? AND ? AND seq IN (SELECT unnest(?::BIGINT[])) ORDER BY seq",
            [session_id, min(seqs), max(seqs), list(seqs)],
        ).fetchall()
        return [StoredMessage(*row) for row in rows]

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
            "SELECT id, seq, role, raw, tokens, created_at, message_at FROM messages WHERE session_id = ? AND id = ?",
            [session_id, message_id],
        ).fetchall()
        return StoredMessage(*rows[0]) if rows else None

    def messages_by_id(self, session_id: str, ids: Sequence[str]) -> dict[str, StoredMessage]:
        """Stored messages by id."""
        if not ids:
            return {}
        rows = self._db.execute(
            "SELECT id, seq, role, raw, tokens, created_at, message_at FROM messages "
            "WHERE session_id = ? AND id IN (SELECT unnest(?))",
            [session_id, list(ids)],
        ).fetchall()
        return {row[0]: StoredMessage(*row) for row in rows}

    # Search

    def search(self, session_id: str, scope: str, condition: str, pattern: str, limit: int) -> list[SearchHit]:
        """Messages and/or summaries whose text satisfies ``condition`` (SQL over ``{col}`` and ``?``), newest first."""
        parts: list[str] = []
        params: list[Any] = []
        if scope in ("messages", "both"):
            parts.append(f"SELECT 'message' AS kind, id, text, seq AS position FROM messages "
                         f"WHERE session_id = ? AND {condition.format(col='text')}")
            params += [session_id, pattern]
        if scope in ("summaries", "both"):
            parts.append(f"SELECT 'summary' AS kind, id, content AS text, epoch_ms(created_at) AS position "
                         f"FROM summaries WHERE session_id = ? AND {condition.format(col='content')}")
            params += [session_id, pattern]
        sql = " UNION ALL ".join(parts) + " ORDER BY kind = 'summary' DESC, position DESC LIMIT ?"
        rows = self._db.execute(sql, [*params, limit]).fetchall()
        return [SearchHit(*row) for row in rows]

    def check_regex(self, pattern: str) -> str | None:
        """DuckDB's (RE2's) complaint about a regular expression, or None when it compiles."""
        try:
            self._db.execute("SELECT regexp_matches('', ?)", [pattern]).fetchall()
        except duckdb.Error as error:
            return str(error).splitlines()[0]
        return None


def _session(row: tuple[Any, ...]) -> SessionRow:
    values = list(row)
    metadata_index = 4
    values[metadata_index] = json.loads(values[metadata_index]) if values[metadata_index] else None
    return SessionRow(*values)
