"""Compaction of the pi session by a summarizer whose window is 8,192 tokens (issue 15)."""

from __future__ import annotations

import copy
import sys
import time

from bench.core import SETTINGS, Bench, ingest_all, merge, progress
from bench.sections.compaction import MAX_TOKENS, SUMMARY
from sidecar.client import SidecarClient
from sidecar.testing import FakeOpenAIServer, Reply
from sidecar.testing.openai_server import prompt_tokens

WINDOW = 8192
CONCURRENCY = 4
MODES = ("incremental", "full", "handoff")


async def summarizer_window(bench: Bench) -> None:
    """Each mode on a fresh DB; the endpoint rejects any prompt over 8,192 tokens, as real servers do."""
    delay = bench.sizes.llm_delay
    for mode in MODES:
        with FakeOpenAIServer(context_window=WINDOW) as fake:
            fake.responder = lambda request: Reply(text=SUMMARY, delay=delay)
            settings = copy.deepcopy(SETTINGS)
            merge(settings, {"compaction": {"auto": False, "maxTokens": MAX_TOKENS},
                             "llm": {"baseUrl": fake.base_url, "model": "fake-model", "contextWindow": WINDOW,
                                     "maxConcurrency": CONCURRENCY}})
            progress(f"summarizer_window: {mode}, window {WINDOW:,}, {delay * 1000:g} ms per call")
            db = str(bench.workdir / f"window-{mode}.duckdb")
            client = await SidecarClient.spawn([sys.executable, "-m", "sidecar"], db=db, settings=settings)
            try:
                await ingest_all(client, "pi", bench.pi_messages(), bench.sizes.batch)
                started = time.perf_counter()
                result = await client.compact("pi", mode=mode)
                seconds = time.perf_counter() - started
            finally:
                await client.close(timeout=30)
            requests = fake.chat_requests
            prompts = [r.body["messages"][-1]["content"] for r in requests]
            largest = max((prompt_tokens(r.body) for r in requests), default=0)
            rejected = len(fake.rejected)
        if not result.compacted:
            raise RuntimeError(f"{mode} compaction of the pi session did not compact: {result.reason}")
        merges = sum(1 for text in prompts if "summary of part " in text)
        updates = sum(1 for text in prompts if "<previous_summary>" in text) if mode == "handoff" else 0
        key = f"window_{mode}"
        bench.record(f"{key}_wall_s", f"{mode} compaction, summarizer window {WINDOW:,}, {delay * 1000:g} ms/call, "
                     f"maxConcurrency {CONCURRENCY}", seconds, "s")
        bench.record(f"{key}_calls", f"  summarizer calls ({mode})", len(requests), "")
        bench.record(f"{key}_rounds", f"  compaction rounds ({mode})", result.rounds, "")
        bench.record(f"{key}_merge_calls", f"  calls merging parts of a split input ({mode})", merges, "")
        if mode == "handoff":
            bench.record(f"{key}_update_rounds", "  handoff rounds updating the previous round's summary", updates,
                         "")
        bench.record(f"{key}_largest_prompt", f"  largest prompt ({mode}; the window is {WINDOW:,})", largest, "tok")
        bench.record(f"{key}_rejected", f"  prompts the endpoint rejected ({mode})", rejected, "")
        bench.info[f"{key}_tokens"] = [result.tokens_before, result.tokens_after]
