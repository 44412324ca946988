"""The MCP server: process start to initialize and tools/list answered (on the machine as it is, and with two busy
processes of the bench's own), and to the first tools/call answered (cold and warm host)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.core import GREP_PATTERN, SETTINGS, Bench, ingest_all, percentile, progress
from sidecar.client import SidecarClient
from sidecar.rpc import handshake

MCP = [str(Path(sys.executable).parent / "context-sidecar"), "mcp"]
"""As ``setup`` writes it into the agents' configs: the installed script beside this interpreter."""
BUSY = 2
"""Processes spinning a core each while the loaded figures are taken (the machine has 2 cores)."""
INITIALIZE = {"protocolVersion": "2025-11-25", "capabilities": {},
              "clientInfo": {"name": "bench", "version": "1"}}


class _Mcp:
    """``context-sidecar mcp`` spawned the way an agent spawns it, driven line by line."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def spawn(cls, db: str, env: dict[str, str]) -> _Mcp:
        process = await asyncio.create_subprocess_exec(
            *MCP, "--db", db, env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, limit=1 << 24)
        return cls(process)

    async def request(self, msg_id: int, method: str, params: Any = None) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            message["params"] = params
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        while True:
            reply = json.loads(await asyncio.wait_for(self.process.stdout.readline(), 120))
            if reply.get("id") == msg_id:
                return reply  # type: ignore[no-any-return]

    async def handshake(self, start: float | None = None) -> tuple[float, float]:
        """initialize, then initialized and tools/list, as Claude Code sends them: milliseconds from ``start`` to
        each reply."""
        start = time.perf_counter() if start is None else start
        await self.request(0, "initialize", INITIALIZE)
        initialized = (time.perf_counter() - start) * 1000
        assert self.process.stdin is not None
        self.process.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        reply = await self.request(1, "tools/list")
        if len(reply.get("result", {}).get("tools", [])) != 4:
            raise RuntimeError(f"tools/list did not list the four memory tools: {reply}")
        return initialized, (time.perf_counter() - start) * 1000

    async def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), 30)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()


async def _start_to_tools_list(db: str, env: dict[str, str]) -> tuple[float, float]:
    """Milliseconds from the spawn to the initialize reply, and to the tools/list reply."""
    start = time.perf_counter()
    mcp = await _Mcp.spawn(db, env)
    elapsed = await mcp.handshake(start)
    await mcp.close()
    return elapsed


async def _handshakes(bench: Bench, key: str, label: str, spawns: int, db: str, env: dict[str, str]) -> None:
    """``spawns`` starts to tools/list, one after the other; their p50 and max, and initialize's p50."""
    times = [await _start_to_tools_list(db, env) for _ in range(spawns)]
    initialized, listed = [t[0] for t in times], [t[1] for t in times]
    bench.record(f"mcp_initialize{key}_p50_ms", f"mcp: start to initialize answered{label}, p50",
                 percentile(initialized, 50), "ms")
    bench.record(f"mcp_tools_list{key}_p50_ms", f"mcp: start to tools/list answered{label}, p50",
                 percentile(listed, 50), "ms")
    bench.record(f"mcp_tools_list{key}_max_ms", f"mcp: start to tools/list answered{label}, max", max(listed), "ms")


@contextlib.contextmanager
def _busy(processes: int) -> Iterator[None]:
    """That many processes spinning a core each: a loaded machine the bench makes itself."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


async def _start_to_first_call(db: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    mcp = await _Mcp.spawn(db, env)
    await mcp.handshake()
    reply = await mcp.request(2, "tools/call", {"name": "memory_grep", "arguments": {"pattern": GREP_PATTERN}})
    elapsed = (time.perf_counter() - start) * 1000
    await mcp.close()
    text = reply["result"]["content"][0]["text"]
    if reply["result"]["isError"] or "matches" not in text:
        raise RuntimeError(f"the bench's tools/call did not find its pattern: {text[:300]}")
    return elapsed


def _stop_hosts(runtime: Path) -> None:
    """Kill every host under ``runtime`` and wait until each has gone (it holds the database's lock)."""
    for path in runtime.glob("context-sidecar/*.sock"):
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(10)
                sock.connect(str(path))
                sock.sendall(handshake.hello("relay"))
                pid = int(json.loads(sock.makefile("rb").readline())["pid"])
        except (OSError, ValueError, KeyError):
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        path.unlink(missing_ok=True)


async def mcp(bench: Bench) -> None:
    """MCP server start to tools/list answered, and to the first tools/call answered, cold and warm host."""
    spawns = max(10, bench.sizes.spawns) if bench.sizes.spawns > 1 else 3
    runtime = Path(tempfile.mkdtemp(prefix="cs-mcp-"))  # short: socket paths are limited to 108 bytes
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    env.pop("CLAUDE_CODE_SESSION_ID", None)
    db = str(bench.workdir / "mcp.duckdb")
    try:
        progress("mcp: a workspace of three sessions (the working directory's)")
        async with await SidecarClient.spawn(env=env, settings={**SETTINGS, "storage": {"path": db}},
                                             timeout=120) as writer:
            for n in range(3):
                messages = [next(bench.stream(f"mcp-{n}")) for _ in range(bench.sizes.small // 5)]
                await ingest_all(writer, f"mcp-{n}", messages)
        _stop_hosts(runtime)

        progress(f"mcp: start to tools/list, {spawns} spawns")
        bench.info["mcp_loadavg"] = round(os.getloadavg()[0], 2)
        await _handshakes(bench, "", "", spawns, db, env)
        progress(f"mcp: start to tools/list with {BUSY} busy processes, {spawns} spawns")
        with _busy(BUSY):
            await asyncio.sleep(1)  # the spinners are running, not starting
            await _handshakes(bench, "_loaded", f" with {BUSY} busy processes", spawns, db, env)
            bench.info["mcp_loadavg_loaded"] = round(os.getloadavg()[0], 2)

        progress(f"mcp: start to the first tools/call, cold host, {spawns // 2} spawns")
        cold = []
        for _ in range(max(1, spawns // 2)):
            _stop_hosts(runtime)
            cold.append(await _start_to_first_call(db, env))
        _stop_hosts(runtime)
        bench.record("mcp_first_call_cold_p50_ms", "mcp: start to first tools/call, cold host, p50",
                     percentile(cold, 50), "ms")
        bench.record("mcp_first_call_cold_max_ms", "mcp: start to first tools/call, cold host, max", max(cold), "ms")

        progress(f"mcp: start to the first tools/call, warm host, {spawns} spawns")
        async with await SidecarClient.spawn(env=env, settings={**SETTINGS, "storage": {"path": db}},
                                             timeout=120):  # keeps the host up between spawns
            warm = [await _start_to_first_call(db, env) for _ in range(spawns)]
        bench.record("mcp_first_call_warm_p50_ms", "mcp: start to first tools/call, warm host, p50",
                     percentile(warm, 50), "ms")
        bench.record("mcp_first_call_warm_max_ms", "mcp: start to first tools/call, warm host, max", max(warm), "ms")
        bench.info["mcp_spawns"] = spawns
    finally:
        _stop_hosts(runtime)
        shutil.rmtree(runtime, ignore_errors=True)
