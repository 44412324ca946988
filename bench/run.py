"""Benchmark context-sidecar end to end: a real server on a fresh DuckDB file, driven by sidecar.client.

    python bench/run.py [--quick | --tiny] [--json PATH] [--profile PATH] [--settings JSON]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sidecar.client import SidecarClient

Message = dict[str, Any]
BUDGET = 128_000
NEEDLE = "ECONNRESET"
GREP_PATTERN = "econnreset"  # lower case on purpose: the default search ignores case
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


SIZES = {
    "full": Sizes(spawns=5, single=300, small=10_000, grep=100_000, large=1_000_000),
    "quick": Sizes(spawns=5, single=300, small=10_000, grep=100_000, large=100_000),
    "tiny": Sizes(spawns=5, single=30, small=1_000, grep=3_000, large=3_000, assemble_runs=10, grep_runs=5),
}

TARGETS: dict[str, tuple[str, float]] = {
    "init_ms": ("<=", 350),
    "ingest_single_p50_ms": ("<=", 3),
    "ingest_batch_msgs_per_s": (">=", 10_000),
    "assemble_small_p50_ms": ("<=", 10),
    "assemble_large_p50_ms": ("<=", 10),
    "assemble_ratio": ("<=", 1.5),
    "grep_p50_ms": ("<=", 150),
    "rss_idle_mb": ("<=", 150),
    "rss_loaded_mb": ("<=", 150),
    "rss_peak_mb": ("<=", 150),
}


@dataclass
class Figure:
    """One measured number, with its target when it has one."""

    key: str
    label: str
    value: float
    unit: str

    @property
    def verdict(self) -> str:
        """PASS, MISS (with the factor it is off by), or blank."""
        if self.key not in TARGETS:
            return ""
        op, limit = TARGETS[self.key]
        ok = self.value <= limit if op == "<=" else self.value >= limit
        if ok:
            return "PASS"
        factor = self.value / limit if op == "<=" else limit / max(self.value, 1e-9)
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

    def stream(self, session_id: str) -> Iterator[Message]:
        """The session's message generator, continued across calls."""
        if session_id not in self.streams:
            self.streams[session_id] = conversation(session_id, seed=len(self.streams) + 1)
        return self.streams[session_id]


# Generated coding-agent sessions: about 1 KB per message, tool calls with their results.

WORDS = [
    "the", "a", "to", "of", "and", "in", "is", "it", "for", "that", "this", "with", "test", "fix", "error",
    "file", "function", "value", "return", "request", "handler", "token", "session", "cache", "retry",
    "config", "parse", "module", "import", "update", "check", "path", "user", "query", "result", "timeout",
    "async", "await", "list", "dict", "missing", "failing", "expected", "actual", "line", "call", "raise",
    "index", "build"
]
IDENTS = [
    "user_id", "session", "token", "retries", "payload", "cursor", "rows", "config", "cache_key",
    "deadline", "response", "parser", "handler", "backoff", "limit", "offset", "items", "result", "buffer",
    "stream"
]
FILES = ["src/app.py", "src/db/models.py", "src/api/routes.py", "tests/test_api.py", "src/utils/retry.py",
         "src/cli.py", "src/auth/tokens.py", "src/db/migrations/0007_rename.py", "docs/setup.md"]
TOOLS = ["read", "grep", "edit", "bash"]


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(6, 14))).capitalize() + "."


def _code_line(rng: random.Random) -> str:
    a, b = rng.sample(IDENTS, 2)
    return rng.choice([
        f"def {a}_{b}(self, {a}: int = {rng.randint(0, 999)}) -> dict[str, Any]:",
        f"    {a} = self.{b}.get({a!r}, {rng.randint(0, 99)})  # {_sentence(rng)}",
        f"    if {a} is None or {b} > {rng.randint(1, 64)}:",
        f"        raise ValueError(f\"{_sentence(rng)} {{{a}}}\")",
    ])


_POOL = random.Random(0)
SENTENCES = [_sentence(_POOL) for _ in range(4000)]
CODE_LINES = [_code_line(_POOL) for _ in range(4000)]


