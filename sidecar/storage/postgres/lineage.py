"""Summary lineage and compaction writes in a team database: the part of PgStorage that knows the DAG.

A compaction's transaction locks its session's row and reads the session again inside it: another host may
have added messages since the compaction was planned (they stay live), and only the row's lock makes what
this transaction writes agree with what it read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import attrs
import psycopg

from sidecar.rows import (
    AgentCompactionRow,
    Anchors,
    ReplacedSpan,
    SessionRow,
    SourceMessage,
    StorageFailure,
    SummaryRow,
    utcnow,
)
from sidecar.storage.postgres.session_sql import SESSION_SQL
from sidecar.storage.secrets import redact
from sidecar.storage.tail import TailCache

SUMMARY_COLUMNS = ("id, kind, depth, content, tokens, source_tokens, message_count, earliest_at, latest_at, "
                   "summarizer, created_at, rules, rules_left_out")


def shared_summary(row: SummaryRow) -> tuple[SummaryRow, dict[str, Any] | None]:
    """The summary a teammate may read, and the owner's verbatim fields when they differ."""
    content = redact(row.content)
    rules = [redact(rule) for rule in row.rules] if row.rules else row.rules
    left_out = [redact(rule) for rule in row.rules_left_out] if row.rules_left_out else row.rules_left_out
    if content is row.content and rules == row.rules and left_out == row.rules_left_out:
        return row, None
    return (attrs.evolve(row, content=content, rules=rules, rules_left_out=left_out),
            {"content": row.content, "rules": row.rules, "rules_left_out": row.rules_left_out})


