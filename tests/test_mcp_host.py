"""The MCP server when its host misbehaves: killed mid-call, unreachable; and a call the client cancels."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

from protocol import methods
from sidecar.pytest_plugin import llm_settings
from sidecar.testing import FakeOpenAIServer
from tests.conftest import call, running_sidecar, settings_for
from tests.helpers.gate import ANSWER, Gate
from tests.helpers.hosts import host_pid, sock_of
from tests.helpers.mcp import WAIT, mcp_server
from tests.helpers.workspaces import two_workspaces


async def test_a_host_killed_mid_call_is_replaced_and_the_call_answered(
        tmp_path: Path, runtime: Path, gated: tuple[FakeOpenAIServer, Gate]) -> None:
    server, gate = gated
    db = tmp_path / "m.duckdb"
    await two_workspaces(db, tmp_path)
    settings = ["--settings", json.dumps(llm_settings(server))]
    async with mcp_server(db, runtime, tmp_path / "ws-a", args=settings) as mcp:
        await mcp.initialize()
        call = asyncio.ensure_future(mcp.call("memory_query", {"question": "What is the staging PLATYPUS hint?"}))
        assert await asyncio.to_thread(gate.arrived.wait, WAIT)  # the host is inside the call, at the model
        first_host = host_pid(sock_of(runtime, db))
        os.kill(first_host, signal.SIGKILL)
        gate.opened.set()
        result = await asyncio.wait_for(call, WAIT)
        second_host = host_pid(sock_of(runtime, db))
    assert result["isError"] is False, result
    assert ANSWER in result["content"][0]["text"]
    assert second_host != first_host and gate.count == 2  # asked again, of a new host


async def test_a_locked_database_is_a_tool_error_that_says_why_and_a_later_call_attaches(
        tmp_path: Path, runtime: Path) -> None:
    db = tmp_path / "m.duckdb"
    async with running_sidecar(settings=settings_for(db)) as holder:  # --no-share: it holds the file itself
        holder_pid = holder._server.pid
        await call(holder, methods.MEMORY_SESSIONS, {})  # storage opens behind initialize: held once this answers
        async with mcp_server(db, runtime, tmp_path) as mcp:
            await mcp.initialize()
            locked = await mcp.call("memory_grep", {"pattern": "x"})
            assert await mcp.result("ping") == {}  # still serving
            await holder.shutdown_session()
            await asyncio.wait_for(holder._server.wait(), WAIT)
            later = await mcp.call("memory_grep", {"pattern": "x"})
    text = locked["content"][0]["text"]
    assert locked["isError"] is True and text.startswith("Error: ")
    assert "locked" in text and str(holder_pid) in text, text
    assert later["isError"] is False and "no session of this workspace" in later["content"][0]["text"]


async def test_a_cancelled_call_gets_no_reply_and_the_server_serves_on(
        tmp_path: Path, runtime: Path, gated: tuple[FakeOpenAIServer, Gate]) -> None:
    server, gate = gated
    db, log = tmp_path / "m.duckdb", tmp_path / "mcp.log"
    await two_workspaces(db, tmp_path)
    settings = ["--settings", json.dumps(llm_settings(server))]
    async with mcp_server(db, runtime, tmp_path / "ws-a", args=settings, log=log) as mcp:
        await mcp.initialize()
        mcp.write({"jsonrpc": "2.0", "id": "slow", "method": "tools/call",
                   "params": {"name": "memory_query", "arguments": {"question": "What is the PLATYPUS hint?"}}})
        assert await asyncio.to_thread(gate.arrived.wait, WAIT)
        mcp.notify("notifications/cancelled", {"requestId": "slow", "reason": "the user pressed Esc"})
        assert await mcp.result("ping") == {}
        gate.opened.set()
        after = await mcp.text("memory_grep", {"pattern": "PLATYPUS-8"})
        await mcp.close()
    assert "PLATYPUS-8" in after
    assert not [m for m in mcp.received if isinstance(m, dict) and m.get("id") == "slow"]
    assert "cancelling request \"slow\": the user pressed Esc" in log.read_text()


def shadowing(path: Path) -> Path:
    """A workspace whose own top-level ``protocol`` and ``sidecar`` would break ours if imported instead."""
    path.mkdir(exist_ok=True)
    (path / "protocol.py").write_text('raise SystemExit("the workspace\'s protocol.py was imported")\n')
    (path / "sidecar").mkdir()
    (path / "sidecar" / "__init__.py").write_text('raise SystemExit("the workspace\'s sidecar was imported")\n')
    return path


async def test_a_workspace_with_its_own_protocol_and_sidecar_modules_does_not_shadow_ours(
        tmp_path: Path, runtime: Path) -> None:
    db = tmp_path / "m.duckdb"
    await two_workspaces(db, tmp_path)
    async with mcp_server(db, runtime, shadowing(tmp_path / "ws-a")) as mcp:
        await mcp.initialize()
        found = await mcp.text("memory_grep", {"pattern": "PLATYPUS"})
    assert "PLATYPUS" in found
