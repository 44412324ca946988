"""Shared pieces of the benchmark: sizes, targets, figures, the run's state, and measuring helpers."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.traffic import Message, conversation
from sidecar.client import SidecarClient

BUDGET = 128_000
GREP_PATTERN = "econnreset"  # lower case on purpose: the default search ignores case
PI_SESSION = Path(os.environ.get("CONTEXT_SIDECAR_TEST_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data"
                  ) / "pi-large-session.jsonl"
"""A real pi coding-agent session (918 messages, about 87k tokens), for pruning and compaction."""
SERVER = [sys.executable, "-m", "sidecar", "--no-share"]
"""The server every section but sharing runs: a process of its own, whose memory and log are its own."""
SETTINGS: dict[str, Any] = {"compaction": {"auto": False, "maxTokens": -1}}
"""Auto-compaction off, so every figure measures storage and assembly alone; --settings adds to it."""


@dataclass(frozen=True)
class Sizes:
    """How much work each section does."""

    spawns: int
    single: int
    small: int
    grep: int
    large: int
    batch: int = 500
    assemble_runs: int = 50
    grep_runs: int = 20
    prune_runs: int = 100
    llm_delay: float = 0.5
    """Seconds the fake LLM endpoint waits before each compaction reply."""
    pi_messages: int = 0
    """How many messages of the pi session to use; 0 for all of them."""
    settle: float = 0.5
    """Seconds to wait before reading the server's memory."""
    cache_messages: int = 1500
    """Messages of the generated session the prompt-cache section replays."""
    cache_output_bytes: int = 8000
    """Bytes of each read or grep tool output in that session (about 2,000 tokens)."""
    hook_transcript_bytes: int = 5_000_000
    """Size of the Claude Code transcript the hooks section's PreCompact hook imports."""
    hook_runs: int = 3
    """Hook runs per figure (each cold one on a fresh database, with no host running)."""


SIZES = {
    "full": Sizes(spawns=5, single=300, small=10_000, grep=100_000, large=1_000_000),
    "quick": Sizes(spawns=5, single=300, small=10_000, grep=100_000, large=100_000),
    "tiny": Sizes(spawns=1, single=30, small=1_000, grep=3_000, large=3_000, assemble_runs=10, grep_runs=5,
                  prune_runs=5, llm_delay=0.02, pi_messages=200, settle=0.1, cache_messages=120,
                  hook_transcript_bytes=200_000, hook_runs=1),
}

TARGETS: dict[str, tuple[str, float]] = {
    "init_ms": ("<=", 350),
    "share_init_first_ms": ("<=", 350),
    "hook_precompact_cold_s": ("<=", 2),
    "hook_precompact_warm_s": ("<=", 2),
    "ingest_single_p50_ms": ("<=", 3),
    "ingest_batch_msgs_per_s": (">=", 10_000),
    "assemble_small_p50_ms": ("<=", 10),
    "assemble_large_p50_ms": ("<=", 10),
    "assemble_ratio": ("<=", 1.5),
    "assemble_delta_small_p50_ms": ("<=", 2),
    "assemble_delta_large_p50_ms": ("<=", 2),
    "assemble_delta_ratio": ("<=", 1.5),
    "grep_p50_ms": ("<=", 150),
    "prune_pi_ratio": ("<=", 1.2),
    "prune_generated_ratio": ("<=", 1.2),
    "rss_idle_mb": ("<=", 150),
    "rss_loaded_mb": ("<=", 150),
    "rss_peak_mb": ("<=", 150),
    "compact_concurrency_ratio": ("<=", 0.4),
    "compact_llm1_db_ms": ("<=", 20),
    "compact_llm4_db_ms": ("<=", 20),
    "compact_det_db_ms": ("<=", 20),
    "cache_pi_hit_rate": (">=", 0.90),
    "cache_pi_cost_ratio": ("<=", 1.0),
    "cache_generated_cost_ratio": ("<=", 1.0),
    **{f"retention_{variant}_{what}": (">=", 1.0) for variant in ("det", "llm") for what in ("rules", "notes")},
    "grep_5k_ratio": ("<=", 2),
    "grep_100k_ratio": ("<=", 2),
    "window_incremental_rejected": ("<=", 0),
    "window_full_rejected": ("<=", 0),
    "window_handoff_rejected": ("<=", 0),
    "share_eight_ratio": (">=", 0.8),
    "share_lost_messages": ("<=", 0),
    "share_recovery_s": ("<=", 2),
    "follow_small_lag_p50_ms": ("<=", 1000),
    "follow_small_lag_max_ms": ("<=", 1000),
    "follow_5mb_lag_p50_ms": ("<=", 1000),
    "follow_5mb_lag_max_ms": ("<=", 1000),
    "proxy_request_overhead_p50_ms": ("<=", 5),
    "proxy_ttfb_overhead_p50_ms": ("<=", 5),
    "proxy_pi_cost_ratio": ("<=", 1.0),
    "mcp_tools_list_p50_ms": ("<=", 300),
}


