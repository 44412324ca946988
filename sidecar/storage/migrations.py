"""Schema migrations: an append-only list of named steps, each recorded when applied."""

from __future__ import annotations

from collections.abc import Callable

import duckdb

Migration = Callable[[duckdb.DuckDBPyConnection], None]


def m001_initial(db: duckdb.DuckDBPyConnection) -> None:
    """Sessions, verbatim messages, summaries, the ordered context, and summary lineage."""
    db.execute(
        """
        CREATE TABLE sessions (
            session_id VARCHAR PRIMARY KEY,
            title VARCHAR,
            model VARCHAR,
            context_window INTEGER,
            metadata VARCHAR,
            created_at TIMESTAMP NOT NULL,
            updated_at TIMESTAMP NOT NULL,
            message_count BIGINT NOT NULL DEFAULT 0,
            summary_count BIGINT NOT NULL DEFAULT 0,
            context_tokens BIGINT NOT NULL DEFAULT 0,
            context_count BIGINT NOT NULL DEFAULT 0,
            first_position BIGINT,
            last_position BIGINT,
            revision BIGINT NOT NULL DEFAULT 0,
            calibration DOUBLE NOT NULL DEFAULT 1.0,
            reported_tokens BIGINT,
            reported_revision BIGINT
        )
        """
    )
    # seq is the global position the message got at ingest; zone maps on it make range reads cheap.
    db.execute(
        """
        CREATE TABLE messages (
            session_id VARCHAR NOT NULL,
            id VARCHAR NOT NULL,
            seq BIGINT NOT NULL,
            role VARCHAR NOT NULL,
            raw VARCHAR NOT NULL,
            text VARCHAR NOT NULL,
            tool_name VARCHAR,
            tool_call_id VARCHAR,
            tool_call_ids VARCHAR[],
            tokens INTEGER NOT NULL,
            created_at TIMESTAMP NOT NULL,
            message_at TIMESTAMP NOT NULL,
            PRIMARY KEY (session_id, id)
        )
        """
    )
    db.execute(
        """
        CREATE TABLE summaries (
            session_id VARCHAR NOT NULL,
            id VARCHAR NOT NULL,
            kind VARCHAR NOT NULL,
            depth INTEGER NOT NULL,
            content VARCHAR NOT NULL,
            tokens INTEGER NOT NULL,
            source_tokens BIGINT NOT NULL,
            message_count BIGINT NOT NULL,
            earliest_at TIMESTAMP,
            latest_at TIMESTAMP,
            summarizer VARCHAR NOT NULL,
            created_at TIMESTAMP NOT NULL,
            PRIMARY KEY (session_id, id)
        )
        """
    )
    # The current context of each session: messages and summaries by increasing position (gaps allowed).
    db.execute(
        """
        CREATE TABLE context_items (
            session_id VARCHAR NOT NULL,
            position BIGINT NOT NULL,
            kind VARCHAR NOT NULL,
            ref_id VARCHAR NOT NULL,
            role VARCHAR NOT NULL,
            tokens INTEGER NOT NULL,
            tool_name VARCHAR,
            tool_call_id VARCHAR,
            tool_call_ids VARCHAR[]
        )
        """
    )
    # Lineage: what each summary replaced, in order (messages for a leaf, summaries for a condensed one).
    db.execute(
        """
        CREATE TABLE summary_sources (
            session_id VARCHAR NOT NULL,
            summary_id VARCHAR NOT NULL,
            ord INTEGER NOT NULL,
            source_kind VARCHAR NOT NULL,
            source_id VARCHAR NOT NULL
        )
        """
    )


def m002_prunable_totals(db: duckdb.DuckDBPyConnection) -> None:
    """Running totals of prunable tool outputs per session, so usage needs no scan of old history."""
    db.execute("ALTER TABLE sessions ADD COLUMN prunable_count BIGINT NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE sessions ADD COLUMN prunable_tokens BIGINT NOT NULL DEFAULT 0")
    # The rule the totals were counted under; another rule (settings changed) means a recount.
    db.execute("ALTER TABLE sessions ADD COLUMN prunable_rule VARCHAR")


