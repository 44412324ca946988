"""Sharing one database: a host process and relays, through real processes (no --no-share here)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol import errors as codes
from protocol import methods
from sidecar import __version__
from sidecar.client import SidecarClient, SidecarRequestError
from sidecar.framing import FrameReader
from sidecar.rpc import handshake
from tests.helpers.hosts import WAIT, host_hello, host_pid, sock_of, until

CLI = [sys.executable, "-m", "sidecar"]


def env_for(runtime: Path) -> dict[str, str]:
    return {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}


async def spawn(db: Path, runtime: Path, **kwargs: Any) -> SidecarClient:
    """A client, attached: the first one answers initialize before its host listens, so one more round trip."""
    settings = {"storage": {"path": str(db)}, **kwargs.pop("settings", {})}
    client = await SidecarClient.spawn(settings=settings, env=env_for(runtime), timeout=WAIT, **kwargs)
    with contextlib.suppress(SidecarRequestError):
        await client.sessions()
    return client


@contextlib.asynccontextmanager
async def clients(db: Path, runtime: Path, count: int) -> AsyncIterator[list[SidecarClient]]:
    started = [await spawn(db, runtime)]  # the first starts the host; the rest find it
    started += await asyncio.gather(*(spawn(db, runtime) for _ in range(count - 1)))
    try:
        yield started
    finally:
        await asyncio.gather(*(client.close() for client in started))


def message(msg_id: str, text: str = "hello") -> dict[str, Any]:
    return {"id": msg_id, "role": "user", "content": text}


async def test_two_clients_share_one_database_through_one_host(tmp_path: Path, runtime: Path) -> None:
    db = tmp_path / "memory.duckdb"
    async with clients(db, runtime, 2) as (agent, editor):
        await agent.ingest("agent", [message("m1", "from the agent")])
        await editor.ingest("editor", [message("e1", "from the editor")])
        for client in (agent, editor):
            listed = await client.sessions()
            assert sorted(s.session_id for s in listed.sessions) == ["agent", "editor"]
        sock_file = sock_of(runtime, db)
        assert stat.S_IMODE(sock_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(sock_file.parent.stat().st_mode) == 0o700
        assert agent.process is not None and editor.process is not None
        assert host_pid(sock_file) not in (agent.process.pid, editor.process.pid)


async def test_eight_clients_ingest_concurrently_and_all_see_everything(tmp_path: Path, runtime: Path) -> None:
    db = tmp_path / "memory.duckdb"
    async with clients(db, runtime, 8) as eight:
        async def work(index: int, client: SidecarClient) -> None:
            for n in range(10):
                await client.ingest(f"s{index}", [message(f"m{index}-{n}")])

        await asyncio.gather(*(work(i, c) for i, c in enumerate(eight)))
        for client in eight:
            listed = (await client.sessions()).sessions
            assert {s.session_id: s.messages for s in listed} == {f"s{i}": 10 for i in range(8)}


async def test_the_host_outlives_the_client_that_started_it_and_exits_after_the_last(
        tmp_path: Path, runtime: Path) -> None:
    db = tmp_path / "memory.duckdb"
    first = await spawn(db, runtime)
    second = await spawn(db, runtime)
    sock_file = sock_of(runtime, db)
    pid = host_pid(sock_file)
    await first.ingest("s", [message("m1")])
    await first.close()
    await second.ingest("s", [message("m2")])
    assert (await second.usage("s")).messages == 2
    assert host_pid(sock_file) == pid
    await second.close()
    await until(lambda: not sock_file.exists(), "the host to leave")
    await until(lambda: not Path(f"{db}.wal").exists(), "the checkpoint")
    # The file is free again and holds both messages.
    async with await SidecarClient.spawn(command=[*CLI, "--no-share"], settings={"storage": {"path": str(db)}},
                                         timeout=WAIT) as alone:
        assert (await alone.usage("s")).messages == 2


async def test_kill_9_of_the_host_loses_no_acknowledged_message(tmp_path: Path, runtime: Path) -> None:
    db = tmp_path / "memory.duckdb"
    total = 40
    acked: dict[int, list[str]] = {i: [] for i in range(4)}
    retried: list[dict[str, Any]] = []
    async with clients(db, runtime, 4) as four:
        sock_file = sock_of(runtime, db)
        pid = host_pid(sock_file)
        killed = asyncio.Event()

        async def work(index: int, client: SidecarClient) -> None:
            for n in range(total):
                msg_id = f"m{index}-{n}"
                while True:
                    try:
                        await client.ingest(f"s{index}", [message(msg_id)])
                        break
                    except SidecarRequestError as error:
                        assert error.code == codes.HOST_CONNECTION_LOST, error
                        assert error.data["retryable"] is True
                        retried.append(error.data)
                acked[index].append(msg_id)
                if n == 5:
                    await killed.wait()  # every client is mid-stream when the host dies

        async def kill() -> None:
            await until(lambda: all(len(ids) >= 5 for ids in acked.values()), "ingest to start")
            os.kill(pid, signal.SIGKILL)
            killed.set()

        await asyncio.gather(kill(), *(work(i, c) for i, c in enumerate(four)))
        assert host_pid(sock_file) != pid
        for index, client in enumerate(four):
            assembled = await client.assemble(f"s{index}")
            ids = [item.id for item in assembled.items]
            assert sorted(ids) == sorted(acked[index]) and len(ids) == total
            assert (await client.usage(f"s{index}")).messages == total


async def test_a_stale_socket_file_is_replaced(tmp_path: Path, runtime: Path) -> None:
    db = tmp_path / "memory.duckdb"
    sock_file = sock_of(runtime, db)
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(sock_file))
    dead.close()  # the file stays, nobody listens: what a killed host leaves
    with pytest.raises(ConnectionRefusedError):
        host_hello(sock_file)
    async with clients(db, runtime, 1) as (client,):
        await client.ingest("s", [message("m1")])
        assert host_pid(sock_file) > 0  # a host listens on the name now


@contextlib.contextmanager
def fake_listener(path: Path, answer: bytes | None) -> Iterator[None]:
    """Something on the socket that is not a host: it answers ``answer`` (or nothing) to whatever comes."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(8)
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)
            if answer is not None:
                conn.recv(4096)
                conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        for conn in held:
            conn.close()


