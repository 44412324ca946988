"""A session's compaction lock in a team database: a PostgreSQL advisory lock, held on a connection of its own.

Held for the whole compaction (its summarizer calls included), so that two hosts never both compact a session;
a session-level lock, so that it goes away with its connection if the host dies.
"""

from __future__ import annotations

import contextlib

import psycopg

from sidecar.storage.postgres.connection import Pool, failure


class AdvisoryLock:
    """``pg_try_advisory_lock`` on the session id's 64-bit hash."""

    def __init__(self, pool: Pool, session_id: str) -> None:
        self._pool, self.session_id = pool, session_id
        self._held: psycopg.Connection | None = None

    def acquire(self) -> bool:
        """Take it if it is free; whether this holds it now."""
        if self._held is not None:
            return True
        conn = self._pool.take()
        try:
            row = conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", [self.session_id]).fetchone()
        except psycopg.Error as error:
            self._pool.give(conn)
            raise failure(error, self._pool.url) from error
        if row is not None and row[0]:
            self._held = conn
            return True
        self._pool.give(conn)
        return False

    def release(self) -> None:
        """Let it go, and the connection back to the pool."""
        conn, self._held = self._held, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", [self.session_id])
            self._pool.give(conn)
