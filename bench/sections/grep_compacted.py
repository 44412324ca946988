"""memory/grep before and after a `full` compaction: coveredBy for every compacted match (issue 15)."""

from __future__ import annotations

import copy
import itertools
import sys
import time

from bench.core import SETTINGS, Bench, ingest_all, merge, percentile, progress, timed
from bench.traffic import conversation
from sidecar.client import SidecarClient

NEEDLE = "flaky-socket-7731"
"""Planted in every fifth message, so 5,000 messages hold about 1,000 matches."""
EVERY = 5
RUNS = 10


def planted(count: int, seed: int) -> list[dict]:
    """``count`` generated messages, every EVERY-th with the needle appended to its text."""
    messages = list(itertools.islice(conversation(f"g{seed}", seed=seed), count))
    for index in range(0, count, EVERY):
        message = messages[index]
        if isinstance(message.get("content"), str):
            message["content"] += f" {NEEDLE}"
        else:
            message["content"] = NEEDLE
    return messages


async def grep_compacted(bench: Bench) -> None:
    """grep with ~1 match in 5 messages, limit 1,000, before and after `full` compaction (deterministic)."""
    sizes = [("5k", min(5_000, bench.sizes.grep))] + ([("100k", bench.sizes.grep)] if bench.sizes.grep > 5_000 else [])
    for key, count in sizes:
        settings = copy.deepcopy(SETTINGS)
        merge(settings, {"compaction": {"auto": False, "maxTokens": 20_000}, "llm": {"model": None}})
        command = [sys.executable, "-m", "sidecar"]
        client = await SidecarClient.spawn(command, db=str(bench.workdir / f"grep-{key}.duckdb"), settings=settings)
        try:
            progress(f"grep_compacted: {count:,} messages")
            await ingest_all(client, key, planted(count, len(key)), bench.sizes.batch)
            before = await _times(client, key)
            started = time.perf_counter()
            result = await client.compact(key, mode="full")
            bench.info[f"grep_{key}_compact_s"] = round(time.perf_counter() - started, 1)
            bench.info[f"grep_{key}_compact_rounds"] = result.rounds
            after = await _times(client, key)
            found = await client.grep(key, NEEDLE, scope="messages", limit=1000)
            bench.info[f"grep_{key}_matches"] = len(found.matches)
            bench.info[f"grep_{key}_covered"] = sum(1 for m in found.matches if m.covered_by)
        finally:
            await client.close(timeout=60)
        bench.record(f"grep_{key}_before_ms", f"grep p50, {count:,} messages, 1,000 matches, before compaction",
                     before, "ms")
        bench.record(f"grep_{key}_after_ms", "  after `full` compaction (coveredBy on each match)", after, "ms")
        bench.record(f"grep_{key}_ratio", "  grep after / before compaction", after / before, "x")


async def _times(client: SidecarClient, session_id: str) -> float:
    await client.grep(session_id, NEEDLE, scope="messages", limit=1000)  # warm-up, not counted
    times = [await timed(lambda: client.grep(session_id, NEEDLE, scope="messages", limit=1000))
             for _ in range(RUNS)]
    return percentile(times, 50)