@pytest.mark.parametrize("answer", [None, b"HTTP/1.0 400 Bad Request\r\n\r\n"], ids=["silent", "other-program"])
async def test_something_that_is_not_a_host_on_the_socket_is_a_clear_error(
        tmp_path: Path, runtime: Path, answer: bytes | None) -> None:
    db = tmp_path / "memory.duckdb"
    sock_file = sock_of(runtime, db)
    with fake_listener(sock_file, answer), pytest.raises(SidecarRequestError) as raised:
        await spawn(db, runtime)
    assert raised.value.code == codes.STORAGE_ERROR
    assert str(sock_file) in raised.value.message and "not a context-sidecar host" in raised.value.message
    assert not db.exists()  # nothing opened the database behind the squatter's back


async def test_a_host_of_another_version_is_refused_naming_both(tmp_path: Path, runtime: Path) -> None:
    db = tmp_path / "memory.duckdb"
    sock_file = sock_of(runtime, db)
    other = json.dumps({"program": "context-sidecar", "role": "host", "version": "0.0.1", "protocol": 1}).encode()
    with fake_listener(sock_file, other + b"\n"), pytest.raises(SidecarRequestError) as raised:
        await spawn(db, runtime)
    assert "0.0.1" in raised.value.message and __version__ in raised.value.message


