"""The first client of a database answers ``initialize`` itself while the host it starts opens the database;
the host's own reply to it agrees and is not sent again. Its speed is a bench figure (share_init_first_ms)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from sidecar.framing import FrameReader, encode
from tests.helpers.hosts import WAIT

CLI = [sys.executable, "-m", "sidecar"]


def session(db: Path, *, root: str | None = None) -> list[dict[str, Any]]:
    """A client's whole session: initialize, a request, shutdown and exit."""
    return [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "processId": None, "rootUri": root, "capabilities": {},
            "initializationOptions": {"storage": {"path": str(db)}}}},
        {"jsonrpc": "2.0", "method": "initialized", "params": {}},
        {"jsonrpc": "2.0", "id": 2, "method": "memory/sessions", "params": {}},
        {"jsonrpc": "2.0", "id": 3, "method": "shutdown"},
        {"jsonrpc": "2.0", "method": "exit"},
    ]


def talk(messages: list[dict[str, Any]], env: dict[str, str], *args: str) -> tuple[list[Any], int]:
    """Run a client's session against a fresh context-sidecar: every message it wrote back, and its exit code."""
    run = subprocess.run([*CLI, *args], input=b"".join(encode(m) for m in messages), capture_output=True,
                         env=env, timeout=WAIT * 2)
    reader = FrameReader()
    reader.feed(run.stdout)
    return [frame.message for frame in reader.frames()], run.returncode


def test_the_first_client_gets_one_initialize_reply_which_the_host_confirms(tmp_path: Path, runtime: Path) -> None:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    db = tmp_path / "memory.duckdb"
    log = tmp_path / "relay.log"
    replies, code = talk(session(db), env, "-v", "--log-file", str(log))
    assert code == 0
    assert [reply.get("id") for reply in replies if "id" in reply] == [1, 2, 3]
    initialize = replies[0]["result"]
    assert initialize["capabilities"]["experimental"]["contextSidecar"]["storage"] == os.path.realpath(db)
    assert replies[1]["result"] == {"sessions": []}
    text = log.read_text()
    # This client answered initialize, then started the host.
    assert 0 <= text.index("answered initialize; the host of") < text.index("started the host of"), text
    assert "before the host's reply" not in text, text  # the host's reply said the same
    # A second client, of the running host, is answered by the host: the same result.
    again, _ = talk(session(db), env)
    assert again[0]["result"] == initialize


def test_a_first_client_that_cannot_start_a_host_serves_alone_after_its_early_reply(
        tmp_path: Path, runtime: Path) -> None:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    db = tmp_path / "memory.duckdb"
    holder = subprocess.Popen([*CLI, "--no-share", "--db", str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              env=env)
    try:
        assert holder.stdin is not None and holder.stdout is not None
        opening = session(db)
        holder.stdin.write(encode(opening[0]) + encode(opening[1]) + encode(opening[2]))
        holder.stdin.flush()
        reader = FrameReader()
        seen: list[Any] = []
        while sum(1 for message in seen if message.get("id") == 2) == 0:
            reader.feed(os.read(holder.stdout.fileno(), 1 << 16))
            seen += [frame.message for frame in reader.frames()]
        # The database is held by a process that does not share it: no host can open it.
        replies, code = talk(session(db), env)
        answers = [reply for reply in replies if "id" in reply]  # a window/showMessage may come between them
        assert [answer["id"] for answer in answers] == [1, 2, 3], replies
        assert "result" in answers[0]
        assert answers[1]["error"]["code"] == -32020
        assert code == 0
        # The host that could not start leaves nothing behind: no lock, no empty log.
        assert list((runtime / "context-sidecar").iterdir()) == []
    finally:
        holder.kill()
        holder.wait()


def test_the_early_reply_names_the_database_as_the_host_does(tmp_path: Path, runtime: Path) -> None:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    replies, _ = talk(session(tmp_path / "link" / "memory.duckdb"), env)
    storage = replies[0]["result"]["capabilities"]["experimental"]["contextSidecar"]["storage"]
    assert storage == str((tmp_path / "real" / "memory.duckdb").resolve())


def test_a_relay_loads_no_event_loop_http_client_server_or_database() -> None:
    # What the first client waits for is a process start and these imports: the relay path is select() and sockets.
    probe = ("import sys, sidecar.cli.main as cli; cli.build_parser()\n"
             "import sidecar.rpc.startup, sidecar.rpc.relay\n"
             "print(sorted({'asyncio', 'urllib.request', 'ssl', 'pygls', 'duckdb', 'openai'} & set(sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=WAIT, check=True)
    assert loaded.stdout.strip() == "[]"
