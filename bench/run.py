"""Benchmark context-sidecar end to end: a real server on a fresh DuckDB file, driven by sidecar.client.

    python bench/run.py [--quick | --tiny] [--json PATH] [--profile PATH] [--settings JSON]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the bench package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.core import SETTINGS, SIZES, TARGETS, Bench, merge, progress
from bench.sections.agent_summaries import agent_summaries
from bench.sections.compaction import compaction
from bench.sections.delta import delta
from bench.sections.follow_live import follow_live
from bench.sections.grep_compacted import grep_compacted
from bench.sections.hooks import hooks
from bench.sections.mcp import mcp
from bench.sections.prompt_cache import prompt_cache
from bench.sections.proxy import proxy
from bench.sections.pruning import pruning
from bench.sections.retention import rule_retention
from bench.sections.sharing import sharing
from bench.sections.storage import (
    assemble,
    batch_ingest,
    grep,
    large_load,
    memory,
    serve,
    single_ingest,
    startup,
)
from bench.sections.summarizer_window import summarizer_window
from bench.traffic import conversation

SECTIONS: list[Callable[[Bench], Awaitable[None]]] = [
    startup, serve, single_ingest, batch_ingest, large_load, assemble, delta, grep, pruning, memory, compaction,
    prompt_cache, rule_retention, summarizer_window, grep_compacted, sharing, proxy, follow_live, mcp, hooks,
    agent_summaries,
]
"""In order; compaction and the sections after it run their own servers, so the main server's peak memory
is read before them."""


def revision() -> str:
    """The checked-out commit of the code measured, with -dirty when the tree has changes."""
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=Path(__file__).resolve().parent,
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() or "unknown"


def table(bench: Bench) -> str:
    """The figures as a text table."""
    rows = [("figure", "value", "target", "")]
    for figure in bench.figures.values():
        op, limit = TARGETS.get(figure.key, ("", None))
        target = f"{'≤' if op == '<=' else '≥'} {limit:,g} {figure.unit}".rstrip() if limit is not None else ""
        if figure.value is None:
            value = f"n/a ({figure.note})"
        else:
            number = f"{figure.value:,.0f}" if figure.unit in ("", "tok") else f"{figure.value:,.2f}"
            value = f"{number} {figure.unit}".rstrip()
        rows.append((figure.label, value, target, figure.verdict))
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
        "missing": {key: figure.note for key, figure in bench.figures.items() if figure.value is None},
        "targets": {key: {"op": op, "limit": limit, "pass": bench.figures[key].verdict == "PASS"}
                    for key, (op, limit) in TARGETS.items()
                    if key in bench.figures and bench.figures[key].value is not None},
        "info": bench.info,
    }


async def run(mode: str, json_path: str | None, profile: str | None, only: str | None = None) -> int:
    """Run every section and print the table and the JSON."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-") as workdir:
        bench = Bench(SIZES[mode], Path(workdir), profile)
        bench.info["cpus"] = os.cpu_count()
        bench.info["loadavg_start"] = round(os.getloadavg()[0], 2)  # other work on the machine skews figures
        bench.info["git"] = revision()
        try:
            for section in SECTIONS:
                if only is not None and section.__name__ != only:
                    continue
                progress(f"{section.__name__}: {section.__doc__}")
                await section(bench)
                if section is memory and bench.client is not None:
                    await bench.client.close(timeout=60)  # the later sections start their own servers
                    bench.client = None
        finally:
            if bench.client is not None:
                await bench.client.close(timeout=60)
    bench.info["loadavg_end"] = round(os.getloadavg()[0], 2)
    result = report(bench, mode, time.perf_counter() - started)
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2) + "\n")
    print(table(bench))
    print(json.dumps(result, indent=2))
    return 0


def main() -> int:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_const", dest="mode", const="quick",
                      help="100k items instead of 1M for the large session (about a minute)")
    size.add_argument("--tiny", action="store_const", dest="mode", const="tiny",
                      help="a few seconds, 20 ms LLM latency; for the smoke test")
    parser.add_argument("--json", metavar="PATH", help="also write the JSON object here")
    parser.add_argument("--profile", metavar="PATH", help="run the main server under cProfile, stats to PATH")
    parser.add_argument("--only", choices=[section.__name__ for section in SECTIONS[SECTIONS.index(compaction):]],
                        help="run only this section (one of those that start their own servers)")
    parser.add_argument("--settings", metavar="JSON", type=json.loads, default={},
                        help='extra server settings, e.g. \'{"storage": {"memoryLimit": "128MB"}}\'')
    args = parser.parse_args()
    merge(SETTINGS, args.settings)
    if args.profile:
        args.profile = os.path.abspath(args.profile)
    return asyncio.run(run(args.mode or "full", args.json, args.profile, args.only))


if __name__ == "__main__":
    raise SystemExit(main())
