"""Full compaction of the real pi session against a slow fake LLM, at maxConcurrency 1 and 4 (issue 3)."""

from __future__ import annotations

import asyncio
import copy
import re
import sys
import time
from pathlib import Path
from typing import Any

from bench.core import SETTINGS, Bench, ingest_all, merge, progress
from protocol.types import CompactResult
from sidecar.client import SidecarClient
from sidecar.testing import FakeOpenAIServer, Reply

MAX_TOKENS = 20_000
"""compaction.maxTokens: low enough that `full` has work on the 87k-token pi session (and on --tiny's 200 messages)."""
SUMMARY = (
    "## Progress\nThe user asked the agent to make the session importer tolerate truncated JSONL lines. The "
    "agent read src/importers/pi.py and tests/test_importers.py, found that a partial last line raised "
    "JSONDecodeError and aborted the whole import, and changed iter_json_lines to record the line number in "
    "a skipped list instead. It ran pytest -q: 41 passed, 1 failed in test_tool_pairing because a tool result "
    "without its call now kept an empty id.\n## Decisions\nKeep unknown entry types as skipped lines, not "
    "errors; pair tool results by call id, falling back to position.\n## Next\nFix the pairing fallback, "
    "rerun the tests, then update the README's import section."
)
"""A plausible summary of about 150 tokens, what the fake LLM answers to every call."""
LOG_LINE = re.compile(r"compaction of (?P<session>\S+) \((?P<mode>\w+), (?P<trigger>\w+)\): done, "
                      r"(?P<before>\d+) -> (?P<after>\d+) tokens, (?P<calls>\d+) calls, "
                      r"(?P<db_ms>[\d.]+) ms in the database")
VARIANTS = (("llm1", 1), ("llm4", 4), ("det", None))
"""Figure key, llm.maxConcurrency (None: the deterministic summarizer, no LLM)."""


def log_line(path: Path, session_id: str) -> dict[str, str]:
    """The fields of the last "compaction of <session> …: done" INFO line in a server log."""
    found = [m.groupdict() for m in map(LOG_LINE.search, path.read_text().splitlines())
             if m and m["session"] == session_id]
    if not found:
        raise RuntimeError(f"no completed compaction of {session_id} in {path}")
    return found[-1]


async def compact_once(bench: Bench, key: str, llm: dict[str, Any], previous: asyncio.Task[Any] | None,
                       ) -> tuple[float, CompactResult, dict[str, str], asyncio.Task[Any]]:
    """A fresh server and DB: ingest the pi session, time one `full` compaction.

    Returns (seconds, result, log fields, the task closing the server). ``previous`` (the last variant's
    closing task) overlaps with start-up and ingest, and is awaited before the timed compaction.
    """
    settings = copy.deepcopy(SETTINGS)
    merge(settings, {"compaction": {"auto": False, "maxTokens": MAX_TOKENS}, "llm": llm})
    log = bench.workdir / f"compact-{key}.log"
    command = [sys.executable, "-m", "sidecar", "--no-share", "-v", "--log-file", str(log)]
    client = await SidecarClient.spawn(command, db=str(bench.workdir / f"compact-{key}.duckdb"), settings=settings)
    try:
        started = time.perf_counter()
        await ingest_all(client, "pi", bench.pi_messages(), bench.sizes.batch)
        bench.info[f"compact_{key}_ingest_ms"] = round((time.perf_counter() - started) * 1000, 1)
        if previous is not None:
            await previous  # nothing else of the benchmark runs while the compaction is timed
        started = time.perf_counter()
        result = await client.compact("pi", mode="full")
        seconds = time.perf_counter() - started
    except BaseException:
        await client.close(timeout=30)
        raise
    closing = asyncio.create_task(client.close(timeout=30))
    if not result.compacted:
        await closing
        raise RuntimeError(f"full compaction of the pi session did not compact: {result.reason}")
    return seconds, result, log_line(log, "pi"), closing


async def compaction(bench: Bench) -> None:
    """`full` compaction of the pi session: LLM at maxConcurrency 1 and 4 (fresh DB each), then deterministic."""
    delay = bench.sizes.llm_delay
    walls: dict[str, float] = {}
    closing: asyncio.Task[Any] | None = None
    for key, concurrency in VARIANTS:
        with FakeOpenAIServer() as fake:  # one per variant, so max_in_flight and requests are its own
            fake.responder = lambda request: Reply(text=SUMMARY, delay=delay)
            if concurrency is None:
                llm: dict[str, Any] = {"model": None, "baseUrl": None}
                what = "deterministic summarizer"
            else:
                llm = {"baseUrl": fake.base_url, "model": "fake-model", "maxConcurrency": concurrency}
                what = f"LLM {delay * 1000:g} ms/call, maxConcurrency {concurrency}"
            progress(f"compaction: {what}")
            seconds, result, line, closing = await compact_once(bench, key, llm, closing)
            if concurrency is not None:
                bench.info[f"compact_{key}_http_requests"] = len(fake.chat_requests)
                bench.info[f"compact_{key}_max_in_flight"] = fake.max_in_flight
        walls[key] = seconds
        calls = int(line["calls"])
        if "compact_tokens_before" not in bench.figures:
            bench.record("compact_tokens_before", "pi session tokens before compaction", result.tokens_before, "tok")
        bench.record(f"compact_{key}_wall_s", f"full compaction wall, {what}", seconds, "s")
        bench.record(f"compact_{key}_calls", f"  summarizer calls ({key})", calls, "")
        bench.record(f"compact_{key}_rounds", f"  rounds ({key})", result.rounds, "")
        bench.record(f"compact_{key}_tokens_after", f"  tokens after ({key})", result.tokens_after, "tok")
        bench.record(f"compact_{key}_db_ms", f"  time in the database ({key}, from the log)",
                     float(line["db_ms"]), "ms")
        bench.info[f"compact_{key}_tokens_before"] = result.tokens_before
        if concurrency == 1:
            # What one call costs beyond the fake endpoint's delay: client, HTTP, streaming, prompt building.
            bench.info["compact_llm1_ms_per_call_beyond_delay"] = round((seconds / max(calls, 1) - delay) * 1000, 1)
    if closing is not None:
        await closing
    bench.record("compact_concurrency_ratio", "compaction wall maxConcurrency 4 / 1", walls["llm4"] / walls["llm1"],
                 "x")
