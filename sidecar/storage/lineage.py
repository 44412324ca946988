"""Summary lineage and compaction writes: the part of Storage that knows the DAG."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import attrs
import duckdb

from sidecar.storage.rows import SessionRow, SummaryRow, utcnow

_SUMMARY_COLUMNS = "id, kind, depth, content, tokens, source_tokens, message_count, earliest_at, latest_at, " \
    "summarizer, created_at"
_SUMMARY_CASTS = ("VARCHAR", "VARCHAR", "INTEGER", "VARCHAR", "INTEGER", "BIGINT", "BIGINT", "TIMESTAMP", "TIMESTAMP",
                  "VARCHAR", "TIMESTAMP")


@attrs.define(frozen=True)
class RemovedTotals:
    """What the context items a compaction replaces add up to, as the running totals count them."""

    tokens: int
    prunable_count: int
    prunable_tokens: int


class LineageQueries:
    """Reads and writes of summaries, their sources, and the context items they replace."""

    _db: duckdb.DuckDBPyConnection
    _scalar: Callable[..., Any]
    _write: Callable[[Iterable[tuple[str, Sequence[Any]]]], list[list[tuple[Any, ...]]]]
    _transaction: Callable[..., AbstractContextManager[None]]
    _sessions: dict[str, SessionRow]

    def summaries(self, session_id: str, ids: Sequence[str]) -> dict[str, SummaryRow]:
        """Summaries by id."""
        if not ids:
            return {}
        rows = self._db.execute(
            f"SELECT {_SUMMARY_COLUMNS} FROM summaries WHERE session_id = ? AND id IN (SELECT unnest(?))",
            [session_id, list(ids)],
        ).fetchall()
        return {row[0]: SummaryRow(*row) for row in rows}

    def in_context(self, session_id: str, kind: str, ref_id: str, position: int | None = None) -> bool:
        """Whether the message or summary is an item of the current context."""
        sql = "SELECT count(*) FROM context_items WHERE session_id = ? AND kind = ? AND ref_id = ?"
        params: list[Any] = [session_id, kind, ref_id]
        if position is not None:
            sql += " AND position = ?"
            params.append(position)
        return bool(self._scalar(sql, params))

    def summary(self, session_id: str, summary_id: str) -> SummaryRow | None:
        """A summary by id."""
        return self.summaries(session_id, [summary_id]).get(summary_id)

    def sources(self, session_id: str, summary_id: str) -> list[tuple[str, str]]:
        """What a summary replaced, in order, as (kind, id)."""
        return [tuple(row) for row in self._db.execute(
            "SELECT source_kind, source_id FROM summary_sources WHERE session_id = ? AND summary_id = ? ORDER BY ord",
            [session_id, summary_id],
        ).fetchall()]

    def parents(self, session_id: str, kind: str, ref_id: str) -> list[str]:
        """Summaries that list this message or summary among their sources."""
        return [row[0] for row in self._db.execute(
            "SELECT summary_id FROM summary_sources WHERE session_id = ? AND source_kind = ? AND source_id = ? "
            "ORDER BY summary_id",
            [session_id, kind, ref_id],
        ).fetchall()]

    def covering_summary(self, session_id: str, message_id: str) -> str | None:
        """The summary of the current context that stands for a compacted message, if any."""
        frontier = self.parents(session_id, "message", message_id)
        seen: set[str] = set()
        while frontier:
            summary_id = frontier.pop(0)
            if summary_id in seen:
                continue
            seen.add(summary_id)
            if self.in_context(session_id, "summary", summary_id):
                return summary_id
            frontier.extend(self.parents(session_id, "summary", summary_id))
        return None


    def nodes(self, session_id: str) -> list[tuple[Any, ...]]:
        """The whole current context with summary depth and kind: rows for ``compaction.plan.Node``."""
        return self._db.execute(
            """
            SELECT ci.position, ci.kind, ci.ref_id, ci.role, ci.tokens, coalesce(s.depth, 0), s.kind,
                   ci.tool_name, ci.tool_call_id, ci.tool_call_ids
            FROM context_items ci
            LEFT JOIN summaries s ON ci.kind = 'summary' AND s.session_id = ci.session_id AND s.id = ci.ref_id
            WHERE ci.session_id = ? ORDER BY ci.position
            """,
            [session_id],
        ).fetchall()

    def apply_compaction(self, session_id: str, summaries: Sequence[SummaryRow],
                         sources: Sequence[tuple[str, int, str, str]], removed: Sequence[int],
                         added: Sequence[tuple[int, str, int]], removed_totals: RemovedTotals) -> None:
        """Store summaries and lineage, and swap context items, in one transaction.

        ``sources`` are (summary id, order, kind, id); ``removed`` are positions of replaced items, whose
        token and prunable totals the caller read with them; ``added`` are (position, summary id, tokens)
        of the summary items that take their place. Fails, changing nothing, when a replaced item is no
        longer in the context.
        """
        removed = list(removed)
        with self._transaction():
            # The BETWEEN bounds let zone maps skip every row group outside the replaced span.
            deleted = self._db.execute(
                "DELETE FROM context_items WHERE session_id = ? AND position BETWEEN ? AND ? "
                "AND position IN (SELECT unnest(?::BIGINT[])) RETURNING position",
                [session_id, min(removed, default=0), max(removed, default=-1), removed]).fetchall()
            if len(deleted) != len(removed):
                raise duckdb.ConstraintException("the context changed during compaction")
            if summaries:
                columns = _SUMMARY_COLUMNS.split(", ")
                values = [[getattr(row, column) for row in summaries] for column in columns]
                selects = ", ".join(f"unnest(?::{cast}[])" for cast in _SUMMARY_CASTS)
                self._db.execute(f"INSERT INTO summaries (session_id, {_SUMMARY_COLUMNS}) SELECT ?, {selects}",
                                 [session_id, *values]).fetchall()
            if sources:
                self._db.execute(
                    "INSERT INTO summary_sources SELECT ?, unnest(?::VARCHAR[]), unnest(?::INTEGER[]), "
                    "unnest(?::VARCHAR[]), unnest(?::VARCHAR[])",
                    [session_id, *[list(column) for column in zip(*sources, strict=True)]]).fetchall()
            if added:
                self._db.execute(
                    "INSERT INTO context_items SELECT ?, unnest(?::BIGINT[]), 'summary', unnest(?::VARCHAR[]), "
                    "'user', unnest(?::INTEGER[]), NULL, NULL, NULL",
                    [session_id, *[list(column) for column in zip(*added, strict=True)]]).fetchall()
            self._db.execute(
                """
                UPDATE sessions SET
                    context_tokens = context_tokens - ? + ?, context_count = context_count - ? + ?,
                    summary_count = summary_count + ?, prunable_count = prunable_count - ?,
                    prunable_tokens = prunable_tokens - ?, first_position = least(first_position, ?),
                    revision = revision + 1, updated_at = ?
                WHERE session_id = ?
                """,
                [removed_totals.tokens, sum(tokens for _, _, tokens in added), len(removed), len(added),
                 len(summaries), removed_totals.prunable_count, removed_totals.prunable_tokens,
                 min([p for p, _, _ in added], default=None), utcnow(), session_id]).fetchall()
        self._sessions.pop(session_id, None)