def prose(rng: random.Random, words: int) -> str:
    """Plausible agent prose of about ``words`` words."""
    # Pooled sentences: generating a million messages must take seconds, not minutes.
    return " ".join(rng.choices(SENTENCES, k=max(1, words // 10)))


def code(rng: random.Random, lines: int) -> str:
    """Plausible Python source, as a read tool returns it."""
    start = rng.randint(1, 400)
    return "\n".join(f"{start + n:4d}  {line}" for n, line in enumerate(rng.choices(CODE_LINES, k=lines)))


def conversation(prefix: str, seed: int) -> Iterator[Message]:
    """An endless coding-agent session with client ids ``<prefix>-N``."""
    rng = random.Random(seed)
    counter = itertools.count(1)
    tool_outputs = 0
    system = "You are a careful coding agent. " + prose(rng, 60)
    yield {"id": f"{prefix}-0", "role": "system", "content": system}
    while True:
        yield {"id": f"{prefix}-{next(counter)}", "role": "user", "content": prose(rng, rng.randint(30, 70))}
        for _ in range(rng.randint(1, 3)):
            calls = []
            for _ in range(rng.randint(1, 2)):
                tool, path = rng.choice(TOOLS), rng.choice(FILES)
                arguments = {"path": path, **({"pattern": rng.choice(IDENTS)} if tool == "grep" else {})}
                calls.append({"id": f"call_{prefix}_{next(counter)}", "type": "function",
                              "function": {"name": tool, "arguments": json.dumps(arguments)}})
            yield {"id": f"{prefix}-{next(counter)}", "role": "assistant",
                   "content": prose(rng, rng.randint(15, 40)), "tool_calls": calls}
            for call in calls:
                tool_outputs += 1
                text = code(rng, rng.randint(12, 24))
                if tool_outputs % 997 == 0:
                    text += f"\nrequests.exceptions.ConnectionError: [Errno 104] {NEEDLE}"
                yield {"id": f"{prefix}-{next(counter)}", "role": "tool", "tool_call_id": call["id"],
                       "content": text}
        yield {"id": f"{prefix}-{next(counter)}", "role": "assistant",
               "content": prose(rng, rng.randint(80, 200))}


# Measuring


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


# Sections: each takes the Bench and records figures. Add new ones (compaction, pruning) to SECTIONS.


async def startup(bench: Bench) -> None:
    """Process start to the initialize reply, median of several spawns."""
    times = []
    for n in range(bench.sizes.spawns):
        start = time.perf_counter()
        client = await SidecarClient.spawn(db=str(bench.workdir / f"start-{n}.duckdb"), settings=SETTINGS)
        times.append((time.perf_counter() - start) * 1000)
        await client.close()
    bench.record("init_ms", "start to initialize reply (median)", statistics.median(times), "ms")


async def serve(bench: Bench) -> None:
    """Start the main server and measure its idle memory."""
    command = None
    if bench.profile:
        command = [sys.executable, "-m", "cProfile", "-o", bench.profile, "-m", "sidecar"]
    bench.client = await SidecarClient.spawn(command, db=bench.db, settings=SETTINGS)
    await asyncio.sleep(0.5)
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
    await asyncio.sleep(0.5)
    status = proc_status(bench.live.process.pid)
    bench.record("rss_loaded_mb", f"server RSS after the {sizes.large:,} load", status["VmRSS"], "MiB")


async def assemble(bench: Bench) -> None:
    """context/assemble at budget 128k over the small and the large session, in the same DB."""
    p50 = {}
    client = bench.live
    for name, session_id, count in (("small", "small", bench.sizes.small),
                                    ("large", bench.info["large_session"], bench.sizes.large)):
        first = await client.assemble(session_id, budget=BUDGET)  # warm-up, not counted
        bench.info[f"assemble_{name}_messages"] = len(first.messages)
        times = [await timed(lambda s=session_id: client.assemble(s, budget=BUDGET))  # type: ignore[misc]
                 for _ in range(bench.sizes.assemble_runs)]
        p50[name] = percentile(times, 50)
        bench.record(f"assemble_{name}_p50_ms", f"assemble p50, {count:,} items", p50[name], "ms")
        bench.record(f"assemble_{name}_p99_ms", f"assemble p99, {count:,} items", percentile(times, 99), "ms")
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


SECTIONS: list[Callable[[Bench], Awaitable[None]]] = [
    startup, serve, single_ingest, batch_ingest, large_load, assemble, grep, memory,
]


def table(bench: Bench) -> str:
    """The figures as a text table."""
    rows = [("figure", "value", "target", "")]
    for figure in bench.figures.values():
        op, limit = TARGETS.get(figure.key, ("", None))
        target = f"{'≤' if op == '<=' else '≥'} {limit:,g} {figure.unit}" if limit is not None else ""
        rows.append((figure.label, f"{figure.value:,.2f} {figure.unit}", target, figure.verdict))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


def report(bench: Bench, mode: str, seconds: float) -> dict[str, Any]:
    """Everything measured, as one JSON object."""
    sample = list(itertools.islice(conversation("x", seed=99), 2000))
    return {
        "mode": mode,
        "sizes": asdict(bench.sizes),
        "avgMessageBytes": round(sum(len(json.dumps(m)) for m in sample) / len(sample)),
        "seconds": round(seconds, 1),
        "settings": SETTINGS,
        "figures": {key: figure.value for key, figure in bench.figures.items()},
        "targets": {key: {"op": op, "limit": limit, "pass": bench.figures[key].verdict == "PASS"}
                    for key, (op, limit) in TARGETS.items() if key in bench.figures},
        "info": bench.info,
    }


async def run(mode: str, json_path: str | None, profile: str | None) -> int:
    """Run every section and print the table and the JSON."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-") as workdir:
        bench = Bench(SIZES[mode], Path(workdir), profile)
        try:
            for section in SECTIONS:
                progress(f"{section.__name__}: {section.__doc__}")
                await section(bench)
        finally:
            if bench.client is not None:
                await bench.client.close(timeout=60)
    result = report(bench, mode, time.perf_counter() - started)
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2) + "\n")
    print(table(bench))
    print(json.dumps(result, indent=2))
    return 0


def merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    """Merge nested settings into ``into``."""
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value


def main() -> int:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_const", dest="mode", const="quick",
                      help="100k items instead of 1M for the large session (well under a minute)")
    size.add_argument("--tiny", action="store_const", dest="mode", const="tiny",
                      help="a few seconds; for the smoke test")
    parser.add_argument("--json", metavar="PATH", help="also write the JSON object here")
    parser.add_argument("--profile", metavar="PATH", help="run the main server under cProfile, stats to PATH")
    parser.add_argument("--settings", metavar="JSON", type=json.loads, default={},
                        help='extra server settings, e.g. \'{"storage": {"memoryLimit": "128MB"}}\'')
    args = parser.parse_args()
    merge(SETTINGS, args.settings)
    if args.profile:
        args.profile = os.path.abspath(args.profile)
    return asyncio.run(run(args.mode or "full", args.json, args.profile))


if __name__ == "__main__":
    raise SystemExit(main())
