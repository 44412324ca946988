"""Storage: the one class that owns the DuckDB connection and every SQL statement."""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterable, Sequence
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


_SESSION_COLUMNS = ", ".join(f.name for f in attrs.fields(SessionRow))
_ITEM_COLUMNS = "position, kind, ref_id, role, tokens, tool_name, tool_call_id, tool_call_ids"


class Storage(LineageQueries):
    """A DuckDB database of sessions, messages, summaries and their lineage."""

    def __init__(self, db: duckdb.DuckDBPyConnection, path: str) -> None:
        self._db = db
        self.path = path
        self._next_position = self._scalar(
            "SELECT greatest((SELECT max(seq) FROM messages), (SELECT max(position) FROM context_items))"
        )
        self._next_position = (self._next_position or 0) + 1
        self.dirty = False

    @classmethod
    def open(cls, path: str, memory_limit: str = "512MB") -> Storage:
        """Open (creating and migrating) the database at ``path``."""
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
        return cls(db, path)

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

    def checkpoint(self) -> None:
        """Fold the WAL into the database file; cheap when idle."""
        if self.dirty:
            self._db.execute("CHECKPOINT")
            self.dirty = False

    def _scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        rows = self._db.execute(sql, params).fetchall()
        return rows[0][0] if rows else None

    def _write(self, statements: Iterable[tuple[str, Sequence[Any]]]) -> list[list[tuple[Any, ...]]]:
        """Run statements in one transaction; every result is fetched; rolled back on any error."""
        results = []
        self._db.execute("BEGIN")
        try:
            for sql, params in statements:
                results.append(self._db.execute(sql, params).fetchall())
            self._db.execute("COMMIT")
        except BaseException as error:
            self._db.execute("ROLLBACK")
            if isinstance(error, duckdb.Error):
                raise StorageFailure(str(error)) from error
            raise
        self.dirty = True
        return results

    def allocate_positions(self, count: int) -> int:
        """Reserve ``count`` consecutive positions; returns the first."""
        first = self._next_position
        self._next_position += count
        return first

    # Sessions

    def session(self, session_id: str) -> SessionRow | None:
        """The session, or None."""
        rows = self._db.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE session_id = ?",
                                [session_id]).fetchall()
        return _session(rows[0]) if rows else None

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

    def ingest(self, session_id: str, rows: Sequence[MessageRow], info: dict[str, Any]) -> tuple[list[str], int]:
        """Store new messages at the end of the session's context, atomically; returns (ids, duplicates)."""
        now = utcnow()
        ids: list[str] = []
        fresh: list[tuple[str, MessageRow]] = []
        seen: set[str] = set()
        for row in rows:
            msg_id = row.id or f"msg_{uuid.uuid4().hex}"
            ids.append(msg_id)
            if msg_id not in seen:
                seen.add(msg_id)
                fresh.append((msg_id, row))
        first = self.allocate_positions(len(fresh))
        seqs = list(range(first, first + len(fresh)))
        statements: list[tuple[str, Sequence[Any]]] = [self._upsert_session(session_id, info, now)]
        if fresh:
            statements.append((
                """
                INSERT INTO messages
                SELECT ?, unnest(?::VARCHAR[]), unnest(?::BIGINT[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[]),
                       unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[][]),
                       unnest(?::INTEGER[]), ?, unnest(?::TIMESTAMP[])
                ON CONFLICT DO NOTHING RETURNING seq
                """,
                [session_id, [i for i, _ in fresh], seqs, [r.role for _, r in fresh], [r.raw for _, r in fresh],
                 [r.text for _, r in fresh], [r.tool_name for _, r in fresh], [r.tool_call_id for _, r in fresh],
                 [r.tool_call_ids for _, r in fresh], [r.tokens for _, r in fresh], now,
                 [r.message_at or now for _, r in fresh]],
            ))
            # Only rows RETURNING named were stored; the context gets exactly those.
            statements.append((
                """
                INSERT INTO context_items
                SELECT session_id, seq, 'message', id, role, tokens, tool_name, tool_call_id, tool_call_ids
                FROM messages WHERE session_id = ? AND seq BETWEEN ? AND ?
                """,
                [session_id, seqs[0], seqs[-1]],
            ))
            statements.append((
                """
                UPDATE sessions SET
                    message_count = message_count + s.n, context_count = context_count + s.n,
                    context_tokens = context_tokens + s.t,
                    first_position = coalesce(first_position, s.lo), last_position = greatest(last_position, s.hi),
                    revision = revision + 1, updated_at = ?
                FROM (SELECT count(*) n, coalesce(sum(tokens), 0) t, min(seq) lo, max(seq) hi FROM messages
                      WHERE session_id = ? AND seq BETWEEN ? AND ?) s
                WHERE session_id = ? AND s.n > 0
                """,
                [now, session_id, seqs[0], seqs[-1], session_id],
            ))
        results = self._write(statements)
        stored = len(results[1]) if fresh else 0
        return ids, len(rows) - stored

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
        return [_item(row) for row in rows]

    def tail(self, session: SessionRow, min_tokens: int, min_count: int) -> tuple[list[ItemRow], bool]:
        """The newest items covering ``min_tokens`` and ``min_count``; and whether that is all of them."""
        if session.last_position is None:
            return [], True
        upto = session.last_position
        window = 512
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

    def prunable_before(self, session: SessionRow, position: int, rule: Any) -> tuple[int, int]:
        """Count and tokens of prunable tool outputs (per ``rule``) older than ``position``."""
        row = self._db.execute(
            """
            SELECT count(*), coalesce(sum(tokens), 0) FROM context_items
            WHERE session_id = ? AND position < ? AND kind = 'message' AND role = 'tool' AND tokens > ?
              AND NOT list_has_any(string_split(coalesce(tool_name, ''), ','), ?::VARCHAR[])
            """,
            [session.session_id, position, rule.placeholder_tokens, sorted(rule.protected_tools)],
        ).fetchall()[0]
        return int(row[0]), int(row[1])

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


def _item(row: tuple[Any, ...]) -> ItemRow:
    *head, call_ids = row
    return ItemRow(*head, tuple(call_ids) if call_ids is not None else None)
