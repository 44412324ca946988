"""memory/watch through a shared host: one follower however many connections watch, ended with the last of them,
and replayed to a new host by the relay."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from protocol import errors as codes
from protocol import methods
from sidecar.client import SidecarRequestError
from tests.helpers.hosts import until_logged
from tests.test_sharing import CLI, host_pid, sock_of, spawn
from tests.test_watch import Agents, usage_of


async def test_connections_share_the_followers_and_the_last_to_leave_stops_them(tmp_path: Path,
                                                                               runtime: Path) -> None:
    db = tmp_path / "memory.duckdb"
    agents = Agents(tmp_path)
    writer = agents.claude("cc-shared")
    writer.user("first words")
    mcp = await spawn(db, runtime, command=[*CLI, "-v"])  # starts the host, logging what it follows
    editor = await spawn(db, runtime)
    log = sock_of(runtime, db).with_suffix(".log")
    try:
        await editor.follow(workspace=str(agents.workspace))
        imported = usage_of(editor, "cc-shared")
        first = await mcp.watch(str(agents.workspace), env=agents.env)
        assert first.connections == 1
        await imported
        second = await editor.watch(str(agents.workspace), env=agents.env)
        assert second.connections == 2
        assert [(t.state, t.session_id) for t in second.transcripts] == [("following", "cc-shared")]

        await mcp.close()  # the editor still watches: the follower goes on
        grown = usage_of(editor, "cc-shared", lambda usage: usage.messages == 2)
        writer.assistant("an answer written after the first watcher left")
        await grown
        assert (await editor.watch(str(agents.workspace), env=agents.env)).connections == 1
    finally:
        await mcp.close()
        await editor.close()
    await until_logged(log, f"no longer watching {os.path.realpath(agents.workspace)}")


async def test_a_connection_joining_a_watch_is_told_of_the_files_there_now(tmp_path: Path, runtime: Path) -> None:
    """A watch another connection started looks again for whoever asks: a file made since its last look is listed."""
    db = tmp_path / "memory.duckdb"
    agents = Agents(tmp_path)
    agents.claude("cc-earlier").user("an earlier session")
    editor = await spawn(db, runtime)
    mcp = await spawn(db, runtime)
    try:
        first = await editor.watch(str(agents.workspace), env=agents.env)
        assert [t.session_id or Path(t.path).stem for t in first.transcripts] == ["cc-earlier"]
        agents.claude("cc-new").user("a session begun after the editor's watch looked")  # within its SCAN_SECONDS
        joined = await mcp.watch(str(agents.workspace), env=agents.env)
        assert joined.connections == 2, "the editor's watch, joined"
        assert sorted(Path(t.path).stem for t in joined.transcripts) == ["cc-earlier", "cc-new"]
        agents.claude("cc-newer").user("and one more")
        again = await editor.watch(str(agents.workspace), env=agents.env)
        assert sorted(Path(t.path).stem for t in again.transcripts) == ["cc-earlier", "cc-new", "cc-newer"]
    finally:
        await mcp.close()
        await editor.close()


async def test_the_relay_watches_again_on_a_new_host(tmp_path: Path, runtime: Path) -> None:
    db = tmp_path / "memory.duckdb"
    agents = Agents(tmp_path)
    writer = agents.claude("cc-survivor")
    writer.user("before the host died")
    client = await spawn(db, runtime)
    try:
        await client.follow(workspace=str(agents.workspace))
        imported = usage_of(client, "cc-survivor")
        await client.watch(str(agents.workspace), env=agents.env)
        await imported
        os.kill(host_pid(sock_of(runtime, db)), signal.SIGKILL)
        while True:  # the first request after the kill may be the one in flight
            try:
                await client.sessions()
                break
            except SidecarRequestError as error:
                assert error.code == codes.HOST_CONNECTION_LOST
        grown = usage_of(client, "cc-survivor", lambda usage: usage.messages == 2)
        writer.assistant("written while a new host follows the file")
        assert (await grown).messages == 2
        found = await client.request(methods.MEMORY_GREP, {"sessionId": "cc-survivor", "pattern": "new host"})
        assert len(found["matches"]) == 1
    finally:
        await client.close()