async def test_a_relay_of_another_version_is_refused_by_the_host_naming_both(tmp_path: Path, runtime: Path) -> None:
    db = tmp_path / "memory.duckdb"
    async with clients(db, runtime, 1) as (client,):
        line = json.dumps({"program": "context-sidecar", "role": "relay", "version": "9.9.9", "protocol": 7})
        refused = host_hello(sock_of(runtime, db), raw=line.encode() + b"\n")
        assert "9.9.9" in refused["error"] and __version__ in refused["error"]
        await client.ingest("s", [message("m1")])  # the host serves on


def _connect_as(uid: int, path: str) -> str:
    """In a child running as ``uid``: what connecting to the host at ``path`` gives."""
    code = (f"import os,socket,sys;os.setgid({uid});os.setuid({uid});s=socket.socket(socket.AF_UNIX)\n"
            "try:\n s.connect(sys.argv[1])\nexcept OSError as e:\n print('oserror', e.errno); sys.exit()\n"
            # The host may refuse (and close) before reading the hello: what it wrote is still there to read.
            "try:\n s.sendall(sys.argv[2].encode()+b'\\n')\nexcept OSError:\n pass\n"
            "print(s.makefile().readline().strip())")
    hello = handshake.hello("relay").decode().strip()
    return subprocess.run([sys.executable, "-c", code, path, hello], capture_output=True, text=True,
                          timeout=WAIT).stdout.strip()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a child as another user")
async def test_another_uid_is_refused(tmp_path: Path, runtime: Path) -> None:
    db = tmp_path / "memory.duckdb"
    nobody = 65534
    async with clients(db, runtime, 1) as (client,):
        sock_file = sock_of(runtime, db)
        os.chmod(runtime, 0o755)
        assert _connect_as(nobody, str(sock_file)).startswith("oserror")  # the 0700 directory keeps it out
        # Opened up by hand, the peer-credentials check still refuses it.
        os.chmod(sock_file.parent, 0o755)
        os.chmod(sock_file, 0o777)
        answer = json.loads(_connect_as(nobody, str(sock_file)))
        assert f"uid {nobody} may not connect" in answer["error"]
        os.chmod(sock_file.parent, 0o700)
        await client.ingest("s", [message("m1")])


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a file to another user")
async def test_a_database_owned_by_another_user_is_a_clear_error(tmp_path: Path, runtime: Path) -> None:
    db = tmp_path / "memory.duckdb"
    async with await SidecarClient.spawn(command=[*CLI, "--no-share"], settings={"storage": {"path": str(db)}},
                                         timeout=WAIT) as alone:
        await alone.ingest("s", [message("m1")])
    os.chown(db, 65534, 65534)
    before = db.read_bytes()
    async with clients(db, runtime, 1) as (client,):
        with pytest.raises(SidecarRequestError) as raised:
            await client.sessions()
    assert raised.value.code == codes.STORAGE_ERROR and "owned by uid 65534" in raised.value.message
    assert db.read_bytes() == before


async def test_no_share_keeps_one_process_and_memory_is_never_shared(tmp_path: Path, runtime: Path) -> None:
    db = tmp_path / "memory.duckdb"
    alone = await SidecarClient.spawn(command=[*CLI, "--no-share"], settings={"storage": {"path": str(db)}},
                                      env=env_for(runtime), timeout=WAIT)
    async with alone:
        await alone.ingest("s", [message("m1")])  # holds the file before the second one tries to open it
        by_setting = await spawn(db, runtime, settings={"storage": {"path": str(db), "share": False}})
        memory = await spawn(Path(":memory:"), runtime)
        async with by_setting, memory:
            with pytest.raises(SidecarRequestError) as raised:
                await by_setting.sessions()
            assert raised.value.code == codes.STORAGE_LOCKED
            await memory.ingest("s", [message("m1")])
            assert not list(runtime.glob("context-sidecar/*.sock"))