def m003_live_messages(db: duckdb.DuckDBPyConnection) -> None:
    """Messages newer than ``live_after`` are in the context without a context_items row.

    Ingest then writes one row, not two plus a session update: a DuckDB statement costs about a millisecond.
    A compaction writes the live messages' items before it replaces any (``Storage.apply_compaction``).
    Every message stored so far already has its item, so each session starts with none live.
    """
    db.execute("ALTER TABLE sessions ADD COLUMN live_after BIGINT NOT NULL DEFAULT 0")
    db.execute(
        """
        UPDATE sessions SET live_after = greatest(coalesce(last_position, 0),
            coalesce((SELECT max(seq) FROM messages m WHERE m.session_id = sessions.session_id), 0))
        """
    )


def m004_pinned_rules(db: duckdb.DuckDBPyConnection) -> None:
    """Pinned messages (never compacted, pruned or dropped) and the standing rules a summary carries."""
    db.execute("ALTER TABLE messages ADD COLUMN pinned BOOLEAN NOT NULL DEFAULT false")
    db.execute("ALTER TABLE summaries ADD COLUMN rules VARCHAR[]")
    db.execute("ALTER TABLE summaries ADD COLUMN rules_left_out VARCHAR[]")


def m005_message_sources(db: duckdb.DuckDBPyConnection) -> None:
    """The original transcript lines an imported message was converted from, verbatim (a JSON array of strings)."""
    db.execute(
        """
        CREATE TABLE message_sources (
            session_id VARCHAR NOT NULL,
            id VARCHAR NOT NULL,
            lines VARCHAR NOT NULL,
            PRIMARY KEY (session_id, id)
        )
        """
    )


def m006_session_workspace(db: duckdb.DuckDBPyConnection) -> None:
    """The workspace a session belongs to: the client's root, or the agent's working directory; NULL before."""
    db.execute("ALTER TABLE sessions ADD COLUMN workspace VARCHAR")


def m007_prune_frontier(db: duckdb.DuckDBPyConnection) -> None:
    """Persisted, monotonic pruning: prunable tool outputs at positions up to ``pruned_upto`` stay pruned.

    ``pruned_count``/``pruned_tokens`` total those outputs (raw estimates), so a step needs no scan of old history.
    """
    db.execute("ALTER TABLE sessions ADD COLUMN pruned_upto BIGINT NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE sessions ADD COLUMN pruned_count BIGINT NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE sessions ADD COLUMN pruned_tokens BIGINT NOT NULL DEFAULT 0")


def m008_agent_compactions(db: duckdb.DuckDBPyConnection) -> None:
    """Compactions agents made themselves (memory/recordCompaction, or found in a transcript), each once.

    ``text`` is the summary with whitespace folded, so a second record of the same compaction is recognised by its
    words when it comes without the agent's id (or wrapped, as Claude Code's transcript wraps its summary).
    """
    db.execute(
        """
        CREATE TABLE agent_compactions (
            session_id VARCHAR NOT NULL,
            summary_id VARCHAR NOT NULL,
            compaction_id VARCHAR,
            source VARCHAR NOT NULL,
            trigger VARCHAR,
            text VARCHAR NOT NULL,
            recorded_at TIMESTAMP NOT NULL
        )
        """
    )


def m009_session_project(db: duckdb.DuckDBPyConnection) -> None:
    """The project a session belongs to (its workspace's git remote as host/owner/repo), kept beside the workspace
    so that a session copied to a team database keeps it; NULL: none known."""
    db.execute("ALTER TABLE sessions ADD COLUMN project VARCHAR")


MIGRATIONS: list[tuple[str, Migration]] = [
    ("001_initial", m001_initial),
    ("002_prunable_totals", m002_prunable_totals),
    ("003_live_messages", m003_live_messages),
    ("004_pinned_rules", m004_pinned_rules),
    ("005_message_sources", m005_message_sources),
    ("006_session_workspace", m006_session_workspace),
    ("007_prune_frontier", m007_prune_frontier),
    ("008_agent_compactions", m008_agent_compactions),
    ("009_session_project", m009_session_project),
]
