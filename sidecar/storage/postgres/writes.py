"""Writes of messages to a team database: ingest, pins, prune steps, re-imports; shared rows carry no secret.

What a teammate can read (the shared row) has every secret replaced by a marker (``sidecar.storage.secrets``);
the owner's verbatim text goes to ``private_values`` in the same transaction, which only its owner reads.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import psycopg

from sidecar.engine.messages import MessageRow
from sidecar.rows import Anchors, ItemRow, SessionRow, StorageFailure, StorageUnavailable, prune_rule_parts, utcnow
from sidecar.storage.postgres.connection import Pool
from sidecar.storage.postgres.positions import Positions
from sidecar.storage.postgres.spool import IngestRecord, Spool, SpooledMessage
from sidecar.storage.secrets import redact, redact_json
from sidecar.storage.tail import TailCache

PRUNABLE_BOUND = ("(role = 'tool' AND tokens > %s AND NOT (string_to_array(coalesce(tool_name, ''), ',') && "
                  "%s::text[]))")
"""A tool output pruning may replace under a rule given as parameters (placeholder tokens, protected tools)."""


def prunable_bound(prune_rule: str) -> tuple[str, list[Any]]:
    """``PRUNABLE_BOUND`` and its parameters for a stored rule."""
    placeholder, protected = prune_rule_parts(prune_rule)
    return PRUNABLE_BOUND, [placeholder, protected]


def shared_message(raw: str, text: str) -> tuple[str, str, dict[str, str] | None]:
    """(raw, text) a teammate may read, and the owner's verbatim values when they differ."""
    shared_raw, shared_text = redact_json(raw), redact(text)
    if shared_raw is raw and shared_text is text:
        return raw, text, None
    return shared_raw, shared_text, {"raw": raw, "text": text}


