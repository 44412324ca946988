"""Connections to a team's PostgreSQL server: the host's one pool, and libpq's failures as one clear line each.

Every message here names the database by its URL without the password (``sidecar.config.database.shown``), and
none quotes a connection string: libpq reads the password from the URL, ``PGPASSWORD`` or ``~/.pgpass``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool, PoolTimeout

from sidecar.config.database import check_url, password, shown
from sidecar.rows import StorageFailure, StorageUnavailable
from sidecar.storage.postgres.migrations import MIGRATIONS, schema_state

log = logging.getLogger(__name__)

CONNECT_SECONDS = 3
"""libpq's connect_timeout: how long a connection attempt may take (a server that does not answer at all)."""
POOL_MAX = 4
"""Connections one host holds at most: the event loop's, the listener's, a compaction's lock, the spool's."""
RETRY_SECONDS = 1.0
"""How often a host whose server went away tries it again (in a thread: requests never wait for it)."""
APPLICATION = "context-sidecar"


def connection_options(url: str) -> dict[str, Any]:
    """Keyword arguments of every connection: short connect and keepalive timeouts, our application name."""
    return {"connect_timeout": CONNECT_SECONDS, "application_name": APPLICATION, "keepalives": 1,
            "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3, "tcp_user_timeout": 15000}


def scrub(text: str, url: str) -> str:
    """``text`` with the URL's password, if any, masked (libpq never quotes it; this is a second lock)."""
    secret = password(url)
    return text.replace(secret, "***") if secret else text


def first_line(error: BaseException, url: str) -> str:
    """libpq's message on one line, without its ``connection failed: connection to server at ...`` preamble."""
    diag = getattr(error, "diag", None)
    primary = diag.message_primary if diag is not None else None
    text = scrub(primary or str(error), url).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith(("connection to server", "connection failed:"))]
    chosen = (useful or lines or [type(error).__name__])[-1]
    return chosen.removeprefix("FATAL:").strip()


def connect_failure(error: BaseException, url: str) -> StorageFailure:
    """A failed connection as one line saying what to do."""
    where = shown(url)
    reason = first_line(error, url)
    lowered = reason.lower()
    if "password authentication failed" in lowered or "no password supplied" in lowered:
        return StorageFailure(f"the team database {where} refused the password ({reason}); set it in PGPASSWORD or "
                              "~/.pgpass")
    if "does not exist" in lowered:
        return StorageFailure(f"the team database {where}: {reason}")
    if isinstance(error, psycopg.OperationalError | PoolTimeout):
        return StorageUnavailable(f"the team database {where} cannot be reached: {reason}")
    return StorageFailure(f"the team database {where}: {reason}")


def failure(error: psycopg.Error, url: str) -> StorageFailure:
    """A failed statement as one line: lost connections are StorageUnavailable, refusals say who refused."""
    where = shown(url)
    if isinstance(error, pg_errors.InsufficientPrivilege):
        return StorageFailure(f"the team database {where} refused this role: {first_line(error, url)}; its owner "
                              "grants access with: context-sidecar --db URL team grant ROLE --project PROJECT")
    if isinstance(error, psycopg.OperationalError | pg_errors.AdminShutdown | pg_errors.CannotConnectNow):
        return StorageUnavailable(f"the team database {where} cannot be reached: {first_line(error, url)}")
    return StorageFailure(f"the team database {where}: {first_line(error, url)}")


def check_schema(db: psycopg.Connection, url: str) -> None:
    """StorageFailure, in one line, unless the schema is this code's: missing, older or newer; or no access."""
    where = shown(url)
    try:
        state = schema_state(db)
        if state is not None and not state.missing:
            db.execute("SELECT 1 FROM sessions LIMIT 0")
    except pg_errors.InsufficientPrivilege:
        role = db.execute("SELECT current_user").fetchone()
        raise StorageFailure(f"role {role[0] if role else '?'} has no grant in the team database {where}; its owner "
                             f"runs: context-sidecar --db URL team grant {role[0] if role else 'ROLE'} --project "
                             "PROJECT") from None
    if state is None:
        raise StorageFailure(f"the team database {where} has no context-sidecar schema; its owner runs: "
                             "context-sidecar --db URL db migrate")
    if state.unknown:
        raise StorageFailure(f"the team database {where} was migrated by a newer context-sidecar (it has "
                             f"{', '.join(state.unknown)}); upgrade context-sidecar")
    if state.missing:
        raise StorageFailure(f"the team database {where} has an older schema (it lacks {', '.join(state.missing)} of "
                             f"{len(MIGRATIONS)} migrations); its owner runs: context-sidecar --db URL db migrate")


