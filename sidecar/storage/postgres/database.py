"""PgStorage: the store on a team's PostgreSQL server; sessions, the context, lookups and search.

Several hosts (machines) write one database, so nothing read is trusted from memory but what a revision pins:
a session is read afresh on every call (one indexed query), and the caches (the tail of a context, its anchors)
are valid for one revision of it. Row-level security decides what this role reads; the owner's verbatim text,
where the shared row has a secret replaced, is in ``private_values`` and overlaid here (the table only ever
shows a role its own rows, so a teammate's read finds nothing to overlay).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from operator import itemgetter
from typing import Any

import attrs
import psycopg
from psycopg import errors as pg_errors

from sidecar.config.database import shown
from sidecar.rows import Anchors, ItemRow, SearchHit, SessionRow, StorageFailure, StorageUnavailable, StoredMessage
from sidecar.storage.context_reads import ContextReads
from sidecar.storage.live import SESSION_COLUMNS, session_from_row, with_live
from sidecar.storage.postgres.connection import RETRY_SECONDS, Pool, connection_options
from sidecar.storage.postgres.lineage import PgLineage
from sidecar.storage.postgres.listener import Listener
from sidecar.storage.postgres.locks import AdvisoryLock
from sidecar.storage.postgres.migrations import MIGRATIONS
from sidecar.storage.postgres.positions import Positions
from sidecar.storage.postgres.session_sql import SESSION_SQL
from sidecar.storage.postgres.sessions_copy import PgCopies
from sidecar.storage.postgres.spool import IngestRecord, Spool, spool_path
from sidecar.storage.postgres.writes import PgWrites
from sidecar.storage.tail import TailCache

log = logging.getLogger(__name__)

ITEM_COLUMNS = "position, kind, ref_id, role, tokens, tool_name, tool_call_id, tool_call_ids"
LIVE_ITEM_COLUMNS = "seq, 'message', id, role, tokens, tool_name, tool_call_id, tool_call_ids"
MESSAGE_RAW = "coalesce(p.value->>'raw', m.raw)"
MESSAGE_TEXT = "coalesce(p.value->>'text', m.text)"
PRIVATE_MESSAGE = ("LEFT JOIN private_values p ON p.session_id = m.session_id AND p.kind = 'message' "
                   "AND p.ref_id = m.id")
"""The owner's verbatim message beside the shared one (row security shows a teammate none)."""


def _item(row: Sequence[Any]) -> ItemRow:
    return ItemRow._make(row) if row[-1] is None else ItemRow._make((*row[:-1], tuple(row[-1])))


