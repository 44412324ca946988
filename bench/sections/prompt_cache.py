"""Prompt-cache figures of a turn-by-turn replay, pruning on and off (issue 12)."""

from __future__ import annotations

import attrs

import bench.core as core
from bench.core import Bench, progress
from sidecar.importers import ParsedTranscript, parse_transcript
from sidecar.tools.prompt_cache import PromptCache
from sidecar.tools.replay import replay_cache
from sidecar.tools.synthetic import coding_session


def sessions(bench: Bench) -> list[tuple[str, ParsedTranscript]]:
    """The pi session (when it is beside the project) and a generated one with large tool outputs."""
    chosen: list[tuple[str, ParsedTranscript]] = []
    if core.PI_SESSION.exists():
        parsed = parse_transcript(core.PI_SESSION, "pi")
        if bench.sizes.pi_messages:
            parsed = attrs.evolve(parsed, messages=parsed.messages[:bench.sizes.pi_messages])
        chosen.append(("pi", parsed))
    else:
        why = f"{core.PI_SESSION} not found"
        progress(f"prompt cache: pi session skipped: {why}")
        for key, label, unit in FIGURES:
            bench.record_missing(f"cache_pi_{key}", label.format(name="pi"), unit, why)
    messages = coding_session(bench.sizes.cache_messages, seed=12, tool_output_bytes=bench.sizes.cache_output_bytes)
    chosen.append(("generated", ParsedTranscript(format="generated", messages=messages)))
    return chosen


FIGURES = (
    ("hit_rate", "prefix hit rate, {name} replay", "share"),
    ("cost", "  input cost, {name} (uncached-token units)", "tok"),
    ("off_hit_rate", "  prefix hit rate, {name}, pruning off", "share"),
    ("off_cost", "  input cost, {name}, pruning off", "tok"),
    ("cost_ratio", "  input cost pruning on / off, {name}", "x"),
)
"""Key suffix, label, unit of each figure per session."""


async def prompt_cache(bench: Bench) -> None:
    """Replay the pi session and a generated one turn by turn (default settings): prefix hits and input cost."""
    for name, parsed in sessions(bench):
        runs: dict[bool, PromptCache] = {}
        for prune in (True, False):
            progress(f"prompt cache: {name}, {len(parsed.messages):,} messages, pruning {'on' if prune else 'off'}")
            db = str(bench.workdir / f"cache-{name}-{'on' if prune else 'off'}.duckdb")
            runs[prune] = await replay_cache(parsed, f"{name}.jsonl", db, prune=prune)
        on, off = runs[True], runs[False]
        values: dict[str, float | None] = {
            "hit_rate": on.hit_rate, "cost": on.cost, "off_hit_rate": off.hit_rate, "off_cost": off.cost,
            "cost_ratio": on.cost / off.cost if off.cost else None,
        }
        for key, label, unit in FIGURES:
            value = values[key]
            if value is None:
                bench.record_missing(f"cache_{name}_{key}", label.format(name=name), unit, "no prompt tokens")
            else:
                bench.record(f"cache_{name}_{key}", label.format(name=name), value, unit)
        for state, cache in (("on", on), ("off", off)):
            bench.info[f"cache_{name}_{state}_prompts"] = cache.prompts
            bench.info[f"cache_{name}_{state}_prompt_tokens"] = cache.tokens
            bench.info[f"cache_{name}_{state}_repeated_tokens"] = cache.repeated
            bench.info[f"cache_{name}_{state}_short_prompts"] = cache.short
        bench.info["cache_prices"] = on.prices.text()
