"""Two machines, three roles, one team database: what a member stores, a teammate finds, live; a third does not.

Each machine is a HOME and an XDG runtime directory of its own, so each has its own host (and pool) for the
database, as two laptops would; the two clones of one repository sit at different paths with differently
written origins.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sidecar.client import SidecarClient
from sidecar.testing import FakeOpenAIServer, RecordedRequest, Reply
from tests.helpers.hosts import short_runtime, until
from tests.helpers.team_db import ALICE, BOB, CAROL, OWNER, TeamServer

PROJECT = "github.com/acme/app"
KEY = "sk-ant-api03-" + "Hq7Wd2Lp9Xz4Nc6Vb1Mk8Rj3Tf5Gs0Yu2Ea4Oi6Pl8Kn1Jm3Hb5Vc7Xd9" + "-AA"
FACT = "the flaky payment test fails because the fake clock drifts past midnight"
WAIT = 60.0


def clone(path: Path, origin: str) -> Path:
    """A git working tree at ``path`` whose origin is ``origin`` (the config written as git writes it)."""
    (path / ".git").mkdir(parents=True)
    (path / ".git" / "config").write_text(f'[core]\n\tbare = false\n[remote "origin"]\n\turl = {origin}\n'
                                          '\tfetch = +refs/heads/*:refs/remotes/origin/*\n')
    return path


@contextlib.contextmanager
def machine(base: Path) -> Iterator[dict[str, str]]:
    """The environment of one machine: its own HOME, data, state and runtime directories (so its own host)."""
    with short_runtime() as runtime:
        home = base / "home"
        home.mkdir(parents=True)
        yield {**{k: v for k, v in os.environ.items() if not k.startswith(("PG", "XDG_", "CONTEXT_SIDECAR"))},
               "HOME": str(home), "XDG_DATA_HOME": str(home / "data"), "XDG_STATE_HOME": str(home / "state"),
               "XDG_RUNTIME_DIR": str(runtime)}


@contextlib.asynccontextmanager
async def member(url: str, env: dict[str, str], workspace: Path,
                 settings: dict[str, Any] | None = None) -> AsyncIterator[SidecarClient]:
    """A client of the machine's host, started in ``workspace`` (an agent's working directory is its workspace)."""
    here = os.getcwd()
    os.chdir(workspace)
    try:
        client = await SidecarClient.spawn(db=url, env=env, timeout=WAIT, settings=settings,
                                           command=[sys.executable, "-P", "-m", "sidecar", "-v"])
    finally:
        os.chdir(here)
    try:
        yield client
    finally:
        await client.close()


def grant(team_server: TeamServer, database: str, role: str, project: str) -> None:
    done = subprocess.run([sys.executable, "-m", "sidecar", "--db", team_server.url(OWNER, database), "team", "grant",
                           role, "--project", project], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


async def test_a_teammate_on_another_machine_finds_it_live_and_an_outsider_does_not(
        team_server: TeamServer, team_database: str, tmp_path: Path) -> None:
    grant(team_server, team_database, ALICE, PROJECT)
    grant(team_server, team_database, BOB, PROJECT)
    grant(team_server, team_database, CAROL, "github.com/acme/other")
    on_a = clone(tmp_path / "laptop" / "src" / "app", "git@github.com:acme/app.git")
    on_b = clone(tmp_path / "devbox" / "work" / "acme-app", "https://bob@github.com/acme/app")
    with machine(tmp_path / "machine-a") as env_a, machine(tmp_path / "machine-b") as env_b:
        async with member(team_server.url(ALICE, team_database), env_a, on_a) as alice, \
                member(team_server.url(BOB, team_database), env_b, on_b) as bob, \
                member(team_server.url(CAROL, team_database), env_b, on_b) as carol:
            assert alice.capabilities["storage"] == team_server.url(ALICE, team_database)
            await alice.ingest("alice-1", [{"id": "u1", "role": "user", "content": "why does CI fail at night?"},
                                           {"id": "a1", "role": "assistant", "content": FACT},
                                           {"id": "u2", "role": "user", "content": f"use ANTHROPIC_API_KEY={KEY}"}])
            # Found at once from the other clone, on the other machine, through its own host.
            found = await bob.call_tool(None, "memory_grep", json.dumps({"pattern": "fake clock drifts"}),
                                        workspace=str(on_b))
            assert FACT in found["content"] and "alice-1" in found["content"]
            planted = await bob.call_tool(None, "memory_grep", json.dumps({"pattern": "ANTHROPIC_API_KEY"}),
                                          workspace=str(on_b))
            assert "[redacted secret" in planted["content"]
            assert not any(KEY[i:i + 16] in planted["content"] for i in range(len(KEY) - 15))
            own = await alice.call_tool(None, "memory_grep", json.dumps({"pattern": "ANTHROPIC_API_KEY"}),
                                        workspace=str(on_a))
            assert KEY in own["content"]  # verbatim for its owner
            outsider = await carol.call_tool(None, "memory_grep", json.dumps({"pattern": "fake clock"}),
                                             workspace=str(on_b))
            assert FACT not in outsider["content"] and "alice-1" not in outsider["content"]
            assert all(s.session_id != "alice-1" for s in (await carol.sessions()).sessions)
            # Live: Bob follows Alice's session; her next ingest on machine A reaches him through the database.
            heard: asyncio.Queue[tuple[float, int]] = asyncio.Queue()
            bob.on_usage(lambda usage: heard.put_nowait((time.monotonic(), usage.messages))
                         if usage.session_id == "alice-1" else None)
            await bob.follow("alice-1")
            sent = time.monotonic()
            await alice.ingest("alice-1", [{"id": "a2", "role": "assistant", "content": "fixed: freeze the clock"}])
            while True:  # the notification that counts the new message, not one the follow itself brought
                at, messages = await asyncio.wait_for(heard.get(), WAIT)
                if messages == 4:
                    break
            print(f"context/didChangeUsage on machine B {1000 * (at - sent):.0f} ms after the ingest on machine A")
    with psycopg.connect(team_server.url(CAROL, team_database)) as db:
        assert db.execute("SELECT count(*) FROM sessions WHERE project = %s", [PROJECT]).fetchone()[0] == 0
        assert db.execute("SELECT count(*) FROM messages WHERE text LIKE %s", ["%clock%"]).fetchone()[0] == 0
    with psycopg.connect(team_server.url(ALICE, team_database)) as db:
        project = db.execute("SELECT project FROM sessions WHERE session_id = 'alice-1'").fetchone()[0]
        assert project == PROJECT


@pytest.fixture(autouse=True)
def _no_share_override(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machines' clients share through their hosts, as installed sidecars do."""
    monkeypatch.delenv("CONTEXT_SIDECAR_DB", raising=False)


