"""Start-up, ingest, assemble, grep and memory of the main server."""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import sys
import time

from bench.core import BUDGET, GREP_PATTERN, SERVER, SETTINGS, Bench, percentile, proc_status, progress, timed
from protocol import methods
from sidecar.client import SidecarClient
from sidecar.rpc.server import CHECKPOINT_DELAY


async def load(bench: Bench, session_id: str, count: int) -> float:
    """Ingest ``count`` messages in batches; returns messages per second of request time."""
    client, size = bench.live, bench.sizes.batch
    stream = bench.stream(session_id)
    spent = 0.0
    done = 0
    pid = client.process.pid if client.process else 0
    while done < count:
        batch = list(itertools.islice(stream, min(size, count - done)))
        spent += await timed(lambda batch=batch: client.ingest(session_id, batch))  # type: ignore[misc]
        done += len(batch)
        if count >= 100_000 and done % 50_000 < size:
            rss = proc_status(pid)["VmRSS"] if pid else 0
            progress(f"{session_id}: {done:,}/{count:,} messages, {done / spent * 1000:,.0f} msg/s, "
                     f"server RSS {rss:.0f} MiB")
    return count / spent * 1000


async def startup(bench: Bench) -> None:
    """Process start to the initialize reply, and to the first request's reply, median of several spawns.

    initialize is answered while the server still loads (sidecar/rpc/startup.py), so the first request
    after it is timed too: that is when the sidecar can first do work.
    """
    times, ready = [], []
    for n in range(bench.sizes.spawns):
        start = time.perf_counter()
        client = await SidecarClient.spawn(SERVER, db=str(bench.workdir / f"start-{n}.duckdb"), settings=SETTINGS)
        times.append((time.perf_counter() - start) * 1000)
        await client.sessions()
        ready.append((time.perf_counter() - start) * 1000)
        await client.close()
    bench.record("init_ms", "start to initialize reply (median)", statistics.median(times), "ms")
    bench.record("first_reply_ms", "start to the first request's reply, memory/sessions (median)",
                 statistics.median(ready), "ms")


async def serve(bench: Bench) -> None:
    """Start the main server and measure its idle memory."""
    command = SERVER
    if bench.profile:
        command = [sys.executable, "-m", "cProfile", "-o", bench.profile, "-m", "sidecar", "--no-share"]
    bench.client = await SidecarClient.spawn(command, db=bench.db, settings=SETTINGS)
    await asyncio.sleep(bench.sizes.settle)
    bench.record("rss_idle_mb", "server RSS after initialize", proc_status(bench.live.process.pid)["VmRSS"],
                 "MiB")


async def single_ingest(bench: Bench) -> None:
    """One message per memory/ingest, into one session."""
    stream = bench.stream("single")
    client = bench.live
    times = [await timed(lambda: client.ingest("single", [next(stream)])) for _ in range(bench.sizes.single)]
    bench.record("ingest_single_p50_ms", "single-message ingest p50", percentile(times, 50), "ms")
    bench.record("ingest_single_p99_ms", "single-message ingest p99", percentile(times, 99), "ms")


async def batch_ingest(bench: Bench) -> None:
    """Batches of 500 messages into the small session and the grep session."""
    sizes = bench.sizes
    rate_small = await load(bench, "small", sizes.small)
    rate_grep = await load(bench, "grep", sizes.grep)
    total = sizes.small + sizes.grep
    rate = total / (sizes.small / rate_small + sizes.grep / rate_grep)
    label = f"batch ingest ({sizes.batch}/batch, {total:,} msgs)"
    bench.record("ingest_batch_msgs_per_s", label, rate, "msg/s")


async def large_load(bench: Bench) -> None:
    """The large session (the grep session when they are the same size), and memory after it."""
    sizes = bench.sizes
    bench.info["large_session"] = "grep"
    if sizes.large != sizes.grep:
        bench.info["large_session"] = "large"
        progress(f"loading {sizes.large:,} messages")
        rate = await load(bench, "large", sizes.large)
        label = f"batch ingest into the {sizes.large:,} session"
        bench.record("ingest_large_msgs_per_s", label, rate, "msg/s")
    await asyncio.sleep(bench.sizes.settle)
    status = proc_status(bench.live.process.pid)
    bench.record("rss_loaded_mb", f"server RSS after the {sizes.large:,} load", status["VmRSS"], "MiB")
    await asyncio.sleep(CHECKPOINT_DELAY + 5)  # the checkpoint itself takes seconds after a large load
    bench.record("rss_settled_mb", "server RSS once idle (after its checkpoint hands cached pages back)",
                 proc_status(bench.live.process.pid)["VmRSS"], "MiB")


async def assemble(bench: Bench) -> None:
    """context/assemble at budget 128k over the small and the large session, in the same DB.

    Timed as a JSON-RPC round trip with the reply decoded to JSON; the typed client's conversion of
    the ~1,500 messages into attrs objects is timed apart, as a cost of that client, not of the server.
    """
    p50 = {}
    client = bench.live
    for name, session_id, count in (("small", "small", bench.sizes.small),
                                    ("large", bench.info["large_session"], bench.sizes.large)):
        params = {"sessionId": session_id, "budget": BUDGET}
        first = await client.request(methods.CONTEXT_ASSEMBLE, params)  # warm-up, not counted
        bench.info[f"assemble_{name}_messages"] = len(first["messages"])
        bench.info[f"assemble_{name}_reply_bytes"] = len(json.dumps(first))
        times = [await timed(lambda p=params: client.request(methods.CONTEXT_ASSEMBLE, p))  # type: ignore[misc]
                 for _ in range(bench.sizes.assemble_runs)]
        p50[name] = percentile(times, 50)
        bench.record(f"assemble_{name}_p50_ms", f"assemble p50, {count:,} items", p50[name], "ms")
        bench.record(f"assemble_{name}_p99_ms", f"assemble p99, {count:,} items", percentile(times, 99), "ms")
        typed = [await timed(lambda s=session_id: client.assemble(s, budget=BUDGET))  # type: ignore[misc]
                 for _ in range(bench.sizes.assemble_runs)]
        bench.record(f"assemble_{name}_typed_p50_ms", "  the same through SidecarClient.assemble (typed)",
                     percentile(typed, 50), "ms")
    bench.record("assemble_ratio", "assemble p50 large / small", p50["large"] / p50["small"], "x")


async def grep(bench: Bench) -> None:
    """memory/grep, literal and case-insensitive, over the grep session."""
    client = bench.live
    first = await client.grep("grep", GREP_PATTERN)  # warm-up, not counted
    bench.info["grep_matches"] = len(first.matches)
    times = [await timed(lambda: client.grep("grep", GREP_PATTERN)) for _ in range(bench.sizes.grep_runs)]
    bench.record("grep_p50_ms", f"grep p50, {bench.sizes.grep:,} messages", percentile(times, 50), "ms")


async def memory(bench: Bench) -> None:
    """The server's peak memory over the whole run."""
    peak = proc_status(bench.live.process.pid)["VmHWM"]
    bench.record("rss_peak_mb", "server peak RSS (VmHWM)", peak, "MiB")