async def test_exit_codes_through_a_relay_follow_the_protocol(tmp_path: Path, runtime: Path) -> None:
    db = tmp_path / "memory.duckdb"
    client = await spawn(db, runtime)
    assert await client.close() == 0
    rude = await spawn(db, runtime)
    await rude.notify("exit")  # no shutdown first
    assert rude.process is not None
    assert await asyncio.wait_for(rude.process.wait(), WAIT) == 1
    await rude.close()


async def test_the_initialize_result_names_the_shared_database(tmp_path: Path, runtime: Path) -> None:
    db = tmp_path / "memory.duckdb"
    async with clients(db, runtime, 1) as (client,):
        sidecar = client.initialize_result["capabilities"]["experimental"][methods.EXPERIMENTAL_KEY]
        assert sidecar["storage"] == os.path.realpath(db)


async def test_an_editor_follows_the_sessions_of_an_agent_in_its_workspace(tmp_path: Path, runtime: Path) -> None:
    db = tmp_path / "memory.duckdb"
    project = tmp_path / "project"
    project.mkdir()
    agent = await spawn(db, runtime, command=["env", "-C", str(project), *CLI])  # names no root: its cwd counts
    editor = await spawn(db, runtime)
    bystander = await spawn(db, runtime)
    try:
        await bystander.ingest("elsewhere", [message("b1")])
        followed = await editor.request(methods.CONTEXT_FOLLOW, {"workspace": str(project), "follow": True})
        assert followed == {"sessions": [], "workspaces": [os.path.realpath(project)]}
        seen = editor.wait_for_notification(methods.CONTEXT_DID_CHANGE_USAGE, lambda u: u.session_id == "agent",
                                            timeout=WAIT)
        await agent.ingest("agent", [message(f"a{n}", "word " * 400) for n in range(30)])
        assert (await seen).messages == 30
        listed = await editor.request(methods.MEMORY_SESSIONS, {"workspace": str(project)})
        assert [(s["sessionId"], s["workspace"]) for s in listed["sessions"]] == [
            ("agent", os.path.realpath(project))]

        compacted = editor.wait_for_notification(methods.CONTEXT_DID_COMPACT, lambda c: c.session_id == "agent",
                                                 timeout=WAIT)
        assert (await agent.compact("agent", "full")).compacted
        assert (await compacted).tokens_after < (await compacted).tokens_before

        # The bystander neither worked on the agent's session nor follows it: its own change comes alone.
        events: list[str] = []
        bystander.on_usage(lambda usage: events.append(usage.session_id))
        await bystander.ingest("elsewhere", [message("b2")])
        await bystander.usage("elsewhere")
        assert set(events) <= {"elsewhere"}

        # The follow survives the host's death: the relay opens the session again on the new host.
        os.kill(host_pid(sock_of(runtime, db)), signal.SIGKILL)
        again = editor.wait_for_notification(methods.CONTEXT_DID_CHANGE_USAGE,
                                             lambda u: u.session_id == "agent" and u.messages == 31, timeout=WAIT)
        while True:
            try:
                await agent.ingest("agent", [message("a-after")])
                break
            except SidecarRequestError as error:
                assert error.code == codes.HOST_CONNECTION_LOST
        assert (await again).messages == 31
    finally:
        await asyncio.gather(agent.close(), editor.close(), bystander.close())


@pytest.mark.parametrize(("params", "code", "field"), [
    ({"follow": True}, codes.INVALID_PARAMS, "sessionId"),
    ({"follow": "yes", "sessionId": "s"}, codes.INVALID_PARAMS, "follow"),
    ({"follow": True, "workspace": ""}, codes.INVALID_PARAMS, "workspace"),
    ({"follow": True, "sessionId": "nope"}, codes.UNKNOWN_SESSION, None),
    ({"follow": True, "workspace": 7}, codes.INVALID_PARAMS, "workspace"),
])
async def test_follow_rejects_bad_params_and_changes_nothing(tmp_path: Path, runtime: Path, params: dict[str, Any],
                                                             code: int, field: str | None) -> None:
    async with clients(tmp_path / "memory.duckdb", runtime, 1) as (client,):
        await client.ingest("s", [message("m1")])
        with pytest.raises(SidecarRequestError) as raised:
            await client.request(methods.CONTEXT_FOLLOW, params)
        assert raised.value.code == code
        if field:
            assert raised.value.data["field"] == field
        assert await client.request(methods.CONTEXT_FOLLOW, {"follow": False, "sessionId": "s"}) == {
            "sessions": [], "workspaces": []}
        assert (await client.usage("s")).messages == 1