async def test_two_hosts_compacting_one_session_write_once_and_both_answer(
        team_server: TeamServer, team_database: str, tmp_path: Path) -> None:
    gate = threading.Event()

    def respond(request: RecordedRequest) -> Reply:
        gate.wait(WAIT)
        return Reply(text="Summary: the payment test's clock is frozen now.")

    workspace = clone(tmp_path / "app", "git@github.com:acme/app.git")
    url = team_server.url(ALICE, team_database)  # one developer, a laptop and a cloud dev box
    with FakeOpenAIServer(responder=respond) as model, machine(tmp_path / "laptop") as env_a, \
            machine(tmp_path / "devbox") as env_b:
        settings = {"compaction": {"auto": False, "keepRecentTokens": 0},
                    "llm": {"baseUrl": model.base_url, "model": "fake-model", "timeoutSeconds": 60}}
        async with member(url, env_a, workspace, settings) as laptop, member(url, env_b, workspace, settings) as devbox:
            await laptop.ingest("s", [{"id": f"m{i}", "role": "user" if i % 2 == 0 else "assistant",
                                       "content": f"step {i}: " + "edit " * 60} for i in range(40)])
            first = asyncio.ensure_future(laptop.compact("s", mode="incremental"))
            await until(lambda: model.in_flight > 0, "the laptop's summarizer call")
            second = asyncio.ensure_future(devbox.compact("s", mode="incremental"))
            await until(lambda: "waiting for the compaction another host runs" in log_of(env_b), "the devbox to wait")
            calls = len(model.chat_requests)
            gate.set()
            ran, waited = await asyncio.wait_for(first, WAIT), await asyncio.wait_for(second, WAIT)
            assert ran.compacted and ran.summary_ids
            assert waited.compacted and waited.reason == "compacted by another host"
            assert waited.tokens_after == ran.tokens_after
            assert len(model.chat_requests) == calls  # the devbox never summarized
    with psycopg.connect(url) as db:
        stored = [row[0] for row in db.execute("SELECT id FROM summaries WHERE session_id = 's'")]
        assert sorted(stored) == sorted(ran.summary_ids)


def log_of(env: dict[str, str]) -> str:
    """Everything the machine's hosts logged so far."""
    runtime = Path(env["XDG_RUNTIME_DIR"]) / "context-sidecar"
    return "".join(path.read_text(errors="replace") for path in runtime.glob("*.log"))
