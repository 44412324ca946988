"""Summary lineage and compaction writes: the part of Storage that knows the DAG."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import attrs
import duckdb

from sidecar.rows import (
    AgentCompactionRow,
    ItemRow,
    ReplacedSpan,
    SessionRow,
    SourceMessage,
    StorageFailure,
    SummaryRow,
    utcnow,
)
from sidecar.storage.tail import TailCache

_SUMMARY_COLUMNS = "id, kind, depth, content, tokens, source_tokens, message_count, earliest_at, latest_at, " \
    "summarizer, created_at, rules, rules_left_out"
_LIST_COLUMNS = {"rules", "rules_left_out"}
_NULLABLE_TIMES = {"earliest_at", "latest_at"}
"""Summary columns whose bound lists may hold only NULLs, so need a cast; a cast costs, so no other has one."""


class LineageQueries:
    """Reads and writes of summaries, their sources, and the context items they replace."""

    _db: duckdb.DuckDBPyConnection
    _scalar: Callable[..., Any]
    _write: Callable[[Iterable[tuple[str, Sequence[Any]]]], list[list[tuple[Any, ...]]]]
    _transaction: Callable[..., AbstractContextManager[None]]
    _tails: TailCache
    _sessions: dict[str, SessionRow]
    _anchors: dict[str, Any]
    session: Callable[[str], SessionRow | None]
    items: Callable[..., list[ItemRow]]

    def summaries(self, session_id: str, ids: Sequence[str]) -> dict[str, SummaryRow]:
        """Summaries by id."""
        if not ids:
            return {}
        rows = self._db.execute(
            f"SELECT {_SUMMARY_COLUMNS} FROM summaries WHERE session_id = ? AND id IN (SELECT unnest(?))",
            [session_id, list(ids)],
        ).fetchall()
        return {row[0]: SummaryRow(*row) for row in rows}

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

    def covering_summaries(self, session_id: str, message_ids: Sequence[str]) -> dict[str, str]:
        """For each compacted message among ``message_ids``, the summary of the current context that stands for it.

        One recursive query up the lineage for all of them: a chain of queries per message cost 3.8 ms each.
        A message in the context is left out: compaction takes a summary's sources out of the context, so
        no summary in it stands for a message that is still there.
        """
        if not message_ids:
            return {}
        rows = self._db.execute(
            """
            WITH RECURSIVE up(message_id, summary_id, depth) AS (
                SELECT source_id, summary_id, 1 FROM summary_sources
                WHERE session_id = ? AND source_kind = 'message' AND source_id IN (SELECT unnest(?))
                UNION ALL
                SELECT up.message_id, s.summary_id, up.depth + 1 FROM up JOIN summary_sources s
                    ON s.session_id = ? AND s.source_kind = 'summary' AND s.source_id = up.summary_id
            )
            SELECT up.message_id, arg_min(up.summary_id, up.depth) FROM up
            JOIN context_items c ON c.session_id = ? AND c.kind = 'summary' AND c.ref_id = up.summary_id
            GROUP BY up.message_id
            """,
            [session_id, list(message_ids), session_id, session_id]).fetchall()
        return dict(rows)

    def source_messages(self, session_id: str, spans: Sequence[tuple[int, int]]) -> list[SourceMessage]:
        """The text and time of the session's messages whose seq lies in one of the (first, last) spans."""
        if not spans:
            return []
        # Ranges, not a list of seqs: a semi-join on a bound list costs more than the rows it reads.
        ranges = " OR ".join("seq BETWEEN ? AND ?" for _ in spans)
        rows = self._db.execute(
            f"SELECT seq, text, message_at FROM messages WHERE session_id = ? AND seq BETWEEN ? AND ? "
            f"AND ({ranges})",
            [session_id, min(first for first, _ in spans), max(last for _, last in spans),
             *[bound for span in spans for bound in span]]).fetchall()
        return list(map(SourceMessage._make, rows))

    def agent_compactions(self, session_id: str) -> list[AgentCompactionRow]:
        """The compactions the session's agent made itself, oldest first."""
        rows = self._db.execute(
            "SELECT summary_id, compaction_id, source, trigger, text, recorded_at FROM agent_compactions "
            "WHERE session_id = ? ORDER BY recorded_at", [session_id]).fetchall()
        return [AgentCompactionRow(*row) for row in rows]

    def apply_compaction(self, session_id: str, summaries: Sequence[SummaryRow],
                         sources: Sequence[tuple[str, Sequence[tuple[str, str]]]], replaced: ReplacedSpan,
                         added: Sequence[tuple[int, str, int]], pruned: tuple[int, int, int] | None = None,
                         agent: AgentCompactionRow | None = None) -> None:
        """Store summaries and lineage, and swap context items, in one transaction.

        ``pruned`` (frontier, count, raw tokens) sets the prune frontier in the same rewrite; ``agent`` records the
        agent's own compaction that the summary stands for, in the same transaction.

        ``sources`` are (summary id, its sources in order as (kind, id)); ``added`` are (position, summary
        id, tokens) of the summary items that take the replaced items' place. Fails, changing nothing, when
        the replaced items are no longer exactly those in the context.
        """
        session = self.session(session_id)
        if session is None:
            raise StorageFailure("the session was deleted during compaction")
        now = utcnow()
        added_tokens = sum(tokens for _, _, tokens in added)
        # first_position stays: summaries take the positions of replaced items, which are never before it.
        after = attrs.evolve(
            session, context_tokens=session.context_tokens - replaced.tokens + added_tokens,
            context_count=session.context_count - replaced.count + len(added),
            summary_count=session.summary_count + len(summaries),
            prunable_count=session.prunable_count - replaced.prunable_count,
            prunable_tokens=session.prunable_tokens - replaced.prunable_tokens, revision=session.revision + 1,
            updated_at=now,
            live_after=session.last_position if session.live_count and session.last_position is not None
            else session.live_after,
            live_count=0)
        if pruned is not None:
            after = attrs.evolve(after, pruned_upto=pruned[0], pruned_count=pruned[1], pruned_tokens=pruned[2])
        self._apply(session, after, summaries, sources, replaced, added, agent)
        self._sessions[session_id] = after
        self._anchors.pop(session_id, None)

    def _apply(self, session: SessionRow, after: SessionRow, summaries: Sequence[SummaryRow],
               sources: Sequence[tuple[str, Sequence[tuple[str, str]]]], replaced: ReplacedSpan,
               added: Sequence[tuple[int, str, int]], agent: AgentCompactionRow | None = None) -> None:
        """apply_compaction's transaction."""
        session_id, now = session.session_id, after.updated_at
        kept_list = [list(replaced.kept)] if replaced.kept else []
        with self._transaction():
            # The BETWEEN bounds let zone maps skip every row group outside the replaced span.
            kept = " AND position NOT IN (SELECT unnest(?::BIGINT[]))" if replaced.kept else ""
            deleted = self._db.execute(
                f"DELETE FROM context_items WHERE session_id = ? AND position BETWEEN ? AND ?{kept}",
                [session_id, replaced.first, replaced.last, *kept_list],
            ).fetchall()[0][0]
            # One INSERT for the new summaries' items and for the live messages that stay, so that the
            # context is all in context_items again; the replaced live messages never need an item.
            parts: list[str] = []
            params: list[Any] = []
            if added:
                parts.append("SELECT ?, unnest(?), 'summary', unnest(?), 'user', unnest(?), NULL, NULL, NULL")
                params += [session_id, *[list(column) for column in zip(*added, strict=True)]]
            if session.live_count:
                kept = " OR seq IN (SELECT unnest(?::BIGINT[]))" if replaced.kept else ""
                parts.append("SELECT session_id, seq, 'message', id, role, tokens, tool_name, tool_call_id, "
                             f"tool_call_ids FROM messages WHERE session_id = ? AND seq > ? AND seq <= ? "
                             f"AND (seq < ? OR seq > ?{kept})")
                params += [session_id, session.live_after, after.live_after, replaced.first, replaced.last,
                           *kept_list]
            written = self._db.execute(f"INSERT INTO context_items {' UNION ALL '.join(parts)}",
                                       params).fetchall()[0][0] if parts else 0
            live_replaced = session.live_count - (written - len(added))
            if deleted + live_replaced != replaced.count:
                raise duckdb.ConstraintException("the context changed during compaction")
            # A message pinned since the compaction was planned must stay: the plan is stale.
            kept = " AND seq NOT IN (SELECT unnest(?::BIGINT[]))" if replaced.kept else ""
            if self._db.execute(f"SELECT count(*) FROM messages WHERE session_id = ? AND seq BETWEEN ? AND ? "
                                f"AND pinned{kept}", [session_id, replaced.first, replaced.last, *kept_list]
                                ).fetchall()[0][0]:
                raise duckdb.ConstraintException("the context changed during compaction: a message it replaces "
                                                 "was pinned")
            if summaries:
                columns = _SUMMARY_COLUMNS.split(", ")
                values = [[getattr(row, column) for row in summaries] for column in columns]
                selects = ", ".join("unnest(?::TIMESTAMP[])" if column in _NULLABLE_TIMES else
                                    "unnest(?::VARCHAR[][])" if column in _LIST_COLUMNS else "unnest(?)"
                                    for column in columns)
                self._db.execute(f"INSERT INTO summaries (session_id, {_SUMMARY_COLUMNS}) SELECT ?, {selects}",
                                 [session_id, *values]).fetchall()
            if sources:
                # One list per summary rather than one row per source: a third as many values to bind.
                self._db.execute(
                    "INSERT INTO summary_sources SELECT ?, summary_id, generate_subscripts(ids, 1) - 1, "
                    "unnest(kinds), unnest(ids) FROM (SELECT unnest(?) AS summary_id, unnest(?) AS kinds, "
                    "unnest(?) AS ids)",
                    [session_id, [summary_id for summary_id, _ in sources],
                     [[kind for kind, _ in items] for _, items in sources],
                     [[ref for _, ref in items] for _, items in sources]]).fetchall()
            if agent is not None:
                self._db.execute("INSERT INTO agent_compactions VALUES (?, ?, ?, ?, ?, ?, ?)",
                                 [session_id, agent.summary_id, agent.compaction_id, agent.source, agent.trigger,
                                  agent.text, agent.recorded_at]).fetchall()
            # With no live messages left, the stored row is the whole session again: written from memory,
            # which counts exactly what the database holds, since this process is its only writer.
            self._db.execute(
                """
                UPDATE sessions SET
                    message_count = ?, summary_count = ?, context_tokens = ?, context_count = ?,
                    first_position = ?, last_position = ?, revision = ?, prunable_count = ?, prunable_tokens = ?,
                    live_after = ?, updated_at = ?, pruned_upto = ?, pruned_count = ?, pruned_tokens = ?
                WHERE session_id = ?
                """,
                [after.message_count, after.summary_count, after.context_tokens, after.context_count,
                 after.first_position, after.last_position, after.revision, after.prunable_count,
                 after.prunable_tokens, after.live_after, now, after.pruned_upto, after.pruned_count,
                 after.pruned_tokens, session_id]).fetchall()