async def test_sessions_rejects_a_workspace_that_is_not_a_string(tmp_path: Path, runtime: Path) -> None:
    async with clients(tmp_path / "memory.duckdb", runtime, 1) as (client,):
        with pytest.raises(SidecarRequestError) as raised:
            await client.request(methods.MEMORY_SESSIONS, {"workspace": 3})
        assert raised.value.code == codes.INVALID_PARAMS and raised.value.data["field"] == "workspace"


def test_help_explains_sharing_and_the_way_out() -> None:
    helped = subprocess.run([*CLI, "--help"], capture_output=True, text=True, timeout=WAIT).stdout
    assert "--no-share" in helped and "storage.share" in helped and "context-sidecar-UID" in helped
    host = subprocess.run([*CLI, "host", "--help"], capture_output=True, text=True, timeout=WAIT).stdout
    assert "--linger" in host and "--socket" in host


async def test_relative_paths_start_in_the_clients_directory_not_the_hosts(tmp_path: Path, runtime: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "chat.json").write_text(json.dumps([{"role": "user", "content": "imported here"}]))
    agent = await spawn(tmp_path / "memory.duckdb", runtime, command=["env", "-C", str(project), *CLI])
    try:
        done = await agent.request(methods.MEMORY_IMPORT, {"path": "chat.json", "sessionId": "imp",
                                                           "format": "openai"})
        assert len(done["ids"]) == 1 and done["sessionId"] == "imp"
    finally:
        await agent.close()


def _frame(body: bytes) -> bytes:
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def test_bad_frames_through_a_relay_are_answered_and_the_relay_serves_on(tmp_path: Path, runtime: Path) -> None:
    init = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "capabilities": {}, "initializationOptions": {"storage": {"path": str(tmp_path / "memory.duckdb")}}}})
    payload = b"".join([
        _frame(init.encode()),
        _frame(b'{"jsonrpc":"2.0","method":"initialized","params":{}}'),
        _frame(b"this is not json"),
        _frame(b'{"jsonrpc":"2.0","id":[1],"method":"memory/sessions","params":{}}'),
        _frame(b'{"jsonrpc":"2.0","id":{"a":1},"method":"memory/sessions"}'),
        b"junk before a header ",
        _frame(b'{"jsonrpc":"2.0","id":2,"method":"memory/sessions","params":{}}'),
        _frame(b'{"jsonrpc":"2.0","id":3,"method":"shutdown"}'),
        _frame(b'{"jsonrpc":"2.0","method":"exit"}'),
    ])
    done = subprocess.run(CLI, input=payload, capture_output=True, timeout=WAIT, env=env_for(runtime))
    assert done.returncode == 0, done.stderr[-2000:]
    reader = FrameReader()
    reader.feed(done.stdout)
    replies = [frame.message for frame in reader.frames(stalled=True)]
    by_id = {reply.get("id"): reply for reply in replies if "id" in reply}
    assert by_id[2]["result"] == {"sessions": []} and by_id[3]["result"] is None
    errors = [reply["error"]["code"] for reply in replies if reply.get("id") is None and "error" in reply]
    assert codes.PARSE_ERROR in errors and codes.INVALID_REQUEST in errors
    assert list(runtime.glob("context-sidecar/*.log"))  # it went through a host (which keeps its log there)
