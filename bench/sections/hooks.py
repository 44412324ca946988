"""Claude Code's PreCompact hook on a multi-MB transcript: the wall time Claude Code waits before it compacts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.core import Bench, progress
from bench.sections.sharing import host_pid
from sidecar.client import SidecarClient
from sidecar.testing.transcripts import ClaudeCodeWriter

HOOK = [sys.executable, "-m", "sidecar", "hook", "claude-code"]


def _hook(event: dict[str, object], db: Path, log: Path, env: dict[str, str]) -> float:
    """Seconds from starting the hook process to its exit, as Claude Code waits for it; raises if it failed."""
    start = time.perf_counter()
    done = subprocess.run([*HOOK, "--db", str(db), "--log-file", str(log)], input=json.dumps(event).encode(),
                          capture_output=True, env=env, timeout=120, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0 or done.stderr:
        raise RuntimeError(done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}")
    return seconds


async def hooks(bench: Bench) -> None:
    """PreCompact hook wall time on a Claude Code transcript: cold (no host running) and warm; SessionStart warm."""
    size, runs = bench.sizes.hook_transcript_bytes, bench.sizes.hook_runs
    workspace = bench.workdir / "shop"
    workspace.mkdir(exist_ok=True)
    writer = ClaudeCodeWriter(bench.workdir / "hook-transcript.jsonl", str(workspace))
    writer.grow_to(size)
    megabytes = writer.path.stat().st_size / 1e6
    bench.info["hook_transcript_mb"] = round(megabytes, 2)
    event = {"session_id": writer.session_id, "transcript_path": str(writer.path), "cwd": str(workspace),
             "hook_event_name": "PreCompact", "trigger": "auto", "custom_instructions": None}
    cold: list[float] = []
    warm: list[float] = []
    restore: list[float] = []
    label = f"PreCompact hook on a {megabytes:.1f} MB transcript"
    try:
        for run in range(runs):
            progress(f"hooks: {label}, no host running ({run + 1}/{runs})")
            runtime = Path(tempfile.mkdtemp(prefix="cs-hook-"))  # short: socket paths are limited to 108 bytes
            env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
            try:
                cold.append(_hook(event, bench.workdir / f"hook-cold-{run}.duckdb", bench.workdir / "hook.log", env))
            finally:
                _stop_host(runtime)
                shutil.rmtree(runtime, ignore_errors=True)
        runtime = Path(tempfile.mkdtemp(prefix="cs-hook-"))
        env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
        db = bench.workdir / "hook-warm.duckdb"
        try:
            # An agent session's MCP server keeps the host up and has imported the transcript as it grew.
            async with await SidecarClient.spawn(db=str(db), env=env, timeout=60) as client:
                await client.import_transcript(str(writer.path), format="claude-code")
                for run in range(runs):
                    progress(f"hooks: {label}, host running, one new turn ({run + 1}/{runs})")
                    writer.turn(10_000 + run)
                    warm.append(_hook(event, db, bench.workdir / "hook.log", env))
                    start = {**event, "hook_event_name": "SessionStart", "source": "compact"}
                    restore.append(_hook(start, db, bench.workdir / "hook.log", env))
        finally:
            shutil.rmtree(runtime, ignore_errors=True)
    except RuntimeError as error:
        for key, name in (("hook_precompact_cold_s", "no host"), ("hook_precompact_warm_s", "host running"),
                          ("hook_sessionstart_warm_s", "SessionStart")):
            bench.record_missing(key, f"{label}, {name}", "s", f"the hook failed: {error}")
        return
    bench.record("hook_precompact_cold_s", f"{label}, no host running (p50 of {runs})", statistics.median(cold), "s")
    bench.record("hook_precompact_warm_s", f"{label}, host running (p50 of {runs})", statistics.median(warm), "s")
    bench.record("hook_sessionstart_warm_s", f"SessionStart (compact) hook, host running (p50 of {runs})",
                 statistics.median(restore), "s")
    bench.info["hook_precompact_cold_max_s"] = round(max(cold), 3)
    bench.info["hook_precompact_warm_max_s"] = round(max(warm), 3)



def _stop_host(runtime: Path) -> None:
    """Kill the host the cold run started, and wait for it to go, so that the next run starts with none."""
    try:
        pid = host_pid(runtime)
    except (OSError, ValueError):
        return
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
