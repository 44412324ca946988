"""``context-sidecar mcp`` answers initialize and tools/list before it loads anything those answers do not need.

Claude Code in ``-p`` mode waits about a second for its MCP servers; on a busy machine the imports of the event
loop, the host link and the protocol's types alone took longer. The server runs here with every such import held
back until the test lets it go: the first answers (and the request for roots) must come all the same, and what
needs the loop (a tools/call) must wait for it and then work, with a cancellation still honoured.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from sidecar.services.model_tools.definitions import NAMES
from tests.helpers.mcp import WAIT, McpClient, mcp_env

HELD = ("asyncio", "attrs", "cattrs", "protocol", "duckdb", "pygls", "lsprotocol", "psycopg", "psycopg_pool", "ssl",
        "openai", "httpx", "sidecar.client", "sidecar.wire", "sidecar.rows", "sidecar.mcp.host", "sidecar.mcp.loop",
        "sidecar.cli.team_command", "sidecar.cli.proxy_command")
"""Not needed to answer initialize and tools/list: the event loop, attrs and cattrs, the storage and RPC layers'
modules, the host link, other commands' modules."""

PROBE = """
import os, sys, threading
held, release_fd, argv = sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3:]
already = sorted(name for name in held if name in sys.modules)
if already:
    print("loaded before the server started:", *already, file=sys.stderr, flush=True)
    raise SystemExit(3)
released = threading.Event()
threading.Thread(target=lambda: (os.read(release_fd, 1), released.set()), daemon=True).start()

class Hold:
    def find_spec(self, name, path=None, target=None):
        if any(name == h or name.startswith(h + ".") for h in held) and not released.is_set():
            print(f"held {name} in {threading.current_thread().name}", file=sys.stderr, flush=True)
            released.wait()
        return None

sys.meta_path.insert(0, Hold())
from sidecar.cli.main import main
raise SystemExit(main(argv))
"""


class HeldServer:
    """The server with HELD imports held back; its stderr lines as they come."""

    def __init__(self, process: asyncio.subprocess.Process, client: McpClient, release: int) -> None:
        self.process, self.client, self._release = process, client, release
        self.stderr: list[str] = []
        self._line = asyncio.Event()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        assert self.process.stderr is not None
        while line := await self.process.stderr.readline():
            self.stderr.append(line.decode(errors="replace").rstrip())
            self._line.set()

    async def held(self) -> str:
        """The first import held back (the main thread is then stuck on it)."""
        while True:
            for line in self.stderr:
                if line.startswith("held "):
                    return line
            assert self.process.returncode is None, self.stderr
            self._line.clear()
            await asyncio.wait_for(self._line.wait(), WAIT)

    def release(self) -> None:
        os.write(self._release, b"x")

    async def reply(self, future: asyncio.Future[dict[str, object]], what: str) -> dict[str, object]:
        try:
            return await asyncio.wait_for(future, WAIT)
        except TimeoutError:
            raise AssertionError(f"no answer to {what} while the imports were held; stderr: {self.stderr}") from None


@contextlib.asynccontextmanager
async def held_server(tmp_path: Path, runtime: Path, roots: list[str] | None = None) -> AsyncIterator[HeldServer]:
    read, write = os.pipe()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-P", "-c", PROBE, ",".join(HELD), str(read),
        "mcp", "--db", str(tmp_path / "m.duckdb"), "--log-file", str(tmp_path / "mcp.log"), "-v",
        cwd=tmp_path, env=mcp_env(runtime), pass_fds=(read,), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, limit=1 << 24)
    os.close(read)
    server = HeldServer(process, McpClient(process, roots), write)
    try:
        yield server
    finally:
        with contextlib.suppress(OSError):
            server.release()
        os.close(write)
        if process.returncode is None:
            await server.client.close()
        await server._reader


async def test_initialize_and_tools_list_are_answered_while_the_rest_is_still_loading(
        tmp_path: Path, runtime: Path) -> None:
    workspace = tmp_path / "project"
    workspace.mkdir()
    async with held_server(tmp_path, runtime, roots=[str(workspace)]) as server:
        mcp = server.client
        held = await server.held()  # the main thread is stuck importing: only the stdin thread can answer
        initialized = mcp.expect(0)
        mcp.write({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {"roots": {}},
            "clientInfo": {"name": "t", "version": "1"}}})
        result = await server.reply(initialized, "initialize")
        mcp.notify("notifications/initialized")
        listed = mcp.expect(1)
        mcp.write({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        tools = await server.reply(listed, "tools/list")
        pinged = mcp.expect(2)
        mcp.write({"jsonrpc": "2.0", "id": 2, "method": "ping"})
        assert (await server.reply(pinged, "ping"))["result"] == {}
        asked_early = [request["method"] for request in mcp.server_requests]  # before the tools/list reply

        # What needs the event loop waits for it: a call cancelled meanwhile is never answered, the next one is.
        mcp.write({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "no_such_tool"}})
        mcp.notify("notifications/cancelled", {"requestId": 3, "reason": "the user pressed Esc"})
        called = mcp.expect(4)
        mcp.write({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                   "params": {"name": "memory_grep", "arguments": {"pattern": "anything"}}})
        server.release()
        call = await asyncio.wait_for(called, WAIT)
        roots_asked = [request["method"] for request in mcp.server_requests]
        code = await mcp.close()

    assert held.split()[1].split(".")[0] in {name.split(".")[0] for name in HELD}, held
    assert result["result"]["protocolVersion"] == "2025-06-18"  # type: ignore[index]
    assert [tool["name"] for tool in tools["result"]["tools"]] == list(NAMES)  # type: ignore[index]
    assert asked_early == ["roots/list"], "roots are asked for after initialized, loop or not"
    assert roots_asked == ["roots/list"]
    text = call["result"]["content"][0]["text"]
    assert call["result"]["isError"] is False and str(workspace) in text, text  # the root, once answered
    assert not [m for m in mcp.received if isinstance(m, dict) and m.get("id") == 3], \
        "a call cancelled before the loop ran was answered (an unknown tool is answered at once)"
    assert code == 0


async def test_stdin_closed_before_the_loop_runs_is_a_clean_exit(tmp_path: Path, runtime: Path) -> None:
    async with held_server(tmp_path, runtime) as server:
        await server.held()
        listed = server.client.expect(1)
        server.client.write({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert len((await server.reply(listed, "tools/list"))["result"]["tools"]) == 4  # type: ignore[index]
        assert server.process.stdin is not None
        server.process.stdin.close()
        server.release()
        code = await asyncio.wait_for(server.process.wait(), WAIT)
    assert code == 0, server.stderr


def test_the_tool_definitions_load_without_the_protocol_or_attrs() -> None:
    # What tools/list answers with is constants: json, and nothing of the layers it would wait for.
    import subprocess

    probe = ("import sys, json, sidecar.mcp.server as s\n"
             "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
             "{'asyncio', 'attrs', 'cattrs', 'protocol', 'duckdb', 'pygls', 'psycopg'})))")
    loaded = subprocess.run([sys.executable, "-P", "-c", probe], capture_output=True, text=True, timeout=WAIT,
                            check=True)
    assert json.loads(loaded.stdout) == []
