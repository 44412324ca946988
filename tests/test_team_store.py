"""The team store on a real PostgreSQL server: db migrate, team grants, who reads what, and bad input."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest
from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException

from protocol import errors
from tests.conftest import ingest, running_sidecar, settings_for
from tests.helpers import postgres
from tests.helpers.team_db import ALICE, BOB, CAROL, OWNER, PROJECT, TeamServer

CLEAN_ENV = {key: value for key, value in os.environ.items() if not key.startswith("PG")}


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``context-sidecar ARGS`` as a process."""
    return subprocess.run([sys.executable, "-m", "sidecar", *args], capture_output=True, text=True, timeout=120,
                          env={**CLEAN_ENV, **(env or {})})


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The one line a failed command printed (asserting it is one line, no traceback, exit 1)."""
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_the_owner_migrates_once_and_a_member_cannot(team_server: TeamServer):
    name = team_server.empty_database()
    try:
        member = cli("--db", team_server.url(ALICE, name), "db", "migrate")
        assert "cannot change the schema" in one_line_error(member)
        first = cli("db", "migrate", "--db", team_server.url(OWNER, name))  # --db after the command too
        assert first.returncode == 0, first.stderr
        assert "applied 11 migrations (001_initial," in first.stdout
        again = cli("--db", team_server.url(OWNER, name), "db", "migrate")
        assert again.returncode == 0 and "the schema is up to date (011_grep_index)" in again.stdout
        with team_server.admin(name) as db:  # type: ignore[attr-defined]
            owner = db.execute("SELECT rolsuper, rolcreaterole, rolbypassrls FROM pg_roles WHERE rolname = %s",
                               [OWNER]).fetchone()
            assert owner == (False, False, False)  # an ordinary role did it
            assert db.execute("SELECT count(*) FROM schema_migrations").fetchone()[0] == 11
    finally:
        team_server.drop(name)


def test_team_grant_list_and_revoke(team_server: TeamServer, team_database: str):
    owner = team_server.url(OWNER, team_database)
    assert cli("--db", owner, "team", "grant", BOB, "--project", PROJECT).stdout.strip() == f"granted {BOB} {PROJECT}"
    assert cli("team", "grant", BOB, "--project", PROJECT, "--db", owner).stdout.strip() == \
        f"{BOB} already reads {PROJECT}"
    listed = cli("--db", owner, "team", "list")
    assert listed.stdout.splitlines() == sorted([f"{ALICE} {PROJECT}", f"{BOB} {PROJECT}"])
    assert cli("--db", owner, "team", "revoke", BOB, "--project", PROJECT).returncode == 0
    assert cli("--db", owner, "team", "list").stdout.splitlines() == [f"{ALICE} {PROJECT}"]
    refused = cli("--db", team_server.url(ALICE, team_database), "team", "grant", CAROL, "--project", PROJECT)
    assert f"role {ALICE} does not own the team database" in one_line_error(refused)
    unknown = cli("--db", owner, "team", "grant", "no_such_role", "--project", PROJECT)
    assert "there is no role no_such_role" in one_line_error(unknown)
    superuser = cli("--db", owner, "team", "grant", "postgres", "--project", PROJECT)
    assert "BYPASSRLS" in one_line_error(superuser)


@pytest.mark.parametrize("case", ["unparsable", "password", "missing", "older", "newer", "no grant"])
async def test_bad_team_databases_answer_one_clear_line_and_write_nothing(team_server: TeamServer, case: str):
    name = team_server.empty_database() if case == "missing" else team_server.database()
    env: dict[str, str] = {}
    url = team_server.url(ALICE, name)
    try:
        if case == "unparsable":
            url = url.replace(f"{ALICE}@", "al ice:pw secret@")
        elif case == "password":
            url = team_server.url(postgres.PASSWORD_ROLE, name, password="wrong-horse-battery")
        elif case == "older":
            with team_server.admin(name) as db:  # type: ignore[attr-defined]
                db.execute("DELETE FROM schema_migrations WHERE name = '011_grep_index'")
        elif case == "newer":
            with team_server.admin(name) as db:  # type: ignore[attr-defined]
                db.execute("INSERT INTO schema_migrations VALUES ('999_from_the_future', now())")
        elif case == "no grant":
            url = team_server.url(CAROL, name)
        expected = {"unparsable": "does not parse", "password": "refused the password",
                    "missing": "has no context-sidecar schema", "older": "has an older schema (it lacks 011_grep_index",
                    "newer": "migrated by a newer context-sidecar", "no grant": f"role {CAROL} has no grant"}[case]
        async with running_sidecar(settings=settings_for(url), env={**CLEAN_ENV, **env}) as client:
            with pytest.raises(JsonRpcException) as caught:
                await ingest(client, "s", [{"role": "user", "content": "must not be stored"}])
            assert caught.value.code == errors.STORAGE_ERROR
            message = caught.value.message
            assert expected in message and "\n" not in message
            for secret in ("wrong-horse-battery", "pw secret"):
                assert secret not in message
        copied = cli("db", "copy", "--from", url, "--to", "/nonexistent/x.duckdb")
        line = one_line_error(copied)
        assert expected in line and "wrong-horse-battery" not in line and "pw secret" not in line
        with team_server.admin(name) as db:  # type: ignore[attr-defined]
            present = db.execute("SELECT to_regclass('messages') IS NOT NULL").fetchone()[0]
            assert not present or db.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
    finally:
        team_server.drop(name)


async def test_members_read_their_own_and_granted_projects_only(team_server: TeamServer, team_database: str):
    owner = team_server.url(OWNER, team_database)
    assert cli("--db", owner, "team", "grant", BOB, "--project", PROJECT).returncode == 0
    assert cli("--db", owner, "team", "grant", CAROL, "--project", "example.com/other/thing").returncode == 0
    key = "sk-ant-api03-" + "Zq8Lm2Np4Rt6Vx9Bc1Df3Gh5Jk7Mn0Pq2Rs4Tu6Wy8Az1Cx3Ev5" + "-AA"
    from sidecar.engine.messages import message_row
    from sidecar.storage import open_store

    alice = open_store(team_server.url(ALICE, team_database))
    try:
        alice.ingest("shared", [message_row({"role": "user", "content": f"the flaky payment test needs {key}"},
                                            50_000, {})], {"project": PROJECT, "workspace": "/a"}, [False], "0:")
        alice.ingest("private", [message_row({"role": "user", "content": "alice's own notes"}, 50_000, {})],
                     {"workspace": "/scratch"}, [False], "0:")
        assert key in next(iter(alice.message_raws("shared", [alice.session("shared").last_position]).values()))
    finally:
        alice.close()
    with psycopg.connect(team_server.url(BOB, team_database)) as db:
        assert [row[0] for row in db.execute("SELECT session_id FROM sessions ORDER BY 1")] == ["shared"]
        texts = [row[0] for row in db.execute("SELECT raw || text FROM messages")]
        assert len(texts) == 1 and "[redacted secret" in texts[0]
        assert not any(key[i:i + 16] in texts[0] for i in range(len(key) - 15))
        assert db.execute("SELECT count(*) FROM private_values").fetchone()[0] == 0
    with psycopg.connect(team_server.url(BOB, team_database), autocommit=True) as db:
        assert db.execute("UPDATE messages SET text = 'changed' RETURNING 1").fetchall() == []  # not his rows
        assert db.execute("DELETE FROM sessions RETURNING 1").fetchall() == []
    with psycopg.connect(team_server.url(CAROL, team_database)) as db:
        for table in ("sessions", "messages", "context_items", "summaries", "message_sources", "private_values"):
            assert db.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0, table
    assert cli("--db", owner, "team", "revoke", BOB, "--project", PROJECT).returncode == 0
    # His last grant: no privileges left at all.
    bob = team_server.url(BOB, team_database)
    with psycopg.connect(bob) as db, pytest.raises(psycopg.errors.InsufficientPrivilege):
        db.execute("SELECT count(*) FROM sessions")


def test_db_copy_moves_a_file_into_the_team_database_and_back_once(team_server: TeamServer, team_database: str,
                                                                   tmp_path) -> None:
    import asyncio

    from protocol.types import IngestParams
    from sidecar.cli.synthetic import coding_session
    from sidecar.config.settings import read_settings
    from sidecar.services.compaction.engine import Compaction
    from sidecar.services.memory import ingest as ingest_messages
    from sidecar.services.state import Sidecar
    from sidecar.summarizers.deterministic import DeterministicSummarizer

    local = str(tmp_path / "mine.duckdb")
    settings, _ = read_settings({"compaction": {"auto": False}})
    mine = Sidecar(settings=settings, storage_path=local)
    ingest_messages(mine, IngestParams(session_id="mine", messages=coding_session(120)))
    asyncio.run(Compaction(mine, "mine", "incremental", None, DeterministicSummarizer()).run())
    before = mine.store().dump_session("mine")
    mine.close()
    url = team_server.url(ALICE, team_database)
    first = cli("db", "copy", "--from", local, "--to", url)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("copied 1 sessions (120 messages)")
    again = cli("db", "copy", "--from", local, "--to", url)
    assert again.stdout.startswith("copied 0 sessions (0 messages)") and "1 already in" in again.stdout
    with psycopg.connect(url) as db:
        owners = db.execute("SELECT DISTINCT owner FROM messages WHERE session_id = 'mine'").fetchall()
        assert owners == [(ALICE,)]
        ids = [row[0] for row in db.execute("SELECT id FROM messages WHERE session_id = 'mine' ORDER BY seq")]
    assert ids == [row["id"] for row in sorted(before.tables["messages"], key=lambda row: row["seq"])]
    back = str(tmp_path / "back.duckdb")
    assert cli("db", "copy", "--from", url, "--to", back).returncode == 0
    team = Sidecar(settings=settings, storage_path=url)
    home = Sidecar(settings=settings, storage_path=back)
    for side in (team, home):
        assembled = side.store().context(side.session("mine"))
        assert [(i.kind, i.ref_id) for i in assembled] == [(i.kind, i.ref_id) for i in mine_context(local)]
    team.close()
    home.close()


def mine_context(path: str) -> list:
    from sidecar.services.state import Sidecar

    sidecar = Sidecar(storage_path=path)
    try:
        return sidecar.store().context(sidecar.session("mine"))
    finally:
        sidecar.close()


async def test_a_password_never_shows_in_logs_errors_or_initialize(team_server: TeamServer, team_database: str,
                                                                   tmp_path) -> None:
    secret = "right-password"
    with team_server.admin(team_database) as db:  # type: ignore[attr-defined]
        db.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON sessions, messages, summaries, context_items, "
                   f"summary_sources, message_sources, agent_compactions, private_values TO {postgres.PASSWORD_ROLE}")
        db.execute(f"GRANT SELECT ON grants, schema_migrations TO {postgres.PASSWORD_ROLE}")
        db.execute(f"GRANT USAGE ON SEQUENCE positions TO {postgres.PASSWORD_ROLE}")
    url = team_server.url(postgres.PASSWORD_ROLE, team_database, password=secret)
    log_file = tmp_path / "sidecar.log"
    async with running_sidecar(initialize=False, env=CLEAN_ENV, args=["-vv", "--log-file", str(log_file)]) as client:
        started = await client.initialize_session(lsp.InitializeParams(capabilities=lsp.ClientCapabilities(),
                                                                       initialization_options=settings_for(url)))
        storage = started.capabilities.experimental["contextSidecar"]["storage"]
        assert secret not in storage and "***" in storage
        stored = await ingest(client, "s", [{"role": "user", "content": "hello"}])
        assert stored["usage"]["messages"] == 1
        await client.shutdown_session()
    assert secret not in log_file.read_text()
    for args in (["--help"], ["db", "--help"], ["team", "grant", "--help"]):
        assert secret not in cli(*args).stdout
    wrong = cli("db", "copy", "--from", url.replace(secret, "x" + secret), "--to", str(tmp_path / "x.duckdb"))
    assert secret not in wrong.stderr and "refused the password" in one_line_error(wrong)


def test_setup_passes_a_team_url_on_as_it_is(tmp_path) -> None:
    url = "postgresql://alice@db.example.com:5432/team"
    env = {"HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state"), "CODEX_HOME": str(tmp_path / "codex")}
    done = cli("setup", "codex", "--dry-run", "--db", url, env=env)
    assert done.returncode == 0, done.stderr
    assert f'"{url}"' in done.stdout
