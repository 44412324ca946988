"""Clients come and go: one killed with requests in flight leaves no error behind, and its work on a shared
session is finished for the session, while the other clients carry on."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.client import SidecarClient
from sidecar.pytest_plugin import llm_settings
from sidecar.testing import FakeOpenAIServer, RecordedRequest, Reply
from tests.helpers.hosts import WAIT, sock_of, until


class GatedModel:
    """A summarizer endpoint that holds every answer until the test opens the gate."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.server = FakeOpenAIServer(responder=self.respond)

    def respond(self, request: RecordedRequest) -> Reply:
        self.gate.wait(WAIT)
        return Reply(text="Summary: the parser was fixed and its tests pass.")


@pytest.fixture
def model() -> Iterator[GatedModel]:
    gated = GatedModel()
    with gated.server:
        yield gated
        gated.gate.set()


def messages(count: int) -> list[dict[str, Any]]:
    return [{"id": f"m{i}", "role": "user" if i % 2 == 0 else "assistant", "content": f"step {i}: " + "edit " * 60}
            for i in range(count)]


@pytest.fixture
async def clients(tmp_path: Path, runtime: Path, model: GatedModel) -> AsyncIterator[tuple[SidecarClient, ...]]:
    db = tmp_path / "memory.duckdb"
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    settings = {**llm_settings(model.server), "storage": {"path": str(db)}}
    agent = await SidecarClient.spawn(settings=settings, env=env, timeout=WAIT, command=None)
    editor = await SidecarClient.spawn(settings=settings, env=env, timeout=WAIT)
    try:
        yield agent, editor
    finally:
        await editor.close()
        await agent.close()


async def test_a_client_killed_during_its_compaction_leaves_the_session_compacted_and_no_error(
        tmp_path: Path, runtime: Path, model: GatedModel, clients: tuple[SidecarClient, ...]) -> None:
    agent, editor = clients
    await agent.ingest("s", messages(40))
    await editor.request("context/follow", {"sessionId": "s", "follow": True})
    compacted = editor.wait_for_notification("context/didCompact", lambda event: event.session_id == "s",
                                             timeout=WAIT)
    asking = asyncio.ensure_future(agent.compact("s", mode="incremental", work_done_token="agent-compact"))
    await until(lambda: model.server.in_flight > 0, "the summarizer call")
    assert agent.process is not None
    agent.process.send_signal(signal.SIGKILL)  # Ctrl-C, a closed terminal: the relay is gone with its client
    with pytest.raises(ConnectionError):
        await asking
    # The editor works on while the compaction waits for the summarizer.
    await editor.ingest("other", messages(2))
    model.gate.set()
    event = await compacted
    assert event.trigger == "manual" and event.summary_ids
    usage = await editor.usage("s")
    assert usage.summaries >= 1 and usage.messages == 40
    assembled = await editor.assemble("s")
    assert assembled.items[0].kind == "summary"
    assert all(request.body is not None for request in model.server.chat_requests)
    text = sock_of(runtime, tmp_path / "memory.duckdb").with_suffix(".log").read_text()
    assert "ERROR" not in text and "Traceback" not in text, text


async def test_a_client_killed_while_the_server_waits_on_its_hook_lets_the_compaction_proceed(
        tmp_path: Path, runtime: Path, model: GatedModel) -> None:
    model.gate.set()
    db = tmp_path / "memory.duckdb"
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    settings = {**llm_settings(model.server), "storage": {"path": str(db)},
                "compaction": {"hookTimeoutSeconds": 3600}}
    asked = asyncio.Event()

    async def never_answers(params: Any) -> Any:
        asked.set()
        await asyncio.Event().wait()

    agent = await SidecarClient.spawn(settings=settings, env=env, timeout=WAIT, will_compact=never_answers)
    async with await SidecarClient.spawn(settings=settings, env=env, timeout=WAIT) as editor:
        await agent.ingest("s", messages(40))
        await editor.request("context/follow", {"sessionId": "s", "follow": True})
        compacted = editor.wait_for_notification("context/didCompact", lambda event: event.session_id == "s",
                                                 timeout=WAIT)
        asking = asyncio.ensure_future(agent.compact("s"))
        await asyncio.wait_for(asked.wait(), WAIT)
        assert agent.process is not None
        agent.process.send_signal(signal.SIGKILL)
        with pytest.raises(ConnectionError):
            await asking
        event = await compacted  # long before the hook's hour is up: nobody is left to answer it
        assert event.summary_ids
    await agent.close()


