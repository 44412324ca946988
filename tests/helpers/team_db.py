"""Team databases for the tests: roles on the throwaway server, and a fresh migrated database per test.

The server is ``CONTEXT_SIDECAR_TEST_PG`` (a superuser URL; ``scripts/test.sh`` starts one), else one these
helpers start for the test session. The roles: ``OWNER`` owns every test database (an ordinary role: no
superuser, no CREATEROLE) and migrated it; ``ALICE``, ``BOB`` and ``CAROL`` are members; each test database
starts with ALICE granted ``PROJECT``. Without a server the tests that need one skip, with the reason;
with ``CONTEXT_SIDECAR_REQUIRE_PG=1`` (CI) they fail instead.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.helpers import postgres

OWNER, ALICE, BOB, CAROL = "cs_owner", "cs_alice", "cs_bob", "cs_carol"
PROJECT = "example.com/acme/app"
TEMPLATE = "cs_template"
_numbers = itertools.count()


class TeamServer:
    """The server, as its superuser sees it."""

    def __init__(self, admin_url: str, directory: Path | None) -> None:
        self.admin_url = admin_url
        self.directory = directory
        """Where the server lives when these helpers started it (so a test can stop and start it)."""

    def url(self, role: str, database: str, password: str | None = None) -> str:
        """A URL of ``database`` as ``role``."""
        parts = urlsplit(self.admin_url)
        netloc = f"{role}{':' + password if password else ''}@{parts.hostname}:{parts.port}"
        return urlunsplit((parts.scheme, netloc, f"/{database}", "", ""))

    def admin(self, database: str = "postgres") -> object:
        """A superuser connection (autocommit) to ``database``."""
        import psycopg

        return psycopg.connect(self.url(urlsplit(self.admin_url).username or "postgres", database), autocommit=True)

    def setup(self) -> None:
        """The roles, and the template database migrated by its owner with ALICE granted PROJECT."""
        self.roles()
        with self.admin() as db:  # type: ignore[attr-defined]
            db.execute(f"DROP DATABASE IF EXISTS {TEMPLATE}")
            db.execute(f"CREATE DATABASE {TEMPLATE} OWNER {OWNER}")
        self.migrate(TEMPLATE)

    def roles(self) -> None:
        """The test roles, made when missing."""
        with self.admin() as db:  # type: ignore[attr-defined]
            for role in (OWNER, ALICE, BOB, CAROL, postgres.PASSWORD_ROLE):
                if not db.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchall():
                    db.execute(f"CREATE ROLE {role} LOGIN")
            db.execute(f"ALTER ROLE {postgres.PASSWORD_ROLE} PASSWORD 'right-password'")

    def migrate(self, database: str) -> None:
        """``database`` migrated by its owner, with ALICE granted PROJECT."""
        import psycopg

        from sidecar.storage.postgres import team
        from sidecar.storage.postgres.migrations import migrate

        with psycopg.connect(self.url(OWNER, database), autocommit=True) as db:
            migrate(db)
            team.grant(db, ALICE, PROJECT)

    def database(self) -> str:
        """A new database made from the template; its name."""
        name = f"cs_test_{os.getpid()}_{next(_numbers)}"
        with self.admin() as db:  # type: ignore[attr-defined]
            db.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE} OWNER {OWNER}")
        return name

    def standalone_database(self) -> str:
        """A new migrated database made without the template (which only a pytest session's setup makes); its name."""
        self.roles()
        name = f"cs_standalone_{os.getpid()}_{next(_numbers)}"
        with self.admin() as db:  # type: ignore[attr-defined]
            db.execute(f"CREATE DATABASE {name} OWNER {OWNER}")
        self.migrate(name)
        return name

    def empty_database(self) -> str:
        """A new database with no schema, owned by OWNER."""
        name = f"cs_empty_{os.getpid()}_{next(_numbers)}"
        with self.admin() as db:  # type: ignore[attr-defined]
            db.execute(f"CREATE DATABASE {name} OWNER {OWNER}")
        return name

    def drop(self, name: str) -> None:
        """Drop a test database, whoever is still connected."""
        with contextlib.suppress(Exception), self.admin() as db:  # type: ignore[attr-defined]
            db.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def required() -> bool:
    """Whether a missing server fails the tests (CI) rather than skipping them."""
    return os.environ.get("CONTEXT_SIDECAR_REQUIRE_PG") == "1"


@contextlib.contextmanager
def team_server() -> Iterator[TeamServer]:
    """The tests' server: the one named in CONTEXT_SIDECAR_TEST_PG, else one started here for the session."""
    given = os.environ.get("CONTEXT_SIDECAR_TEST_PG")
    directory: Path | None = None
    if given:
        server_dir = os.environ.get("CONTEXT_SIDECAR_TEST_PG_DIR")
        server = TeamServer(given, Path(server_dir) if server_dir else None)
        directory = None
    else:
        directory = Path(tempfile.mkdtemp(prefix="cs-pg-"))
        try:
            server = TeamServer(postgres.start(directory, allow_install=False), directory)
        except postgres.Unavailable as error:
            postgres.stop(directory)
            message = f"no PostgreSQL server for the team-store tests: {error}"
            if required():
                pytest.fail(message)
            pytest.skip(message)
    try:
        server.setup()
    except Exception as error:
        if directory is not None:
            postgres.stop(directory)
        message = f"the PostgreSQL server at {given or directory} is not usable: {error}"
        if required():
            pytest.fail(message)
        pytest.skip(message)
    try:
        yield server
    finally:
        if directory is not None:
            postgres.stop(directory)


def stopped(server: TeamServer) -> contextlib.AbstractContextManager[None]:
    """The server stopped (pg_ctl stop -m fast: every connection cut) for the block, started again after it."""
    directory = server.directory
    if directory is None:
        pytest.skip("the server was not started by the tests (CONTEXT_SIDECAR_TEST_PG_DIR unset): it cannot be stopped")

    @contextlib.contextmanager
    def outage() -> Iterator[None]:
        done = postgres.pg_ctl(directory, "stop", "-m", "fast", "-w")
        assert done.returncode == 0, done.stderr
        try:
            yield
        finally:
            postgres.restart(directory)

    return outage()


def main(argv: list[str]) -> int:
    """``create``: print the URL, as ALICE, of a fresh team database on CONTEXT_SIDECAR_TEST_PG's server;
    ``drop URL``: drop it. For suites outside pytest (the editor plugins'); exit 2 when no server is named."""
    given = os.environ.get("CONTEXT_SIDECAR_TEST_PG")
    if not given:
        print("CONTEXT_SIDECAR_TEST_PG is unset: no PostgreSQL server to make a team database on", file=sys.stderr)
        return 2
    server = TeamServer(given, None)
    if argv == ["create"]:
        print(server.url(ALICE, server.standalone_database()))
        return 0
    if len(argv) == 2 and argv[0] == "drop":
        name = urlsplit(argv[1]).path.lstrip("/")
        if not name.startswith("cs_standalone_"):
            print(f"{name} is not a database `create` made: not dropped", file=sys.stderr)
            return 1
        server.drop(name)
        return 0
    print("usage: python -m tests.helpers.team_db create | drop URL", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
