"""Prompt-cache figures of a turn-by-turn replay, pruning on and off (issue 12)."""

from __future__ import annotations

from typing import Any

import attrs

import bench.core as core
from bench.core import Bench, progress
from sidecar.cli.prompt_cache import Prices, PromptCache
from sidecar.cli.replay import replay_cache
from sidecar.cli.synthetic import coding_session
from sidecar.importers import ParsedTranscript, parse_transcript


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


VARIANTS: tuple[tuple[str, str, dict[str, dict[str, Any]], Prices | None], ...] = (
    ("threshold75", "compaction.maxTokens 0 (75% of the window)", {"compaction": {"maxTokens": 0}}, None),
    ("half_read", "prices read=0.5,write=1", {}, Prices(read=0.5, write=1.0)),
    ("postponed", "prune.postponeCompaction true", {"prune": {"postponeCompaction": True}}, None),
)
"""Key suffix, label, settings and prices of the other runs, each against its own pruning-off twin."""


async def on_and_off(bench: Bench, name: str, parsed: ParsedTranscript, variant: str = "",
                     settings: dict[str, dict[str, Any]] | None = None,
                     prices: Prices | None = None) -> tuple[PromptCache, PromptCache]:
    """The replay's cache figures with pruning on and off."""
    runs: dict[bool, PromptCache] = {}
    for prune in (True, False):
        progress(f"prompt cache: {name}{variant and ', ' + variant}, {len(parsed.messages):,} messages, "
                 f"pruning {'on' if prune else 'off'}")
        db = str(bench.workdir / f"cache-{name}{variant and '-' + variant}-{'on' if prune else 'off'}.duckdb")
        runs[prune] = await replay_cache(parsed, f"{name}.jsonl", db, prune=prune, prices=prices, settings=settings)
    return runs[True], runs[False]


async def prompt_cache(bench: Bench) -> None:
    """Replay the pi session and a generated one turn by turn (default settings): prefix hits and input cost; then
    the cost ratio under other settings and prices."""
    for name, parsed in sessions(bench):
        on, off = await on_and_off(bench, name, parsed)
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
        for key, label, settings, prices in VARIANTS:
            on, off = await on_and_off(bench, name, parsed, key, settings, prices)
            figure, text = f"cache_{name}_cost_ratio_{key}", f"  input cost on / off, {name}, {label}"
            if off.cost:
                bench.record(figure, text, on.cost / off.cost, "x")
            else:
                bench.record_missing(figure, text, "x", "no prompt tokens")