class PgStorage(PgWrites, PgLineage, PgCopies, ContextReads):
    """A team's PostgreSQL database of sessions, read and written as this role under row-level security."""

    def __init__(self, pool: Pool, url: str) -> None:
        self._pool = pool
        self.url = url
        self.path = shown(url)
        self.invalidated = False
        self._listener: Listener | None = None
        self.origin = uuid.uuid4().hex[:12]
        """This store's name in notifications, so that it does not take its own writes for another's."""
        self._tails = TailCache()
        self._anchors: dict[str, tuple[int, Anchors]] = {}
        self._summary_items: dict[str, tuple[int, list[ItemRow]]] = {}
        """Per session: (its summary count then, the summaries in its context), see ``summary_items``."""
        self.role = ""
        self._known: dict[str, SessionRow] = {}
        """The last row read of each session: what an ingest answers from while the server is away."""
        self._cached: dict[str, SessionRow] = {}
        """This role's own sessions as last read, while the listener hears every other host's change to them (so
        a read per request, not per call); a teammate's session is read afresh each time (a revoke holds at once).
        Our own writes and every notification drop an entry."""
        self._known_last: dict[str, str] = {}
        """The newest message id of each session, as last known."""
        self._positions = Positions(lambda: int(self._scalar("SELECT nextval('positions')")))
        self._spool = Spool(spool_path(url))
        self._stopping = threading.Event()
        pool.on_down = self._start_drain
        if self._spool:  # a host stopped before the server came back left these
            self._start_drain()

    @classmethod
    def open(cls, url: str) -> PgStorage:
        """Connect (checking the URL, credentials and schema, each failure one line) and open the pool."""
        pool = Pool(url)
        pool.open()
        store = cls(pool, url)
        store.role = str(store._scalar("SELECT current_user"))
        return store

    def migrations(self) -> list[str]:
        """Names of the applied migrations, oldest first."""
        return [row[0] for row in self._rows("SELECT name FROM schema_migrations ORDER BY name")]

    @staticmethod
    def known_migrations() -> list[str]:
        return [name for name, _ in MIGRATIONS]

    def session_lock(self, session_id: str) -> AdvisoryLock:
        """The advisory lock a compaction of the session holds, across every host of the database."""
        return AdvisoryLock(self._pool, session_id)

    def listen(self, on_change: Callable[[str | None], None]) -> None:
        """Hear the other hosts' writes (LISTEN/NOTIFY), on a thread and a connection of its own."""
        if self._listener is None:
            def heard(session_id: str | None) -> None:
                if session_id is None:
                    self._cached.clear()
                else:
                    self._cached.pop(session_id, None)
                on_change(session_id)

            self._listener = Listener(self.url, self.origin, heard)
            self._listener.start()

    def close(self) -> None:
        """Close every connection (spooled ingests stay in their file for the next host)."""
        self._stopping.set()
        if self._listener is not None:
            self._listener.stop()
        self._pool.close()

    # The server away

    def _spool_ingest(self, record: IngestRecord) -> None:
        self._spool.add(record)
        self._start_drain()

    def _start_drain(self) -> None:
        """Send the spooled ingests (and find the server back) on a thread, unless one does already."""
        def connected() -> psycopg.Connection:
            return psycopg.connect(self.url, autocommit=True, **connection_options(self.url))

        def write(db: psycopg.Connection, records: list[IngestRecord]) -> None:
            with db.transaction():
                for record in records:
                    self._write_ingest(db, record)

        self._spool.drain(connected, write, self._pool.mark_up, self._stopping, RETRY_SECONDS)

    def _offline_session(self, session_id: str, cause: StorageUnavailable) -> SessionRow | None:
        """The session as last read, with the ingests that wait for the server; re-raises ``cause`` if unknown."""
        pending = [record for record in self._spool.pending if record.session_id == session_id]
        base = self._known.get(session_id)
        if base is None and not pending:
            raise cause
        if base is None:
            first, info = pending[0], pending[0].info
            base = SessionRow(session_id, info.get("title"), info.get("model"), info.get("context_window"),
                              info.get("metadata"), first.created_at, first.created_at, 0, 0, 0, 0, None, None, 0,
                              1.0, None, None, prunable_rule=first.prune_rule, workspace=info.get("workspace"),
                              project=info.get("project"))
        messages = [message for record in pending for message in record.messages]
        if not messages:
            return base
        prunable = [message.tokens for message in messages if message.prunable]
        found = with_live(base, len(messages), sum(m.tokens for m in messages), len(prunable), sum(prunable),
                          min(m.seq for m in messages), max(m.seq for m in messages), pending[-1].created_at)
        return attrs.evolve(found, live_count=base.live_count + len(messages))

    def checkpoint(self) -> None:
        """Nothing to settle: the server has every write once it is acknowledged."""

    def reopen(self) -> None:
        """Nothing to reopen: a lost connection is replaced on the next request."""

    def note_failure(self, error: BaseException) -> None:
        """Nothing to note: connection failures are noted where they happen (``Pool``)."""

    # Statements

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._pool.connection() as db:
            return db.execute(sql, params).fetchall()

    def _scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        rows = self._rows(sql, params)
        return rows[0][0] if rows else None

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[psycopg.Connection]:
        """A transaction on the loop's connection, committed at the end, rolled back on any error; the sessions
        cached are read again after it (whatever it changed)."""
        try:
            with self._pool.connection() as db, db.transaction():
                yield db
        finally:
            self._cached.clear()

    def _notify(self, db: psycopg.Connection, session_id: str) -> None:
        """Tell the other hosts the session changed (sent at commit): ids only, never text."""
        from sidecar.storage.postgres.migrations import CHANNEL

        self._cached.pop(session_id, None)
        db.execute("SELECT pg_notify(%s, %s)", [CHANNEL, f"{self.origin} {session_id}"])

    # Sessions

    def session(self, session_id: str) -> SessionRow | None:
        """The session as stored now, with its live messages; None when there is none this role may read.

        With the server away: as last read, plus what waits in the spool (what an ingest's answer needs).
        """
        trusted = self._listener is not None and self._listener.connected.is_set() and not self._spool \
            and self._pool.down_since is None
        if trusted and (cached := self._cached.get(session_id)) is not None:
            return cached
        try:
            rows = self._rows(f"{SESSION_SQL} WHERE s.session_id = %s", [session_id])
        except StorageUnavailable as error:
            return self._offline_session(session_id, error)
        if not rows:
            self._known.pop(session_id, None)
            return None
        found = self._known[session_id] = self._session(rows[0])
        if trusted and rows[0][-1]:
            self._cached[session_id] = found
        return found

    def _session(self, row: Sequence[Any]) -> SessionRow:
        width = len(SESSION_COLUMNS.split(", "))
        count, tokens, prunable_count, prunable_tokens, first, last, latest = row[width:width + 7]
        return with_live(session_from_row(row[:width]), count, tokens, prunable_count, prunable_tokens, first, last,
                         latest)

    def sessions(self) -> list[SessionRow]:
        """Every session this role may read, most recently updated first."""
        found = [self._session(row) for row in self._rows(SESSION_SQL)]
        return sorted(found, key=lambda session: session.updated_at, reverse=True)

    def session_ids(self, prefix: str) -> list[str]:
        """The ids of the sessions whose id starts with ``prefix``."""
        return [row[0] for row in self._rows("SELECT session_id FROM sessions WHERE starts_with(session_id, %s) "
                                             "ORDER BY session_id", [prefix])]

    def owns(self, session: SessionRow) -> bool:
        """Whether this role owns the session (may write it)."""
        return bool(self._scalar("SELECT owner = current_user FROM sessions WHERE session_id = %s",
                                 [session.session_id]))

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
            parts.append(f"SELECT {ITEM_COLUMNS} FROM context_items WHERE session_id = %s AND position > %s "
                         "AND position <= %s")
            params += [session.session_id, low, min(high, session.live_after)]
        if high > session.live_after and session.live_count:
            parts.append(f"SELECT {LIVE_ITEM_COLUMNS} FROM messages WHERE session_id = %s AND seq > %s AND seq <= %s")
            params += [session.session_id, max(low, session.live_after), high]
        if not parts:
            return []
        rows = self._rows(" UNION ALL ".join(parts), params)
        rows.sort(key=itemgetter(0))
        return [_item(row) for row in rows]

    def anchors(self, session: SessionRow) -> Anchors:
        """The session's anchored items, read once per revision of its context."""
        cached = self._anchors.get(session.session_id)
        if cached is not None and cached[0] == session.revision:
            return cached[1]
        found = self._read_anchors(session)
        self._anchors[session.session_id] = (session.revision, found)
        return found

    def summary_items(self, session: SessionRow) -> list[ItemRow]:
        """The summaries in the session's context, in order: read once per compaction (each adds a summary, so the
        session's summary count names its context's summaries)."""
        if not session.summary_count:
            return []
        cached = self._summary_items.get(session.session_id)
        if cached is not None and cached[0] == session.summary_count:
            return cached[1]
        items = [_item(row) for row in self._rows(
            f"SELECT {ITEM_COLUMNS} FROM context_items WHERE session_id = %s AND kind = 'summary' ORDER BY position",
            [session.session_id])]
        self._summary_items[session.session_id] = (session.summary_count, items)
        return items

    def _read_anchors(self, session: SessionRow) -> Anchors:
        from sidecar.rows import NO_ANCHORS

        if session.last_position is None:
            return NO_ANCHORS
        items = self._anchor_rows(session, "(pinned OR role = 'system')", [])
        if not items:
            return NO_ANCHORS
        # A pinned call or result anchors its whole unit: the call and every result of it.
        answered = [item.tool_call_id for item in items if item.role == "tool" and item.tool_call_id]
        if answered:
            items += self._anchor_rows(session, "tool_call_ids && %s::text[]", [answered])
        calls = [call for item in items for call in item.tool_call_ids or ()]
        if calls:
            items += self._anchor_rows(session, "role = 'tool' AND tool_call_id = ANY(%s::text[])", [calls])
        unique = sorted({item.position: item for item in items}.values())
        return Anchors(unique, frozenset(item.position for item in unique),
                       frozenset(item.position for item in unique if item.role == "system"), frozenset(calls))

    def _anchor_rows(self, session: SessionRow, condition: str, params: list[Any]) -> list[ItemRow]:
        """The session's messages meeting ``condition`` that are still in the context (not compacted)."""
        rows = self._rows(f"SELECT {LIVE_ITEM_COLUMNS} FROM messages WHERE session_id = %s AND {condition}",
                          [session.session_id, *params])
        stored = [row[0] for row in rows if row[0] <= session.live_after]
        present = {position for (position,) in self._rows(
            "SELECT position FROM context_items WHERE session_id = %s AND kind = 'message' "
            "AND position = ANY(%s::bigint[])", [session.session_id, stored])} if stored else set()
        return [_item(row) for row in rows if row[0] > session.live_after or row[0] in present]

    def message_raws(self, session_id: str, seqs: Sequence[int]) -> dict[int, str]:
        """Verbatim JSON of messages by seq (the owner's own text where the shared row has a secret replaced)."""
        if not seqs:
            return {}
        return dict(self._rows(f"SELECT m.seq, {MESSAGE_RAW} FROM messages m {PRIVATE_MESSAGE} "
                               "WHERE m.session_id = %s AND m.seq = ANY(%s::bigint[])", [session_id, list(seqs)]))

    def message(self, session_id: str, message_id: str) -> StoredMessage | None:
        """A stored message by id."""
        return self.messages_by_id(session_id, [message_id]).get(message_id)

    def messages_by_id(self, session_id: str, ids: Sequence[str]) -> dict[str, StoredMessage]:
        """Stored messages by id."""
        if not ids:
            return {}
        rows = self._rows(f"SELECT m.id, m.seq, m.role, {MESSAGE_RAW}, m.tokens, m.created_at, m.message_at, m.pinned "
                          f"FROM messages m {PRIVATE_MESSAGE} WHERE m.session_id = %s AND m.id = ANY(%s::text[])",
                          [session_id, list(ids)])
        return {row[0]: StoredMessage(*row) for row in rows}

    def rule_and_call_messages(self, session_id: str) -> list[tuple[str, str]]:
        """(raw, text) of the session's user and system messages and tool calls, in order."""
        return [(raw, text) for raw, text in self._rows(
            f"SELECT {MESSAGE_RAW}, {MESSAGE_TEXT} FROM messages m {PRIVATE_MESSAGE} WHERE m.session_id = %s AND "
            "(m.role IN ('user', 'system') OR m.tool_call_ids IS NOT NULL) ORDER BY m.seq", [session_id])]

    # Search

    def search(self, session_id: str, scope: str, pattern: str, *, regex: bool, case_sensitive: bool,
               limit: int) -> list[SearchHit]:
        """Messages and/or summaries whose text matches ``pattern`` (a POSIX regex, or a literal), newest first.

        The shared text is searched through its trigram index; the owner's verbatim text of rows with a secret
        replaced (few rows) is searched beside it, so an owner finds what they wrote and a teammate the marker.
        """
        if regex:
            operator, value = ("~" if case_sensitive else "~*"), pattern
        else:
            operator = "LIKE" if case_sensitive else "ILIKE"
            value = "%" + re.sub(r"([\\%_])", r"\\\1", pattern) + "%"
        parts: list[str] = []
        params: list[Any] = []
        if scope in ("messages", "both"):
            parts.append(f"SELECT 'message' AS kind, m.id, m.seq AS position FROM messages m WHERE m.session_id = %s "
                         f"AND m.text {operator} %s")
            parts.append(f"SELECT 'message', p.ref_id, m.seq FROM private_values p JOIN messages m ON m.session_id = "
                         f"p.session_id AND m.id = p.ref_id WHERE p.session_id = %s AND p.kind = 'message' "
                         f"AND p.value->>'text' {operator} %s")
            params += [session_id, value, session_id, value]
        if scope in ("summaries", "both"):
            epoch = "(extract(epoch FROM s.created_at) * 1000)::bigint"
            parts.append(f"SELECT 'summary', s.id, {epoch} FROM summaries s WHERE s.session_id = %s "
                         f"AND s.content {operator} %s")
            parts.append(f"SELECT 'summary', s.id, {epoch} FROM private_values p JOIN summaries s ON s.session_id = "
                         f"p.session_id AND s.id = p.ref_id WHERE p.session_id = %s AND p.kind = 'summary' "
                         f"AND p.value->>'content' {operator} %s")
            params += [session_id, value, session_id, value]
        sql = (f"SELECT kind, id, position FROM (SELECT DISTINCT * FROM ({' UNION ALL '.join(parts)}) "
               "found (kind, id, position)) hits ORDER BY kind = 'summary' DESC, position DESC LIMIT %s")
        try:
            hits = self._rows(sql, [*params, limit])
        except StorageFailure as error:
            if isinstance(error.__cause__, pg_errors.InvalidRegularExpression):
                raise StorageFailure(f"invalid regular expression: {error}") from error
            raise
        texts = self._hit_texts(session_id, hits)
        return [SearchHit(kind, hit_id, texts[kind, hit_id], position) for kind, hit_id, position in hits]

    def _hit_texts(self, session_id: str, hits: list[tuple[Any, ...]]) -> dict[tuple[str, str], str]:
        message_ids = [hit_id for kind, hit_id, _ in hits if kind == "message"]
        summary_ids = [hit_id for kind, hit_id, _ in hits if kind == "summary"]
        texts: dict[tuple[str, str], str] = {}
        if message_ids:
            texts.update((("message", hit_id), text) for hit_id, text in self._rows(
                f"SELECT m.id, {MESSAGE_TEXT} FROM messages m {PRIVATE_MESSAGE} WHERE m.session_id = %s "
                "AND m.id = ANY(%s::text[])", [session_id, message_ids]))
        if summary_ids:
            texts.update((("summary", row.id), row.content) for row in self.summaries(session_id, summary_ids).values())
        return texts

    def check_regex(self, pattern: str) -> str | None:
        """PostgreSQL's complaint about a regular expression, or None when it compiles."""
        try:
            with self._pool.connection() as db:
                db.execute("SELECT '' ~ %s", [pattern]).fetchall()
        except StorageFailure as error:
            if isinstance(error.__cause__, pg_errors.InvalidRegularExpression):
                return str(error.__cause__).splitlines()[0]
            raise
        return None

    # Workspaces

    def message_spans(self, session_ids: Sequence[str]) -> dict[str, tuple[datetime, datetime]]:
        """Per session that has messages: the times of its first and last message."""
        if not session_ids:
            return {}
        rows = self._rows("SELECT session_id, min(message_at), max(message_at) FROM messages "
                          "WHERE session_id = ANY(%s::text[]) GROUP BY session_id", [list(session_ids)])
        return {session_id: (first, last) for session_id, first, last in rows}

    def holders(self, item_id: str, session_ids: Sequence[str]) -> list[tuple[str, str]]:
        """``(kind, session_id)`` of every summary or message with this id among the sessions."""
        if not session_ids:
            return []
        rows = self._rows(
            "SELECT 'summary', session_id FROM summaries WHERE id = %s AND session_id = ANY(%s::text[]) "
            "UNION ALL SELECT 'message', session_id FROM messages WHERE id = %s AND session_id = ANY(%s::text[])",
            [item_id, list(session_ids), item_id, list(session_ids)])
        return [(kind, session_id) for kind, session_id in rows]