def connect(url: str) -> psycopg.Connection:
    """One connection, autocommit; StorageFailure (one line) when the URL, server, role or password is refused."""
    check_url_failure(url)
    try:
        return psycopg.connect(url, autocommit=True, **connection_options(url))
    except psycopg.Error as error:
        raise connect_failure(error, url) from None


def check_url_failure(url: str) -> None:
    """StorageFailure for a URL that does not parse."""
    from sidecar.config.database import DatabaseUrlError

    try:
        check_url(url)
    except DatabaseUrlError as error:
        raise StorageFailure(str(error)) from None


class Pool:
    """The host's connections to one database: the event loop's own, held, and the others' from a pool.

    Once a connection fails, requests fail at once (``StorageUnavailable``) until a thread of the store finds the
    server back (``mark_up``), rather than each waiting ``CONNECT_SECONDS`` for a server that is gone: the agent
    is never kept waiting on it. ``on_down`` is called when that starts.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._pool = ConnectionPool(url, min_size=1, max_size=POOL_MAX, open=False, timeout=CONNECT_SECONDS,
                                    kwargs={"autocommit": True, **connection_options(url)},
                                    name="context-sidecar", reconnect_timeout=0)
        self._held: psycopg.Connection | None = None
        self._lock = threading.RLock()
        self.down_since: float | None = None
        """When the server was found unreachable (monotonic), until a connection works again."""
        self.on_down: Callable[[], None] = lambda: None

    def open(self) -> None:
        """Connect once, checking the URL, credentials and schema (each failure one line), then open the pool."""
        first = connect(self.url)
        try:
            check_schema(first, self.url)
        finally:
            first.close()
        self._pool.open(wait=False)

    def close(self) -> None:
        """Close every connection."""
        with self._lock:
            held, self._held = self._held, None
            if held is not None:
                with contextlib.suppress(Exception):
                    self._pool.putconn(held)
        self._pool.close(timeout=1.0)

    @property
    def available(self) -> bool:
        """Whether the server answered the last time it was asked."""
        return self.down_since is None

    def mark_down(self) -> None:
        """The server was found unreachable: fail fast until it is back."""
        with self._lock:
            began = self.down_since is None
            if began:
                self.down_since = time.monotonic()
                log.warning("the team database %s cannot be reached; ingests are kept here until it is back",
                            shown(self.url))
            held, self._held = self._held, None
        if held is not None:
            with contextlib.suppress(Exception):
                self._pool.putconn(held)  # a broken connection is discarded by the pool
        if began:
            self.on_down()

    def mark_up(self) -> None:
        """The server answers again."""
        with self._lock:
            if self.down_since is not None:
                log.warning("the team database %s is back after %.0f s", shown(self.url),
                            time.monotonic() - self.down_since)
            self.down_since = None
        with contextlib.suppress(Exception):
            self._pool.check()  # drop the pool's connections to the server that went away

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """The event loop's connection; psycopg's errors as StorageFailure / StorageUnavailable."""
        with self._lock:
            if self._held is None:
                if self.down_since is not None:
                    raise StorageUnavailable(f"the team database {shown(self.url)} cannot be reached (since "
                                             f"{time.monotonic() - self.down_since:.0f} s)")
                try:
                    self._held = self._pool.getconn(timeout=CONNECT_SECONDS)
                except (PoolTimeout, psycopg.OperationalError) as error:
                    self.mark_down()
                    raise connect_failure(error, self.url) from None
            held = self._held
        try:
            yield held
        except psycopg.Error as error:
            if held.broken or held.closed or isinstance(error, psycopg.OperationalError):
                self.mark_down()
            raise failure(error, self.url) from error

    def take(self) -> psycopg.Connection:
        """A connection of the pool, held until ``give``; StorageFailure / StorageUnavailable when none can be had."""
        if self.down_since is not None:
            raise StorageUnavailable(f"the team database {shown(self.url)} cannot be reached")
        try:
            return self._pool.getconn(timeout=CONNECT_SECONDS)
        except (PoolTimeout, psycopg.OperationalError) as error:
            raise connect_failure(error, self.url) from None

    def give(self, conn: psycopg.Connection) -> None:
        """Return a connection ``take`` gave (a broken one is replaced by the pool)."""
        with contextlib.suppress(Exception):
            self._pool.putconn(conn)

    @contextlib.contextmanager
    def borrowed(self) -> Iterator[psycopg.Connection]:
        """A connection of the pool for another thread (a compaction's lock, the spool); errors mapped."""
        try:
            with self._pool.connection(timeout=CONNECT_SECONDS) as conn:
                yield conn
        except (PoolTimeout, psycopg.OperationalError) as error:
            raise connect_failure(error, self.url) from None
        except psycopg.Error as error:
            raise failure(error, self.url) from error
