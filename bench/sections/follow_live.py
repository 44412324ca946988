"""Following an agent's live transcript (memory/watch): a line appended until memory_grep finds it, and host CPU."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

from bench.core import SERVER, SETTINGS, Bench, percentile, progress
from protocol import methods
from sidecar.agents.locations import claude_project_name
from sidecar.client import SidecarClient
from sidecar.testing.transcripts import ClaudeCodeWriter

WAIT = 120.0
SIZES_BYTES = {"small": 20_000, "5mb": 5_000_000}
GAP_SECONDS = 0.75
"""Between an append being found and the next: an agent writes its next line a while later."""


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _found(client: SidecarClient, session_id: str, needle: str, stored: asyncio.Future[object]) -> None:
    """Once the server says it stored the line, call the model's memory_grep until it finds ``needle``."""
    await stored
    while True:
        result = await client.call_tool(session_id, "memory_grep", json.dumps({"pattern": needle}))
        if f"where is {needle} handled" in str(result.get("content")):  # the match's snippet, not the echo
            return
        await asyncio.sleep(0.01)


async def _measure(bench: Bench, label: str, size: int, appends: int) -> None:
    root = bench.workdir / f"follow-{label}"
    home, workspace = root / "home", root / "project"
    workspace.mkdir(parents=True)
    project = home / ".claude" / "projects" / claude_project_name(str(workspace))
    project.mkdir(parents=True)
    writer = ClaudeCodeWriter(project / "live.jsonl", str(workspace), session_id=f"live-{label}")
    writer.grow_to(size)
    file_bytes = writer.path.stat().st_size
    async with await SidecarClient.spawn(SERVER, db=str(root / "m.duckdb"), settings=SETTINGS,
                                         timeout=WAIT) as client:
        assert client.process is not None
        session_id = writer.session_id
        await client.follow(workspace=str(workspace))
        imported = client.wait_for_notification(methods.CONTEXT_DID_CHANGE_USAGE,
                                                lambda usage: usage.session_id == session_id, timeout=WAIT)
        start = time.perf_counter()
        await client.watch(str(workspace), env={"HOME": str(home)})
        await imported
        bench.record(f"follow_{label}_import_s", f"watch start to a {file_bytes / 1e6:.2f} MB transcript imported",
                     time.perf_counter() - start, "s")
        await client.ingest("bystander", [{"id": "b0", "role": "user", "content": "another client's session"}])
        quiet = await _others(client, 40)
        lags: list[float] = []
        cpu = 0.0
        others: list[float] = []
        probing = asyncio.get_running_loop().create_task(_probe(client, others))
        for index in range(appends):
            needle = f"needle{index}x{label}"
            before = cpu_seconds(client.process.pid)
            stored = client.wait_for_notification(methods.CONTEXT_DID_CHANGE_USAGE,
                                                  lambda usage: usage.session_id == session_id, timeout=WAIT)
            start = time.perf_counter()
            writer.user(f"Turn {index}: where is {needle} handled?")
            await asyncio.wait_for(_found(client, session_id, needle, stored), WAIT)
            lags.append(time.perf_counter() - start)
            cpu += cpu_seconds(client.process.pid) - before
            await asyncio.sleep(GAP_SECONDS)
        probing.cancel()
    bench.record(f"follow_{label}_lag_p50_ms", f"line appended → found by memory_grep, p50 ({label})",
                 percentile(lags, 50) * 1000, "ms")
    bench.record(f"follow_{label}_lag_max_ms", f"line appended → found by memory_grep, max ({label})",
                 max(lags) * 1000, "ms")
    bench.record(f"follow_{label}_cpu_ms", f"server CPU per appended line, with its memory_grep ({label})",
                 cpu / appends * 1000, "ms")
    bench.record(f"follow_{label}_others_p50_ms", f"another client's context/usage while following, p50 ({label})",
                 percentile(others, 50) * 1000, "ms")
    bench.record(f"follow_{label}_others_max_ms", f"another client's context/usage while following, max ({label})",
                 max(others) * 1000, "ms")
    bench.info[f"follow_{label}"] = {"bytes": file_bytes, "appends": appends,
                                     "lags_ms": [round(lag * 1000) for lag in lags],
                                     "others_quiet_p50_ms": round(percentile(quiet, 50) * 1000, 2),
                                     "others_quiet_max_ms": round(max(quiet) * 1000, 2)}


async def _others(client: SidecarClient, count: int) -> list[float]:
    """Latencies of another session's context/usage, one after the other."""
    found = []
    for _ in range(count):
        start = time.perf_counter()
        await client.usage("bystander")
        found.append(time.perf_counter() - start)
        await asyncio.sleep(0.02)
    return found


async def _probe(client: SidecarClient, found: list[float]) -> None:
    """Another client's requests while the transcript is followed: their latencies, until cancelled."""
    while True:
        found.extend(await _others(client, 1))


async def follow_live(bench: Bench) -> None:
    """Live transcripts (memory/watch): append → memory_grep lag on a small and a 5 MB one, CPU per line."""
    appends = 45 if bench.sizes.spawns > 1 else 5  # over 30 s: a whole read is among them
    for label, size in SIZES_BYTES.items():
        if label == "5mb" and bench.sizes.spawns <= 1:
            size = 1_000_000  # --tiny: a smaller large one
        progress(f"follow_live: a {size / 1e6:g} MB Claude Code transcript")
        await _measure(bench, label, size, appends)