class PgWrites:
    """The part of PgStorage that appends and changes messages."""

    _tails: TailCache
    _anchors: dict[str, tuple[int, Anchors]]
    _summary_items: dict[str, tuple[int, list[ItemRow]]]
    session: Callable[[str], SessionRow | None]
    _rows: Callable[..., list[tuple[Any, ...]]]
    _transaction: Callable[[], AbstractContextManager[psycopg.Connection]]
    _notify: Callable[[psycopg.Connection, str], None]
    _positions: Positions
    _spool: Spool
    _spool_ingest: Callable[[IngestRecord], None]
    _known_last: dict[str, str]
    _pool: Pool

    def ingest(self, session_id: str, rows: Sequence[MessageRow], info: dict[str, Any],
               prunable: Sequence[bool], prune_rule: str,
               originals: Sequence[Sequence[str] | None] | None = None) -> tuple[list[str], int]:
        """Store new messages at the end of the session's context, atomically; returns (ids, duplicates).

        With the server away (or ingests still waiting for it), the ingest joins the spool and answers success.
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
        sources = {msg_id: list(lines) for msg_id, lines in zip(ids, originals, strict=True)
                   if lines is not None} if originals else {}
        session = self.session(session_id)  # the last one read, with what waits in the spool, when away
        info = {key: value for key, value in info.items()
                if value is not None and (session is None or getattr(session, key) != value)}
        seqs = self._positions.take(len(fresh))
        record = IngestRecord(
            session_id, [SpooledMessage(msg_id, seq, row.role, row.raw, row.text, row.tool_name, row.tool_call_id,
                                        row.tool_call_ids, row.tokens, row.message_at or now, row.pinned, can_prune)
                         for seq, (msg_id, row, can_prune) in zip(seqs, fresh, strict=True)],
            info, prune_rule, sources, session is None or bool(info),
            session is not None and session.prunable_rule != prune_rule, now)
        if not self._spool:
            try:
                with self._transaction() as db:
                    stored = self._write_ingest(db, record)
                newest = [m.id for m in record.messages if m.id in stored]
                if newest:
                    self._known_last[session_id] = newest[-1]
                return ids, len(rows) - len(stored)
            except StorageUnavailable:
                pass  # perhaps committed, perhaps not: the spool's write of the same ids stores nothing twice
        self._spool_ingest(record)
        return ids, len(rows) - len(fresh)

    def _write_ingest(self, db: psycopg.Connection, record: IngestRecord) -> set[str]:
        """An ingest's statements, in the caller's transaction; returns the ids stored (not already there)."""
        session_id, now = record.session_id, record.created_at
        if record.upsert:
            self._upsert_session(db, session_id, record.info, record.prune_rule, now)
        stored: set[str] = set()
        if record.messages:
            shared = [shared_message(m.raw, m.text) for m in record.messages]
            with db.cursor() as cursor:
                cursor.executemany(
                    "INSERT INTO messages (session_id, id, seq, role, raw, text, tool_name, tool_call_id, "
                    "tool_call_ids, tokens, created_at, message_at, pinned) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, "
                    "%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING id",
                    [(session_id, m.id, m.seq, m.role, raw, text, m.tool_name, m.tool_call_id, m.tool_call_ids,
                      m.tokens, now, m.message_at, m.pinned)
                     for m, (raw, text, _) in zip(record.messages, shared, strict=True)],
                    returning=True)
                stored.update(msg_id for (msg_id,) in _results(cursor))
            private = [(session_id, "message", m.id, json.dumps(verbatim, ensure_ascii=False))
                       for m, (_, _, verbatim) in zip(record.messages, shared, strict=True)
                       if verbatim is not None and m.id in stored]
            if private:
                db.cursor().executemany("INSERT INTO private_values (session_id, kind, ref_id, value) "
                                        "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING", private)
        lines = {msg_id: lines for msg_id, lines in record.sources.items() if msg_id in stored}
        if lines:
            self._write_sources(db, session_id, lines, replace=False)
        if record.recount:
            self._recount(db, session_id, record.prune_rule)
        if stored or record.upsert:
            self._notify(db, session_id)
        return stored

    @staticmethod
    def _upsert_session(db: psycopg.Connection, session_id: str, info: dict[str, Any], prune_rule: str,
                        now: Any) -> None:
        metadata = json.dumps(info["metadata"]) if info.get("metadata") is not None else None
        try:
            db.execute(
                """
                INSERT INTO sessions (session_id, title, model, context_window, metadata, created_at, updated_at,
                                      prunable_rule, workspace, project)
                VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
                ON CONFLICT (session_id) DO UPDATE SET
                    workspace = coalesce(sessions.workspace, excluded.workspace),
                    project = coalesce(sessions.project, excluded.project),
                    title = coalesce(excluded.title, sessions.title),
                    model = coalesce(excluded.model, sessions.model),
                    context_window = coalesce(excluded.context_window, sessions.context_window),
                    metadata = coalesce(excluded.metadata, sessions.metadata)
                """,
                [session_id, redact(info["title"]) if info.get("title") else None, info.get("model"),
                 info.get("context_window"), redact(metadata) if metadata else None, now, now, prune_rule,
                 info.get("workspace"), info.get("project")])
        except psycopg.errors.InsufficientPrivilege as error:
            # Row security: the id is another role's session, which this role may not write.
            raise StorageFailure(f"session {session_id!r} belongs to another member of the team database; "
                                 "use another session id") from error

    def last_message_id(self, session_id: str) -> str | None:
        """The id of the session's newest message (the highest seq); None when it has none; while the server is
        away, the newest spooled or last known."""
        try:
            rows = self._rows("SELECT id FROM messages WHERE session_id = %s ORDER BY seq DESC LIMIT 1", [session_id])
        except StorageUnavailable:
            spooled = [m.id for r in self._spool.pending if r.session_id == session_id for m in r.messages]
            if spooled:
                return spooled[-1]
            if session_id in self._known_last:
                return self._known_last[session_id]
            raise
        found = str(rows[0][0]) if rows else None
        if found is not None:
            self._known_last[session_id] = found
        return found

    @staticmethod
    def _recount(db: psycopg.Connection, session_id: str, prune_rule: str) -> None:
        """Recount the prunable totals of a session's stored items under ``prune_rule``, live ones too."""
        condition, params = prunable_bound(prune_rule)
        pruned = (f"FROM (SELECT tokens FROM context_items c WHERE c.session_id = s.session_id "
                  f"AND c.kind = 'message' AND c.position <= s.pruned_upto AND {condition} "
                  f"UNION ALL SELECT tokens FROM messages m WHERE m.session_id = s.session_id "
                  f"AND m.seq > s.live_after AND m.seq <= s.pruned_upto AND {condition}) counted")
        db.execute(
            f"""
            UPDATE sessions s SET prunable_rule = %s,
                prunable_count = (SELECT count(*) FROM context_items c WHERE c.session_id = s.session_id
                    AND c.kind = 'message' AND {condition}),
                prunable_tokens = (SELECT coalesce(sum(tokens), 0) FROM context_items c
                    WHERE c.session_id = s.session_id AND c.kind = 'message' AND {condition}),
                pruned_count = (SELECT count(*) {pruned}),
                pruned_tokens = (SELECT coalesce(sum(tokens), 0) {pruned})
            WHERE session_id = %s
            """,
            [prune_rule, *params, *params, *params, *params, *params, *params, session_id])

    def recount_prunable(self, session_id: str, prune_rule: str) -> None:
        """Recount the prunable totals (after a compaction, or when the rule changed)."""
        with self._transaction() as db:
            self._recount(db, session_id, prune_rule)

    def advance_prune(self, session_id: str, upto: int, count: int, tokens: int) -> SessionRow | None:
        """Move the prune frontier forward to ``upto``: a new revision (nothing when another got there first)."""
        with self._transaction() as db:
            changed = db.execute(
                "UPDATE sessions SET pruned_upto = %s, pruned_count = pruned_count + %s, "
                "pruned_tokens = pruned_tokens + %s, revision = revision + 1 WHERE session_id = %s "
                "AND pruned_upto < %s RETURNING 1", [upto, count, tokens, session_id, upto]).fetchall()
            if changed:
                self._notify(db, session_id)
        return self.session(session_id)

    def tool_names(self, session_id: str, call_ids: Sequence[str], near_position: int | None) -> dict[str, str]:
        """Tool names of recent assistant tool calls by call id."""
        if not call_ids or near_position is None or self._pool.down_since is not None:
            return {}  # with the server away: unnamed (a name only decides whether a result may be pruned)
        # The names are in the shared raw too: a marker never replaces a tool call's id or name.
        rows = self._rows("SELECT raw FROM messages WHERE session_id = %s AND seq > %s AND role = 'assistant' "
                          "AND tool_call_ids && %s::text[]", [session_id, near_position - 5000, list(call_ids)])
        names: dict[str, str] = {}
        for (raw,) in rows:
            for call in json.loads(raw).get("tool_calls") or ():
                names[call["id"]] = call["function"]["name"]
        return names

    def record_reported_usage(self, session_id: str, tokens: int, calibration: float) -> None:
        """Store provider-reported tokens, valid until the session's next change."""
        session = self.session(session_id)
        if session is None:
            return
        with self._transaction() as db:
            db.execute("UPDATE sessions SET reported_tokens = %s, reported_revision = %s, calibration = %s "
                       "WHERE session_id = %s", [tokens, session.revision, calibration, session_id])
            self._notify(db, session_id)

    def delete_session(self, session_id: str) -> bool:
        """Remove every row of the session; whether it existed."""
        if self.session(session_id) is None:
            return False
        self._tails.drop(session_id)
        self._anchors.pop(session_id, None)
        self._summary_items.pop(session_id, None)
        with self._transaction() as db:
            for table in ("summary_sources", "context_items", "summaries", "message_sources", "messages",
                          "agent_compactions", "private_values", "sessions"):
                db.execute(f"DELETE FROM {table} WHERE session_id = %s", [session_id])
            self._notify(db, session_id)
        return True

    def set_pinned(self, session_id: str, ids: Sequence[str], pinned: bool) -> tuple[list[str], list[str]]:
        """Pin or unpin messages by id: (ids changed, ids not messages of the session); nothing changes when
        any id is unknown. A change is a new revision of the context."""
        unique = list(dict.fromkeys(ids))
        rows = dict(self._rows("SELECT id, pinned FROM messages WHERE session_id = %s AND id = ANY(%s::text[])",
                               [session_id, unique]))
        missing = [msg_id for msg_id in unique if msg_id not in rows]
        changed = [msg_id for msg_id in unique if msg_id in rows and rows[msg_id] != pinned]
        if missing or not changed:
            return ([] if missing else changed), missing
        with self._transaction() as db:
            db.execute("UPDATE messages SET pinned = %s WHERE session_id = %s AND id = ANY(%s::text[])",
                       [pinned, session_id, changed])
            db.execute("UPDATE sessions SET revision = revision + 1, updated_at = %s WHERE session_id = %s",
                       [utcnow(), session_id])
            self._notify(db, session_id)
        self._anchors.pop(session_id, None)
        return changed, []

    def replace_messages(self, session_id: str, replacements: Sequence[tuple[str, MessageRow]]) -> int:
        """Rewrite stored messages at their positions, atomically; returns how many changed (see DuckDB's)."""
        session = self.session(session_id)
        if session is None or not replacements:
            return 0
        changed = 0
        delta = 0
        with self._transaction() as db:
            for old_id, row in replacements:
                new_id = row.id or old_id
                raw, text, verbatim = shared_message(row.raw, row.text)
                updated = db.execute(
                    "UPDATE messages SET id = %s, role = %s, raw = %s, text = %s, tool_name = %s, tool_call_id = %s, "
                    "tool_call_ids = %s, tokens = %s WHERE session_id = %s AND id = %s RETURNING seq",
                    [new_id, row.role, raw, text, row.tool_name, row.tool_call_id, row.tool_call_ids, row.tokens,
                     session_id, old_id]).fetchall()
                if not updated:
                    continue
                changed += 1
                delta += sum(row.tokens - tokens for (tokens,) in db.execute(
                    "SELECT tokens FROM context_items WHERE session_id = %s AND kind = 'message' AND ref_id = %s",
                    [session_id, old_id]).fetchall())
                db.execute(
                    "UPDATE context_items SET ref_id = %s, role = %s, tokens = %s, tool_name = %s, tool_call_id = %s, "
                    "tool_call_ids = %s WHERE session_id = %s AND kind = 'message' AND ref_id = %s",
                    [new_id, row.role, row.tokens, row.tool_name, row.tool_call_id, row.tool_call_ids, session_id,
                     old_id])
                db.execute("DELETE FROM private_values WHERE session_id = %s AND kind = 'message' AND ref_id = %s",
                           [session_id, old_id])
                if verbatim is not None:
                    db.execute("INSERT INTO private_values (session_id, kind, ref_id, value) VALUES (%s, 'message', "
                               "%s, %s) ON CONFLICT (session_id, kind, ref_id) DO UPDATE SET value = excluded.value",
                               [session_id, new_id, json.dumps(verbatim, ensure_ascii=False)])
                if new_id != old_id:
                    db.execute("UPDATE summary_sources SET source_id = %s WHERE session_id = %s AND "
                               "source_kind = 'message' AND source_id = %s", [new_id, session_id, old_id])
                    db.execute("UPDATE message_sources SET id = %s WHERE session_id = %s AND id = %s",
                               [new_id, session_id, old_id])
                    db.execute("UPDATE private_values SET ref_id = %s WHERE session_id = %s AND kind = 'lines' "
                               "AND ref_id = %s", [new_id, session_id, old_id])
            if changed:
                db.execute("UPDATE sessions SET revision = revision + 1, context_tokens = context_tokens + %s "
                           "WHERE session_id = %s", [delta, session_id])
                if session.prunable_rule is not None:
                    self._recount(db, session_id, session.prunable_rule)
                self._notify(db, session_id)
        self._tails.drop(session_id)
        return changed

    def store_sources(self, session_id: str, sources: Mapping[str, Sequence[str]]) -> None:
        """Keep each message's original transcript lines beside it (replacing older ones); atomic."""
        if sources:
            with self._transaction() as db:
                self._write_sources(db, session_id, sources, replace=True)

    @staticmethod
    def _write_sources(db: psycopg.Connection, session_id: str, sources: Mapping[str, Sequence[str]],
                       replace: bool) -> None:
        """message_sources rows (redacted) and the owner's verbatim lines where they differ."""
        conflict = "ON CONFLICT (session_id, id) DO UPDATE SET lines = excluded.lines" if replace else \
            "ON CONFLICT DO NOTHING"
        shared = {msg_id: [redact(line) for line in lines] for msg_id, lines in sources.items()}
        db.cursor().executemany(f"INSERT INTO message_sources (session_id, id, lines) VALUES (%s, %s, %s) {conflict}",
                                [(session_id, msg_id, json.dumps(lines, ensure_ascii=False))
                                 for msg_id, lines in shared.items()])
        private = [(session_id, msg_id, json.dumps({"lines": list(sources[msg_id])}, ensure_ascii=False))
                   for msg_id, lines in shared.items() if any(a is not b for a, b in zip(lines, sources[msg_id],
                                                                                         strict=True))]
        if private:
            db.cursor().executemany(
                "INSERT INTO private_values (session_id, kind, ref_id, value) VALUES (%s, 'lines', %s, %s) "
                + ("ON CONFLICT (session_id, kind, ref_id) DO UPDATE SET value = excluded.value" if replace
                   else "ON CONFLICT DO NOTHING"), private)

    def message_sources(self, session_id: str, ids: Sequence[str]) -> dict[str, list[str]]:
        """The original transcript lines of imported messages, by message id (the owner's verbatim ones)."""
        if not ids:
            return {}
        rows = self._rows(
            "SELECT s.id, coalesce(p.value->'lines', s.lines::jsonb)::text FROM message_sources s LEFT JOIN "
            "private_values p ON p.session_id = s.session_id AND p.kind = 'lines' AND p.ref_id = s.id "
            "WHERE s.session_id = %s AND s.id = ANY(%s::text[])", [session_id, list(ids)])
        return {msg_id: json.loads(lines) for msg_id, lines in rows}


def _results(cursor: psycopg.Cursor[Any]) -> Iterator[tuple[Any, ...]]:
    """Every row returned by an ``executemany(..., returning=True)``, statement after statement."""
    while True:
        yield from cursor.fetchall()
        if not cursor.nextset():
            break
