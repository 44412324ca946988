"""PostgreSQL migrations: named and ordered like DuckDB's (``sidecar.storage.migrations``), then the team's own.

Run only by ``context-sidecar --db URL db migrate``, as the role that owns the database (an ordinary role); a
sidecar connecting as a member checks the recorded names (``schema_state``) and never changes the schema.
Every table has an ``owner`` (the role that wrote the row, ``current_user`` by default): row-level security
(``010_row_security``) lets a member write only their own rows and read their own sessions and those of the
projects they were granted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import psycopg

from sidecar.storage.postgres.positions import BLOCK

Migration = Callable[[psycopg.Connection], None]

OWNER = "owner name NOT NULL DEFAULT current_user"
"""The role that wrote the row: what row-level security compares with ``current_user``."""
CHANNEL = "context_sidecar"
"""The LISTEN/NOTIFY channel of session changes; payloads carry ids only (any role may listen)."""
TABLES = ("sessions", "messages", "summaries", "context_items", "summary_sources", "message_sources",
          "agent_compactions", "private_values")
"""The tables of session rows, each with an ``owner``: what a member may read and write under row security."""
READ_ONLY_TABLES = ("grants", "schema_migrations")
"""What a member reads and never writes (its own grants; the schema's version)."""


def m001_initial(db: psycopg.Connection) -> None:
    """Sessions, verbatim messages, summaries, the ordered context, and summary lineage; positions from a sequence."""
    db.execute(f"""
        CREATE TABLE sessions (
            session_id text PRIMARY KEY,
            {OWNER},
            title text,
            model text,
            context_window integer,
            metadata text,
            created_at timestamp NOT NULL,
            updated_at timestamp NOT NULL,
            message_count bigint NOT NULL DEFAULT 0,
            summary_count bigint NOT NULL DEFAULT 0,
            context_tokens bigint NOT NULL DEFAULT 0,
            context_count bigint NOT NULL DEFAULT 0,
            first_position bigint,
            last_position bigint,
            revision bigint NOT NULL DEFAULT 0,
            calibration double precision NOT NULL DEFAULT 1.0,
            reported_tokens bigint,
            reported_revision bigint
        )""")
    # Positions are global and only grow, as DuckDB's: one sequence every host draws blocks from (positions.py).
    db.execute(f"CREATE SEQUENCE positions INCREMENT BY {BLOCK}")
    db.execute(f"""
        CREATE TABLE messages (
            session_id text NOT NULL,
            id text NOT NULL,
            {OWNER},
            seq bigint NOT NULL,
            role text NOT NULL,
            raw text NOT NULL,
            text text NOT NULL,
            tool_name text,
            tool_call_id text,
            tool_call_ids text[],
            tokens integer NOT NULL,
            created_at timestamp NOT NULL,
            message_at timestamp NOT NULL,
            PRIMARY KEY (session_id, id)
        )""")
    db.execute("CREATE INDEX messages_by_seq ON messages (session_id, seq)")
    db.execute(f"""
        CREATE TABLE summaries (
            session_id text NOT NULL,
            id text NOT NULL,
            {OWNER},
            kind text NOT NULL,
            depth integer NOT NULL,
            content text NOT NULL,
            tokens integer NOT NULL,
            source_tokens bigint NOT NULL,
            message_count bigint NOT NULL,
            earliest_at timestamp,
            latest_at timestamp,
            summarizer text NOT NULL,
            created_at timestamp NOT NULL,
            PRIMARY KEY (session_id, id)
        )""")
    db.execute(f"""
        CREATE TABLE context_items (
            session_id text NOT NULL,
            position bigint NOT NULL,
            {OWNER},
            kind text NOT NULL,
            ref_id text NOT NULL,
            role text NOT NULL,
            tokens integer NOT NULL,
            tool_name text,
            tool_call_id text,
            tool_call_ids text[]
        )""")
    db.execute("CREATE INDEX context_items_by_position ON context_items (session_id, position)")
    db.execute("CREATE INDEX context_items_by_ref ON context_items (session_id, kind, ref_id)")
    db.execute(f"""
        CREATE TABLE summary_sources (
            session_id text NOT NULL,
            summary_id text NOT NULL,
            {OWNER},
            ord integer NOT NULL,
            source_kind text NOT NULL,
            source_id text NOT NULL
        )""")
    db.execute("CREATE INDEX summary_sources_by_summary ON summary_sources (session_id, summary_id, ord)")
    db.execute("CREATE INDEX summary_sources_by_source ON summary_sources (session_id, source_kind, source_id)")


def m002_prunable_totals(db: psycopg.Connection) -> None:
    """Running totals of prunable tool outputs per session, so usage needs no scan of old history."""
    db.execute("ALTER TABLE sessions ADD COLUMN prunable_count bigint NOT NULL DEFAULT 0, "
               "ADD COLUMN prunable_tokens bigint NOT NULL DEFAULT 0, ADD COLUMN prunable_rule text")


def m003_live_messages(db: psycopg.Connection) -> None:
    """Messages newer than ``live_after`` are in the context without a context_items row (see DuckDB's 003)."""
    db.execute("ALTER TABLE sessions ADD COLUMN live_after bigint NOT NULL DEFAULT 0")


def m004_pinned_rules(db: psycopg.Connection) -> None:
    """Pinned messages and the standing rules a summary carries."""
    db.execute("ALTER TABLE messages ADD COLUMN pinned boolean NOT NULL DEFAULT false")
    db.execute("ALTER TABLE summaries ADD COLUMN rules text[], ADD COLUMN rules_left_out text[]")


def m005_message_sources(db: psycopg.Connection) -> None:
    """The original transcript lines an imported message was converted from (a JSON array of strings)."""
    db.execute(f"""
        CREATE TABLE message_sources (
            session_id text NOT NULL,
            id text NOT NULL,
            {OWNER},
            lines text NOT NULL,
            PRIMARY KEY (session_id, id)
        )""")


def m006_session_workspace(db: psycopg.Connection) -> None:
    """The workspace a session belongs to."""
    db.execute("ALTER TABLE sessions ADD COLUMN workspace text")


def m007_prune_frontier(db: psycopg.Connection) -> None:
    """Persisted, monotonic pruning (see DuckDB's 007)."""
    db.execute("ALTER TABLE sessions ADD COLUMN pruned_upto bigint NOT NULL DEFAULT 0, "
               "ADD COLUMN pruned_count bigint NOT NULL DEFAULT 0, ADD COLUMN pruned_tokens bigint NOT NULL DEFAULT 0")


def m008_agent_compactions(db: psycopg.Connection) -> None:
    """Compactions agents made themselves, each once."""
    db.execute(f"""
        CREATE TABLE agent_compactions (
            session_id text NOT NULL,
            summary_id text NOT NULL,
            {OWNER},
            compaction_id text,
            source text NOT NULL,
            trigger text,
            text text NOT NULL,
            recorded_at timestamp NOT NULL
        )""")
    db.execute("CREATE INDEX agent_compactions_by_session ON agent_compactions (session_id, recorded_at)")


def m009_session_project(db: psycopg.Connection) -> None:
    """The project a session belongs to: what a grant names, and what a member's read depends on."""
    db.execute("ALTER TABLE sessions ADD COLUMN project text")
    db.execute("CREATE INDEX sessions_by_project ON sessions (project)")


def m010_row_security(db: psycopg.Connection) -> None:
    """Grants, the owner-only table of verbatim values, and row-level security on every table of session rows.

    A member reads a session when they own it or were granted its project; every other row of a session is
    readable when its session is (the policies' subquery on ``sessions`` is itself under row security), and
    writable only by its owner. ``private_values`` holds the owner's verbatim text where the shared row has a
    secret replaced by a marker; only its owner ever reads it.
    """
    db.execute("""
        CREATE TABLE grants (
            role name NOT NULL,
            project text NOT NULL,
            granted_at timestamp NOT NULL DEFAULT (now() AT TIME ZONE 'utc'),
            PRIMARY KEY (role, project)
        )""")
    db.execute("ALTER TABLE grants ENABLE ROW LEVEL SECURITY")
    db.execute("CREATE POLICY own_grants ON grants FOR SELECT USING (role = current_user)")
    db.execute(f"""
        CREATE TABLE private_values (
            session_id text NOT NULL,
            kind text NOT NULL,
            ref_id text NOT NULL,
            {OWNER},
            value jsonb NOT NULL,
            PRIMARY KEY (session_id, kind, ref_id)
        )""")
    db.execute("ALTER TABLE private_values ENABLE ROW LEVEL SECURITY")
    db.execute("CREATE POLICY owner_only ON private_values USING (owner = current_user) "
               "WITH CHECK (owner = current_user)")
    db.execute("ALTER TABLE sessions ENABLE ROW LEVEL SECURITY")
    db.execute("CREATE POLICY readable ON sessions FOR SELECT USING (owner = current_user OR project IN "
               "(SELECT g.project FROM grants g WHERE g.role = current_user))")
    for table in TABLES:
        if table != "sessions":
            db.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        if table not in ("sessions", "private_values"):
            db.execute(f"CREATE POLICY readable ON {table} FOR SELECT USING (owner = current_user OR session_id IN "
                       "(SELECT s.session_id FROM sessions s))")
        if table != "private_values":
            db.execute(f"CREATE POLICY own_insert ON {table} FOR INSERT WITH CHECK (owner = current_user)")
            db.execute(f"CREATE POLICY own_update ON {table} FOR UPDATE USING (owner = current_user) "
                       "WITH CHECK (owner = current_user)")
            db.execute(f"CREATE POLICY own_delete ON {table} FOR DELETE USING (owner = current_user)")


def m011_grep_index(db: psycopg.Connection) -> None:
    """Trigram indexes, so that memory/grep reads the rows that can match instead of every row of the session."""
    db.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    db.execute("CREATE INDEX messages_text_trigrams ON messages USING gin (text gin_trgm_ops)")
    db.execute("CREATE INDEX summaries_content_trigrams ON summaries USING gin (content gin_trgm_ops)")


MIGRATIONS: Sequence[tuple[str, Migration]] = (
    ("001_initial", m001_initial),
    ("002_prunable_totals", m002_prunable_totals),
    ("003_live_messages", m003_live_messages),
    ("004_pinned_rules", m004_pinned_rules),
    ("005_message_sources", m005_message_sources),
    ("006_session_workspace", m006_session_workspace),
    ("007_prune_frontier", m007_prune_frontier),
    ("008_agent_compactions", m008_agent_compactions),
    ("009_session_project", m009_session_project),
    ("010_row_security", m010_row_security),
    ("011_grep_index", m011_grep_index),
)


@attrs.define(frozen=True)
class SchemaState:
    """What the database holds against what this code knows."""

    applied: tuple[str, ...]
    missing: tuple[str, ...]
    """Migrations of this code the database lacks, in order."""
    unknown: tuple[str, ...]
    """Migrations the database has that this code does not know: it was migrated by a newer version."""

    @property
    def current(self) -> bool:
        return not self.missing and not self.unknown


def schema_state(db: psycopg.Connection) -> SchemaState | None:
    """The recorded migrations against ours; None when the database has no schema of ours at all."""
    found = db.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
    if not found or not found[0]:
        return None
    applied = tuple(row[0] for row in db.execute("SELECT name FROM schema_migrations ORDER BY name").fetchall())
    known = [name for name, _ in MIGRATIONS]
    return SchemaState(applied, tuple(name for name in known if name not in applied),
                       tuple(name for name in applied if name not in known))


def migrate(db: psycopg.Connection) -> list[str]:
    """Apply the missing migrations, each in its own transaction, under a lock; returns the names applied."""
    done: list[str] = []
    with db.transaction():
        db.execute("SELECT pg_advisory_xact_lock(hashtext('context-sidecar migrate'))")
        db.execute("CREATE TABLE IF NOT EXISTS schema_migrations "
                   "(name text PRIMARY KEY, applied_at timestamp NOT NULL)")
    for name, migration in MIGRATIONS:
        with db.transaction():
            db.execute("SELECT pg_advisory_xact_lock(hashtext('context-sidecar migrate'))")
            if db.execute("SELECT 1 FROM schema_migrations WHERE name = %s", [name]).fetchone():
                continue
            migration(db)
            db.execute("INSERT INTO schema_migrations VALUES (%s, now() AT TIME ZONE 'utc')", [name])
            done.append(name)
    return done