class PgLineage:
    """Reads and writes of summaries, their sources, and the context items they replace."""

    _tails: TailCache
    _anchors: dict[str, tuple[int, Anchors]]
    _rows: Callable[..., list[tuple[Any, ...]]]
    _transaction: Callable[[], AbstractContextManager[psycopg.Connection]]
    _notify: Callable[[psycopg.Connection, str], None]
    _session: Callable[[Sequence[Any]], SessionRow]

    def _private(self, session_id: str, kind: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The owner's verbatim values of rows with a secret replaced (none for a teammate: row security)."""
        if not ids:
            return {}
        return dict(self._rows("SELECT ref_id, value FROM private_values WHERE session_id = %s AND kind = %s "
                               "AND ref_id = ANY(%s::text[])", [session_id, kind, list(ids)]))

    def summaries(self, session_id: str, ids: Sequence[str]) -> dict[str, SummaryRow]:
        """Summaries by id."""
        if not ids:
            return {}
        rows = self._rows(f"SELECT {SUMMARY_COLUMNS} FROM summaries WHERE session_id = %s AND id = ANY(%s::text[])",
                          [session_id, list(ids)])
        found = {row[0]: SummaryRow(*row) for row in rows}
        for summary_id, value in self._private(session_id, "summary", list(found)).items():
            found[summary_id] = attrs.evolve(found[summary_id], **value)
        return found

    def summary(self, session_id: str, summary_id: str) -> SummaryRow | None:
        """A summary by id."""
        return self.summaries(session_id, [summary_id]).get(summary_id)

    def sources(self, session_id: str, summary_id: str) -> list[tuple[str, str]]:
        """What a summary replaced, in order, as (kind, id)."""
        return [(kind, ref) for kind, ref in self._rows(
            "SELECT source_kind, source_id FROM summary_sources WHERE session_id = %s AND summary_id = %s ORDER BY ord",
            [session_id, summary_id])]

    def parents(self, session_id: str, kind: str, ref_id: str) -> list[str]:
        """Summaries that list this message or summary among their sources."""
        return [row[0] for row in self._rows(
            "SELECT summary_id FROM summary_sources WHERE session_id = %s AND source_kind = %s AND source_id = %s "
            "ORDER BY summary_id", [session_id, kind, ref_id])]

    def covering_summaries(self, session_id: str, message_ids: Sequence[str]) -> dict[str, str]:
        """For each compacted message among ``message_ids``, the summary of the current context that stands for it."""
        if not message_ids:
            return {}
        rows = self._rows(
            """
            WITH RECURSIVE up(message_id, summary_id, depth) AS (
                SELECT source_id, summary_id, 1 FROM summary_sources
                WHERE session_id = %s AND source_kind = 'message' AND source_id = ANY(%s::text[])
                UNION ALL
                SELECT up.message_id, s.summary_id, up.depth + 1 FROM up JOIN summary_sources s
                    ON s.session_id = %s AND s.source_kind = 'summary' AND s.source_id = up.summary_id
            )
            SELECT DISTINCT ON (up.message_id) up.message_id, up.summary_id FROM up
            JOIN context_items c ON c.session_id = %s AND c.kind = 'summary' AND c.ref_id = up.summary_id
            ORDER BY up.message_id, up.depth
            """,
            [session_id, list(message_ids), session_id, session_id])
        return dict(rows)

    def source_messages(self, session_id: str, spans: Sequence[tuple[int, int]]) -> list[SourceMessage]:
        """The text and time of the session's messages whose seq lies in one of the (first, last) spans."""
        if not spans:
            return []
        ranges = " OR ".join("m.seq BETWEEN %s AND %s" for _ in spans)
        rows = self._rows(
            "SELECT m.seq, coalesce(p.value->>'text', m.text), m.message_at FROM messages m LEFT JOIN private_values p "
            "ON p.session_id = m.session_id AND p.kind = 'message' AND p.ref_id = m.id "
            f"WHERE m.session_id = %s AND ({ranges}) ORDER BY m.seq",
            [session_id, *[bound for span in spans for bound in span]])
        return list(map(SourceMessage._make, rows))

    def agent_compactions(self, session_id: str) -> list[AgentCompactionRow]:
        """The compactions the session's agent made itself, oldest first."""
        rows = self._rows("SELECT summary_id, compaction_id, source, trigger, text, recorded_at FROM agent_compactions "
                          "WHERE session_id = %s ORDER BY recorded_at", [session_id])
        found = [AgentCompactionRow(*row) for row in rows]
        private = self._private(session_id, "compaction", [row.summary_id for row in found])
        return [attrs.evolve(row, text=private[row.summary_id]["text"]) if row.summary_id in private else row
                for row in found]

    def apply_compaction(self, session_id: str, summaries: Sequence[SummaryRow],
                         sources: Sequence[tuple[str, Sequence[tuple[str, str]]]], replaced: ReplacedSpan,
                         added: Sequence[tuple[int, str, int]], pruned: tuple[int, int, int] | None = None,
                         agent: AgentCompactionRow | None = None) -> None:
        """Store summaries and lineage, and swap context items, in one transaction (see the DuckDB store's)."""
        with self._transaction() as db:
            if not db.execute("SELECT 1 FROM sessions WHERE session_id = %s FOR UPDATE", [session_id]).fetchall():
                raise StorageFailure("the session was deleted during compaction")
            session = self._session(db.execute(f"{SESSION_SQL} WHERE s.session_id = %s", [session_id]).fetchall()[0])
            self._apply(db, session, summaries, sources, replaced, added, pruned, agent)
            self._notify(db, session_id)
        self._anchors.pop(session_id, None)

    def _apply(self, db: psycopg.Connection, session: SessionRow, summaries: Sequence[SummaryRow],
               sources: Sequence[tuple[str, Sequence[tuple[str, str]]]], replaced: ReplacedSpan,
               added: Sequence[tuple[int, str, int]], pruned: tuple[int, int, int] | None,
               agent: AgentCompactionRow | None) -> None:
        """apply_compaction's statements, in its transaction, the session's row locked."""
        session_id, now = session.session_id, utcnow()
        added_tokens = sum(tokens for _, _, tokens in added)
        live_after = session.last_position if session.live_count and session.last_position is not None \
            else session.live_after
        kept = list(replaced.kept)
        deleted = db.execute("DELETE FROM context_items WHERE session_id = %s AND position BETWEEN %s AND %s "
                             "AND NOT position = ANY(%s::bigint[])",
                             [session_id, replaced.first, replaced.last, kept]).rowcount
        written = 0
        if added:
            db.cursor().executemany(
                "INSERT INTO context_items (session_id, position, kind, ref_id, role, tokens) "
                "VALUES (%s, %s, 'summary', %s, 'user', %s)",
                [(session_id, position, ref, tokens) for position, ref, tokens in added])
            written += len(added)
        if session.live_count:
            written += db.execute(
                "INSERT INTO context_items (session_id, position, kind, ref_id, role, tokens, tool_name, tool_call_id, "
                "tool_call_ids) SELECT session_id, seq, 'message', id, role, tokens, tool_name, tool_call_id, "
                "tool_call_ids FROM messages WHERE session_id = %s AND seq > %s AND seq <= %s "
                "AND (seq < %s OR seq > %s OR seq = ANY(%s::bigint[]))",
                [session_id, session.live_after, live_after, replaced.first, replaced.last, kept]).rowcount
        live_replaced = session.live_count - (written - len(added))
        if deleted + live_replaced != replaced.count:
            raise StorageFailure("the context changed during compaction")
        if db.execute("SELECT count(*) FROM messages WHERE session_id = %s AND seq BETWEEN %s AND %s AND pinned "
                      "AND NOT seq = ANY(%s::bigint[])", [session_id, replaced.first, replaced.last, kept]
                      ).fetchall()[0][0]:
            raise StorageFailure("the context changed during compaction: a message it replaces was pinned")
        if summaries:
            shared = [shared_summary(row) for row in summaries]
            db.cursor().executemany(
                f"INSERT INTO summaries (session_id, {SUMMARY_COLUMNS}) VALUES (%s, {', '.join(['%s'] * 13)})",
                [(session_id, *(getattr(row, column) for column in SUMMARY_COLUMNS.split(", ")))
                 for row, _ in shared])
            private = [(session_id, row.id, json.dumps(verbatim, ensure_ascii=False)) for row, verbatim in shared
                       if verbatim is not None]
            if private:
                db.cursor().executemany("INSERT INTO private_values (session_id, kind, ref_id, value) "
                                        "VALUES (%s, 'summary', %s, %s)", private)
        if sources:
            db.cursor().executemany(
                "INSERT INTO summary_sources (session_id, summary_id, ord, source_kind, source_id) "
                "VALUES (%s, %s, %s, %s, %s)",
                [(session_id, summary_id, ord_, kind, ref) for summary_id, items in sources
                 for ord_, (kind, ref) in enumerate(items)])
        if agent is not None:
            text = redact(agent.text)
            db.execute("INSERT INTO agent_compactions (session_id, summary_id, compaction_id, source, trigger, text, "
                       "recorded_at) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                       [session_id, agent.summary_id, agent.compaction_id, agent.source, agent.trigger, text,
                        agent.recorded_at])
            if text is not agent.text:
                db.execute("INSERT INTO private_values (session_id, kind, ref_id, value) VALUES (%s, 'compaction', "
                           "%s, %s)", [session_id, agent.summary_id, json.dumps({"text": agent.text})])
        # The stored row counts the context up to live_after: the live messages just written as items join it, and
        # its first position with them (a context that was all live had none stored; reads start from it).
        db.execute(
            """
            UPDATE sessions SET
                message_count = %s, summary_count = summary_count + %s, context_tokens = %s, context_count = %s,
                first_position = %s, last_position = %s, revision = %s, prunable_count = %s, prunable_tokens = %s,
                live_after = %s, updated_at = %s, pruned_upto = %s, pruned_count = %s, pruned_tokens = %s
            WHERE session_id = %s
            """,
            [session.message_count, len(summaries), session.context_tokens - replaced.tokens + added_tokens,
             session.context_count - replaced.count + len(added), session.first_position, session.last_position,
             session.revision + 1,
             session.prunable_count - replaced.prunable_count, session.prunable_tokens - replaced.prunable_tokens,
             live_after, now, *(pruned if pruned is not None else (session.pruned_upto, session.pruned_count,
                                                                  session.pruned_tokens)), session_id])
