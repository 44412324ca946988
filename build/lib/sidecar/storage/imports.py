"""Import writes: stored messages rewritten in place when a transcript grew, and original transcript lines."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import duckdb

from sidecar.engine.messages import MessageRow
from sidecar.rows import SessionRow
from sidecar.storage.tail import TailCache


class ImportWrites:
    """The part of Storage that lets a re-import converge on what one import of the final file stores."""

    _db: duckdb.DuckDBPyConnection
    _sessions: dict[str, SessionRow]
    _tails: TailCache
    session: Callable[[str], SessionRow | None]
    _transaction: Callable[..., AbstractContextManager[None]]
    _prunable_recount: Callable[[str, str], tuple[str, list[Any]]]

    def replace_messages(self, session_id: str, replacements: Sequence[tuple[str, MessageRow]]) -> int:
        """Rewrite stored messages at their positions, atomically: (stored id, new row); returns how many changed.

        For an imported transcript that grew: a stand-in tool result becomes the real one (and takes its id), an
        assistant message gains the tool calls written after its text. Context items and summary lineage follow
        the id; the session's totals are recounted and its revision bumped, so cached reads are retired.
        """
        session = self.session(session_id)
        if session is None or not replacements:
            return 0
        changed = 0
        delta = 0
        with self._transaction():
            for old_id, row in replacements:
                new_id = row.id or old_id
                updated = self._db.execute(
                    "UPDATE messages SET id = ?, role = ?, raw = ?, text = ?, tool_name = ?, tool_call_id = ?, "
                    "tool_call_ids = ?::VARCHAR[], tokens = ? WHERE session_id = ? AND id = ? RETURNING seq",
                    [new_id, row.role, row.raw, row.text, row.tool_name, row.tool_call_id, row.tool_call_ids,
                     row.tokens, session_id, old_id]).fetchall()
                if not updated:
                    continue
                changed += 1
                delta += sum(row.tokens - tokens for (tokens,) in self._db.execute(
                    "SELECT tokens FROM context_items WHERE session_id = ? AND kind = 'message' AND ref_id = ?",
                    [session_id, old_id]).fetchall())
                self._db.execute(
                    "UPDATE context_items SET ref_id = ?, role = ?, tokens = ?, tool_name = ?, tool_call_id = ?, "
                    "tool_call_ids = ?::VARCHAR[] WHERE session_id = ? AND kind = 'message' AND ref_id = ?",
                    [new_id, row.role, row.tokens, row.tool_name, row.tool_call_id, row.tool_call_ids,
                     session_id, old_id]).fetchall()
                if new_id != old_id:
                    self._db.execute(
                        "UPDATE summary_sources SET source_id = ? WHERE session_id = ? AND source_kind = 'message' "
                        "AND source_id = ?", [new_id, session_id, old_id]).fetchall()
                    self._db.execute("UPDATE message_sources SET id = ? WHERE session_id = ? AND id = ?",
                                     [new_id, session_id, old_id]).fetchall()
            if changed:
                # Live messages are summed when the session is read; stored items' tokens are in the row. The
                # revision moves on so that nothing cached for the old one is reused.
                self._db.execute("UPDATE sessions SET revision = revision + 1, context_tokens = context_tokens + ? "
                                 "WHERE session_id = ?", [delta, session_id]).fetchall()
                if session.prunable_rule is not None:
                    self._db.execute(*self._prunable_recount(session_id, session.prunable_rule)).fetchall()
        self._sessions.pop(session_id, None)
        self._tails.drop(session_id)
        return changed

    def store_sources(self, session_id: str, sources: Mapping[str, Sequence[str]]) -> None:
        """Keep each message's original transcript lines, verbatim, beside it (replacing older ones); atomic."""
        if not sources:
            return
        ids = list(sources)
        with self._transaction():
            self._db.execute(
                "INSERT OR REPLACE INTO message_sources SELECT ?, unnest(?::VARCHAR[]), unnest(?::VARCHAR[])",
                [session_id, ids, [json.dumps(list(sources[i]), ensure_ascii=False) for i in ids]]).fetchall()

    def message_sources(self, session_id: str, ids: Sequence[str]) -> dict[str, list[str]]:
        """The original transcript lines of imported messages, by message id."""
        if not ids:
            return {}
        rows = self._db.execute(
            "SELECT id, lines FROM message_sources WHERE session_id = ? AND id IN (SELECT unnest(?))",
            [session_id, list(ids)]).fetchall()
        return {msg_id: json.loads(lines) for msg_id, lines in rows}
