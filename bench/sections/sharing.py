"""Sharing a database: relay overhead against a process of its own, eight clients at once, a host's kill -9."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.core import SETTINGS, Bench, percentile, progress, timed
from sidecar.client import SidecarClient, SidecarRequestError
from sidecar.rpc import handshake

SHARED = [sys.executable, "-m", "sidecar"]
ALONE = [*SHARED, "--no-share"]


def host_pid(runtime: Path) -> int:
    """The pid of the one host under ``runtime``, from its handshake."""
    (path,) = runtime.glob("context-sidecar/*.sock")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(path))
        sock.sendall(handshake.hello("relay"))
        return int(json.loads(sock.makefile("rb").readline())["pid"])


async def _latencies(bench: Bench, client: SidecarClient, key: str) -> tuple[list[float], list[float]]:
    stream = bench.stream(f"share-{key}")
    ingest = [await timed(lambda: client.ingest(key, [next(stream)])) for _ in range(bench.sizes.single)]
    await client.assemble(key)  # warm-up
    assemble = [await timed(lambda: client.request("context/assemble", {"sessionId": key}))
                for _ in range(bench.sizes.assemble_runs)]
    return ingest, assemble


async def _throughput(bench: Bench, clients: list[SidecarClient], tag: str, count: int) -> float:
    streams = [bench.stream(f"{tag}-{n}") for n in range(len(clients))]

    async def work(n: int, client: SidecarClient) -> None:
        for _ in range(count):
            await client.ingest(f"{tag}-{n}", [next(streams[n])])

    start = time.perf_counter()
    await asyncio.gather(*(work(n, c) for n, c in enumerate(clients)))
    return len(clients) * count / (time.perf_counter() - start)


async def _recovery(bench: Bench, clients: list[SidecarClient], runtime: Path, count: int) -> tuple[float, int]:
    """Seconds from a host's kill -9 until every client has an ingest acknowledged again, and messages lost."""
    acked: list[list[str]] = [[] for _ in clients]
    killed_at: list[float] = []
    back: dict[int, float] = {}
    pid = host_pid(runtime)

    async def work(n: int, client: SidecarClient) -> None:
        for i in range(count):
            msg_id = f"kill-{n}-{i}"
            while True:
                try:
                    await client.ingest(f"kill-{n}", [{"id": msg_id, "role": "user", "content": f"message {i}"}])
                    break
                except SidecarRequestError as error:
                    if error.code != -32022:
                        raise
            acked[n].append(msg_id)
            if killed_at and n not in back:
                back[n] = time.perf_counter() - killed_at[0]

    async def kill() -> None:
        while min(len(ids) for ids in acked) < count // 4:
            await asyncio.sleep(0.01)
        killed_at.append(time.perf_counter())
        os.kill(pid, signal.SIGKILL)

    await asyncio.gather(kill(), *(work(n, c) for n, c in enumerate(clients)))
    lost = 0
    for n, client in enumerate(clients):
        stored = {item.id for item in (await client.assemble(f"kill-{n}", budget=10_000_000)).items}
        lost += len(set(acked[n]) - stored)
    return max(back.values()), lost


async def sharing(bench: Bench) -> None:
    """Relay against direct, eight clients, host kill -9 recovery (each on databases of its own)."""
    runtime = Path(tempfile.mkdtemp(prefix="cs-bench-"))  # short: socket paths are limited to 108 bytes
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    settings: dict[str, Any] = {**SETTINGS}
    started: list[SidecarClient] = []

    async def spawn(command: list[str], name: str) -> SidecarClient:
        client = await SidecarClient.spawn(command, env=env, timeout=60,
                                           settings={**settings, "storage": {"path": str(bench.workdir / name)}})
        started.append(client)
        return client

    try:
        progress("sharing: start-up through a relay")
        # Each client answers a request before the next one starts: a server still loading in the background
        # (pygls, DuckDB, a host opening its database) would otherwise slow the next start-up measured.
        start = time.perf_counter()
        direct = await spawn(ALONE, "share-direct.duckdb")
        alone_ms = (time.perf_counter() - start) * 1000
        await direct.sessions()
        start = time.perf_counter()
        relayed = await spawn(SHARED, "share-relay.duckdb")
        first_ms = (time.perf_counter() - start) * 1000
        await relayed.sessions()
        start = time.perf_counter()
        await spawn(SHARED, "share-relay.duckdb")
        warm_ms = (time.perf_counter() - start) * 1000
        bench.record("share_init_alone_ms", "start to initialize reply, own process", alone_ms, "ms")
        bench.record("share_init_first_ms", "start to initialize reply, first client (starts the host)",
                     first_ms, "ms")
        bench.record("share_init_warm_ms", "start to initialize reply, a client of a running host", warm_ms, "ms")
        progress("sharing: relay against direct")
        d_ingest, d_assemble = await _latencies(bench, direct, "direct")
        r_ingest, r_assemble = await _latencies(bench, relayed, "relay")
        for what, d, r in (("ingest", d_ingest, r_ingest), ("assemble", d_assemble, r_assemble)):
            bench.record(f"share_{what}_direct_p50_ms", f"{what} p50, own process", percentile(d, 50), "ms")
            bench.record(f"share_{what}_relay_p50_ms", f"{what} p50, through a relay", percentile(r, 50), "ms")
            bench.record(f"share_{what}_relay_ratio", f"{what} p50 relay / direct",
                         percentile(r, 50) / percentile(d, 50), "")
            bench.record(f"share_{what}_relay_extra_ms", f"{what} p50 relay - direct",
                         percentile(r, 50) - percentile(d, 50), "ms")

        progress("sharing: eight clients")
        count = bench.sizes.single
        one = await _throughput(bench, [relayed], "one", count)
        eight = [relayed, *await asyncio.gather(*(spawn(SHARED, "share-relay.duckdb") for _ in range(7)))]
        together = await _throughput(bench, eight, "eight", count)
        bench.record("share_one_msgs_per_s", "one client, single ingests", one, "msg/s")
        bench.record("share_eight_msgs_per_s", "eight clients at once, aggregate", together, "msg/s")
        bench.record("share_eight_ratio", "eight clients aggregate / one client", together / one, "")

        progress("sharing: kill -9 of the host during ingest from four clients")
        seconds, lost = await _recovery(bench, eight[:4], runtime, max(count // 2, 20))
        bench.record("share_recovery_s", "host kill -9: until all four clients are answered again", seconds, "s")
        bench.record("share_lost_messages", "host kill -9: acknowledged messages lost", lost, "")
    finally:
        await asyncio.gather(*(client.close(timeout=30) for client in started), return_exceptions=True)
        shutil.rmtree(runtime, ignore_errors=True)