@dataclass
class Figure:
    """One measured number, with its target when it has one."""

    key: str
    label: str
    value: float | None
    """None when the figure could not be measured; ``note`` says why."""
    unit: str
    note: str = ""

    @property
    def verdict(self) -> str:
        """PASS, MISS (with the factor it is off by), or blank."""
        if self.key not in TARGETS or self.value is None:
            return ""
        op, limit = TARGETS[self.key]
        ok = self.value <= limit if op == "<=" else self.value >= limit
        if ok:
            return "PASS"
        if op == ">=" and self.value <= 0:
            return "MISS"  # no factor: it would be infinite
        factor = self.value / limit if op == "<=" else limit / self.value
        return f"MISS ({factor:.1f}x)"


@dataclass
class Bench:
    """Shared state of one run: sizes, the temp DB, the main client, and the figures so far."""

    sizes: Sizes
    workdir: Path
    profile: str | None = None
    client: SidecarClient | None = None
    figures: dict[str, Figure] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    streams: dict[str, Iterator[Message]] = field(default_factory=dict)
    pi: list[Message] | None = None

    @property
    def db(self) -> str:
        """The benchmark's DuckDB file."""
        return str(self.workdir / "bench.duckdb")

    @property
    def live(self) -> SidecarClient:
        """The main client."""
        assert self.client is not None, "the serve section starts the main server"
        return self.client

    def record(self, key: str, label: str, value: float, unit: str) -> None:
        """Keep a figure."""
        self.figures[key] = Figure(key, label, round(value, 3), unit)

    def record_missing(self, key: str, label: str, unit: str, why: str) -> None:
        """Keep a figure that could not be measured, and why (printed as n/a)."""
        self.figures[key] = Figure(key, label, None, unit, why)

    def stream(self, session_id: str) -> Iterator[Message]:
        """The session's message generator, continued across calls."""
        if session_id not in self.streams:
            self.streams[session_id] = conversation(session_id, seed=len(self.streams) + 1)
        return self.streams[session_id]

    def pi_messages(self) -> list[Message]:
        """The real pi session as OpenAI messages, parsed once."""
        if self.pi is None:
            from sidecar.importers import parse_transcript

            messages = parse_transcript(PI_SESSION, "pi").messages
            self.pi = messages[:self.sizes.pi_messages] if self.sizes.pi_messages else messages
            self.info["pi_messages"] = len(self.pi)
        return self.pi


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def proc_status(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of a process, in MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(rest.split()[0]) / 1024
    return out


def progress(text: str) -> None:
    """A progress line on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


async def timed(call: Callable[[], Awaitable[Any]]) -> float:
    """Milliseconds one awaited call takes."""
    start = time.perf_counter()
    await call()
    return (time.perf_counter() - start) * 1000


async def ingest_all(client: SidecarClient, session_id: str, messages: list[Message], batch: int = 500) -> None:
    """Ingest a whole list of messages in batches."""
    for start in range(0, len(messages), batch):
        await client.ingest(session_id, messages[start:start + batch])


def merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    """Merge nested settings into ``into``."""
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value
