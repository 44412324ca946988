"""Copying the sessions of another database file into this one (the per-workspace files of earlier versions)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import duckdb

_ALIAS = "merged_file"


class MergeFiles:
    """Mixin of Storage: ``merge_file``."""

    _db: duckdb.DuckDBPyConnection
    _next_position: int
    _transaction: Callable[..., AbstractContextManager[None]]
    _start: Callable[[], None]

    def merge_file(self, path: str, workspace: str) -> tuple[list[str], list[str]]:
        """Copy every session of the file at ``path`` (migrated to this schema) here, tagged with ``workspace``.

        Returns (ids copied, ids left out because a session of that id is here already). Positions are
        shifted past this file's, so that each session keeps its order and no position is shared.
        """
        quoted = path.replace("'", "''")
        self._db.execute(f"ATTACH '{quoted}' AS {_ALIAS} (READ_ONLY)")
        try:
            ids = [row[0] for row in self._db.execute(f"SELECT session_id FROM {_ALIAS}.sessions").fetchall()]
            here = {row[0] for row in self._db.execute(
                "SELECT session_id FROM sessions WHERE session_id IN (SELECT unnest(?::VARCHAR[]))", [ids]).fetchall()}
            copied = [session_id for session_id in ids if session_id not in here]
            base = int(self._next_position - 1)
            with self._transaction():
                for sql in self._copies(base):
                    self._db.execute(sql, [copied])
                # The file was the workspace's own: whatever else its sessions say, they belong to it.
                self._db.execute("UPDATE sessions SET workspace = ? WHERE session_id IN (SELECT unnest(?::VARCHAR[]))",
                                 [workspace, copied])
        finally:
            self._db.execute(f"DETACH {_ALIAS}")
        self._start()  # positions and cached rows, read afresh
        return copied, sorted(here)

    @staticmethod
    def _copies(base: int) -> Iterator[str]:
        """One INSERT per table, for the sessions listed in the one parameter; positions shifted by ``base``."""
        chosen = "WHERE session_id IN (SELECT unnest(?::VARCHAR[]))"
        yield (f"INSERT INTO sessions BY NAME SELECT * REPLACE (first_position + {base} AS first_position, "
               f"last_position + {base} AS last_position, "
               f"CASE WHEN live_after > 0 THEN live_after + {base} ELSE 0 END AS live_after) "
               f"FROM {_ALIAS}.sessions {chosen}")
        yield f"INSERT INTO messages BY NAME SELECT * REPLACE (seq + {base} AS seq) FROM {_ALIAS}.messages {chosen}"
        yield (f"INSERT INTO context_items BY NAME SELECT * REPLACE (position + {base} AS position) "
               f"FROM {_ALIAS}.context_items {chosen}")
        yield f"INSERT INTO summaries BY NAME SELECT * FROM {_ALIAS}.summaries {chosen}"
        yield f"INSERT INTO summary_sources BY NAME SELECT * FROM {_ALIAS}.summary_sources {chosen}"
        yield f"INSERT INTO message_sources BY NAME SELECT * FROM {_ALIAS}.message_sources {chosen}"
        yield f"INSERT INTO agent_compactions BY NAME SELECT * FROM {_ALIAS}.agent_compactions {chosen}"
