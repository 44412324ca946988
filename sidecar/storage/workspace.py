"""Reads across the sessions of a workspace: when each session's messages were written, and who holds an id."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import duckdb


class WorkspaceQueries:
    """The part of Storage that answers for several sessions at once."""

    _db: duckdb.DuckDBPyConnection

    def message_spans(self, session_ids: Sequence[str]) -> dict[str, tuple[datetime, datetime]]:
        """Per session that has messages: the times of its first and last message (as the transcript dated them)."""
        if not session_ids:
            return {}
        rows = self._db.execute("SELECT session_id, min(message_at), max(message_at) FROM messages "
                                "WHERE list_contains(?, session_id) GROUP BY session_id",
                                [list(session_ids)]).fetchall()
        return {session_id: (first, last) for session_id, first, last in rows}

    def holders(self, item_id: str, session_ids: Sequence[str]) -> list[tuple[str, str]]:
        """``(kind, session_id)`` of every summary or message with this id among the sessions."""
        if not session_ids:
            return []
        rows = self._db.execute(
            "SELECT 'summary', session_id FROM summaries WHERE id = ? AND list_contains(?, session_id) "
            "UNION ALL SELECT 'message', session_id FROM messages WHERE id = ? AND list_contains(?, session_id)",
            [item_id, list(session_ids), item_id, list(session_ids)]).fetchall()
        return [(kind, session_id) for kind, session_id in rows]
