"""Anchored context items: system and pinned messages, which compaction, pruning and the budget leave alone."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import attrs
import duckdb

from sidecar.rows import NO_ANCHORS, Anchors, ItemRow, SessionRow, utcnow

_COLUMNS = "seq, 'message', id, role, tokens, tool_name, tool_call_id, tool_call_ids"
class AnchorQueries:
    """The part of Storage that knows pinned and system messages, cached per session."""

    _db: duckdb.DuckDBPyConnection
    _sessions: dict[str, SessionRow]
    _anchors: dict[str, Anchors]
    _summary_items: dict[str, tuple[int, list[ItemRow]]]
    _transaction: Callable[..., AbstractContextManager[None]]
    session: Callable[[str], SessionRow | None]

    def anchors(self, session: SessionRow) -> Anchors:
        """The session's anchored items; read once, then kept up to date by ingest and pin."""
        cached = self._anchors.get(session.session_id)
        if cached is None:
            cached = self._anchors[session.session_id] = self._read_anchors(session)
        return cached

    def summary_items(self, session: SessionRow) -> list[ItemRow]:
        """The summaries in the session's context, in order: read once per compaction (every compaction adds a
        summary, so the session's summary count names its context's summaries)."""
        if not session.summary_count:
            return []
        cached = self._summary_items.get(session.session_id)
        if cached is not None and cached[0] == session.summary_count:
            return cached[1]
        rows = self._db.execute(
            "SELECT position, kind, ref_id, role, tokens, tool_name, tool_call_id, tool_call_ids FROM context_items "
            "WHERE session_id = ? AND kind = 'summary' AND position BETWEEN ? AND ? ORDER BY position",
            [session.session_id, session.first_position or 0, session.live_after]).fetchall()
        items = [ItemRow._make(row) for row in rows]
        self._summary_items[session.session_id] = (session.summary_count, items)
        return items

    def _read_anchors(self, session: SessionRow) -> Anchors:
        if session.last_position is None:
            return NO_ANCHORS
        items = self._anchor_rows(session, "(pinned OR role = 'system')", [])
        if not items:
            return NO_ANCHORS
        # A pinned call or result anchors its whole unit: the call and every result of it.
        answered = [item.tool_call_id for item in items if item.role == "tool" and item.tool_call_id]
        if answered:
            items += self._anchor_rows(session, "tool_call_ids IS NOT NULL AND len(list_intersect(tool_call_ids, "
                                       "?::VARCHAR[])) > 0", [answered])
        calls = [call for item in items for call in item.tool_call_ids or ()]
        if calls:
            items += self._anchor_rows(session, "role = 'tool' AND tool_call_id IN (SELECT unnest(?::VARCHAR[]))",
                                       [calls])
        unique = sorted({item.position: item for item in items}.values())
        return Anchors(unique, frozenset(item.position for item in unique),
                       frozenset(item.position for item in unique if item.role == "system"), frozenset(calls))

    def _anchor_rows(self, session: SessionRow, condition: str, params: list[Any]) -> list[ItemRow]:
        """The session's messages meeting ``condition`` that are still in the context (not compacted)."""
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM messages WHERE session_id = ? AND {condition}",
                                [session.session_id, *params]).fetchall()
        # Few rows: their items are looked up by position, not by a join over the whole context.
        stored = [row[0] for row in rows if row[0] <= session.live_after]
        present = {position for (position,) in self._db.execute(
            "SELECT position FROM context_items WHERE session_id = ? AND kind = 'message' AND position BETWEEN ? "
            "AND ? AND position IN (SELECT unnest(?::BIGINT[]))",
            [session.session_id, min(stored), max(stored), stored]).fetchall()} if stored else set()
        return [ItemRow._make(row) if row[-1] is None else ItemRow._make((*row[:-1], tuple(row[-1]))) for row in rows
                if row[0] > session.live_after or row[0] in present]

    def note_anchors(self, session_id: str, items: Sequence[ItemRow], pinned: Sequence[bool]) -> None:
        """Keep the cached anchors true after ``items`` were appended to the context."""
        entry = self._anchors.get(session_id)
        if entry is None:
            return
        added: list[ItemRow] = []
        calls = set(entry.calls)
        for item, pin in zip(items, pinned, strict=True):
            if pin and item.role == "tool" and item.tool_call_id not in calls:
                self._anchors.pop(session_id, None)  # its call is older: read them again when needed
                return
            if pin or item.role == "system" or (item.role == "tool" and item.tool_call_id in calls):
                added.append(item)
                calls.update(item.tool_call_ids or ())
        if added:
            self._anchors[session_id] = Anchors(
                entry.items + added, entry.positions | {item.position for item in added},
                entry.system | {item.position for item in added if item.role == "system"}, frozenset(calls))

    def set_pinned(self, session_id: str, ids: Sequence[str], pinned: bool) -> tuple[list[str], list[str]]:
        """Pin or unpin messages by id: (ids changed, ids not messages of the session); nothing changes when
        any id is unknown. A change is a new revision of the context."""
        unique = list(dict.fromkeys(ids))
        rows = dict(self._db.execute("SELECT id, pinned FROM messages WHERE session_id = ? AND id IN "
                                     "(SELECT unnest(?::VARCHAR[]))", [session_id, unique]).fetchall())
        missing = [msg_id for msg_id in unique if msg_id not in rows]
        changed = [msg_id for msg_id in unique if msg_id in rows and rows[msg_id] != pinned]
        if missing or not changed:
            return ([] if missing else changed), missing
        session = self.session(session_id)
        now = utcnow()
        with self._transaction():
            self._db.execute("UPDATE messages SET pinned = ? WHERE session_id = ? AND id IN "
                             "(SELECT unnest(?::VARCHAR[]))", [pinned, session_id, changed]).fetchall()
            self._db.execute("UPDATE sessions SET revision = revision + 1, updated_at = ? WHERE session_id = ?",
                             [now, session_id]).fetchall()
        self._anchors.pop(session_id, None)
        if session is not None:
            self._sessions[session_id] = attrs.evolve(session, revision=session.revision + 1, updated_at=now)
        return changed, []