async def test_each_client_finds_the_hosts_lines_of_its_connection_in_its_own_log_file(
        tmp_path: Path, runtime: Path) -> None:
    db = tmp_path / "memory.duckdb"
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    settings = {"storage": {"path": str(db)}}
    first = await SidecarClient.spawn(command=[sys.executable, "-m", "sidecar", "-v", "--log-file", str(logs[0])],
                                      settings=settings, env=env, timeout=WAIT)
    second = await SidecarClient.spawn(command=[sys.executable, "-m", "sidecar", "--log-file", str(logs[1])],
                                       settings=settings, env=env, timeout=WAIT)
    await first.ingest("one", messages(30))
    await second.ingest("two", messages(30))
    await first.compact("one", mode="handoff")
    await second.compact("two", mode="handoff")
    await second.close()
    await first.close()
    mine = logs[0].read_text()
    assert "INFO sidecar.rpc.host [host]: connection 1: relay pid" in mine
    assert "INFO sidecar.services.compaction.runner [host]: compaction of one (handoff, manual): " in mine
    assert "compaction of two" not in mine
    assert "[host]" not in logs[1].read_text()  # no -v: nothing at INFO for the second
    await until(lambda: not sock_of(runtime, db).exists(), "the host to leave")


async def test_a_host_that_exits_cleanly_leaves_nothing_in_the_runtime_directory(
        tmp_path: Path, runtime: Path) -> None:
    db = tmp_path / "memory.duckdb"
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    async with await SidecarClient.spawn(settings={"storage": {"path": str(db)}}, env=env, timeout=WAIT) as client:
        await client.ingest("s", messages(2))
        sock = sock_of(runtime, db)
        assert {path.suffix for path in sock.parent.iterdir()} == {".sock", ".lock", ".log"}
    await until(lambda: not any(sock.parent.iterdir()), "the host to tidy up")
    # And a new client starts a new host as before.
    async with await SidecarClient.spawn(settings={"storage": {"path": str(db)}}, env=env, timeout=WAIT) as client:
        assert (await client.usage("s")).messages == 2


def test_help_says_where_the_host_logs() -> None:
    helped = subprocess.run([sys.executable, "-m", "sidecar", "--help"], capture_output=True, text=True,
                            timeout=WAIT).stdout
    assert "--log-file, marked [host]" in " ".join(helped.split())
    assert "<hash>.log beside its socket" in helped


async def test_a_client_that_connects_changes_nothing_another_one_sees(tmp_path: Path, runtime: Path) -> None:
    # The agent's session over its window compacts with the agent's settings; an editor that connects with others
    # (a shorter fresh tail) must not change the threshold, state or figures the agent is told.
    db = tmp_path / "memory.duckdb"
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    settings = {"storage": {"path": str(db)}, "contextWindow": 4000,
                "compaction": {"reserveTokens": 0, "freshTail": 4, "keepRecentTokens": 0}}
    async with await SidecarClient.spawn(settings=settings, env=env, timeout=WAIT) as agent:
        compacted = agent.wait_for_notification(
            "context/didChangeUsage", lambda usage: usage.summaries > 0 and usage.state != "compacting", timeout=WAIT)
        await agent.ingest("s", [{"id": f"m{i}", "role": "user", "content": "word " * 320} for i in range(12)])
        await compacted
        before = await agent.usage("s")
        async with await SidecarClient.spawn(settings={"storage": {"path": str(db)}}, env=env, timeout=WAIT) as editor:
            await editor.change_settings({"storage": {"path": str(db)}, "compaction": {"freshTail": 2}})
            await editor.sessions()
            after = await agent.usage("s")
    assert before.summaries > 0 and before.tokens <= 4000
    assert (after.state, after.tokens, after.threshold, after.summaries, after.hint) == \
        (before.state, before.tokens, before.threshold, before.summaries, before.hint)


def test_a_host_whose_starter_is_killed_while_it_opens_the_database_serves_and_tidies_up(
        tmp_path: Path, runtime: Path) -> None:
    db = tmp_path / "memory.duckdb"
    sock = sock_of(runtime, db)
    sock.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    sock.with_suffix(".lock").touch(mode=0o600)  # as the relay leaves it: made, and unlocked when it died
    host = subprocess.Popen([sys.executable, "-m", "sidecar", "host", "--db", str(db), "--socket", str(sock),
                             "--linger", "0.5", "--log-file", str(sock.with_suffix(".log"))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    assert host.stdout is not None and host.stderr is not None
    host.stdout.close()  # the relay that started it is gone before it says "ready"
    try:
        assert host.wait(WAIT) == 0, host.stderr.read().decode()
    finally:
        if host.poll() is None:
            host.kill()
    assert list(sock.parent.iterdir()) == [], [path.read_text() for path in sock.parent.glob("*.log")]
