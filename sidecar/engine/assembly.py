"""Choosing the context for the next LLM call: fresh tail, budget fill, tool pairing, pruning.

Pure functions over context items (anything with the attributes of
``sidecar.storage.ItemRow``); the caller fetches items and renders messages.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import attrs

PRUNED_PLACEHOLDER = "[Old tool result content cleared]"


class Item(Protocol):
    position: int
    kind: str
    role: str
    tokens: int
    tool_name: str | None
    tool_call_id: str | None
    tool_call_ids: tuple[str, ...] | None


@attrs.define(frozen=True)
class Assembly:
    """What to send: chosen items in order, with pruning and tool-call trimming decided."""

    chosen: list[Item]
    pruned: frozenset[int]
    """Positions of chosen tool outputs replaced by the placeholder."""

    answered: dict[int, frozenset[str]]
    """For chosen assistant messages whose calls are not all answered: the call ids to keep."""

    tokens: int
    over_budget: bool
    exhausted: bool
    """Every given item fit: the caller may have older items to offer."""


@attrs.define(frozen=True)
class PruneRule:
    protect_tokens: int
    minimum_tokens: int
    protected_tools: frozenset[str]
    placeholder_tokens: int


def item_cost(item: Item, pruned: frozenset[int] | set[int], placeholder_tokens: int) -> int:
    """Tokens an item takes in the assembled context."""
    return placeholder_tokens if item.position in pruned else item.tokens


def prune_candidates(items: Sequence[Item], rule: PruneRule, factor: float = 1.0) -> tuple[list[int], int]:
    """Tool outputs older than the protected window that may be pruned: (positions, their raw tokens).

    ``items`` are chronological, with raw estimates; ``factor`` (the calibration) scales them to
    provider tokens, in which the newest ``protect_tokens`` are protected.
    """
    newer = 0.0
    positions: list[int] = []
    total = 0
    for item in reversed(items):
        if newer >= rule.protect_tokens and is_prunable(item, rule):
            positions.append(item.position)
            total += item.tokens
        newer += item.tokens * factor
    return positions, total


def is_prunable(item: Item, rule: PruneRule) -> bool:
    """A context item that is a prunable tool output."""
    return item.kind == "message" and is_prunable_output(item.role, item.tokens, item.tool_name, rule)


def is_prunable_output(role: str, tokens: int, tool_name: str | None, rule: PruneRule) -> bool:
    """A tool output of an unprotected tool, larger than its placeholder."""
    if role != "tool" or tokens <= rule.placeholder_tokens:
        return False
    return not (set((tool_name or "").split(",")) & rule.protected_tools)


def plan_pruning(items: Sequence[Item], rule: PruneRule, older_prunable_tokens: int = 0,
                 factor: float = 1.0) -> frozenset[int]:
    """Positions to prune: the candidates, when they and older ones not given exceed ``minimum_tokens``."""
    positions, total = prune_candidates(items, rule, factor)
    if (total + older_prunable_tokens) * factor > rule.minimum_tokens:
        return frozenset(positions)
    return frozenset()


def context_total(items: Sequence[Item], rule: PruneRule | None, factor: float = 1.0) -> int:
    """Tokens of a whole context as assembled with no budget: calibrated, and pruned when ``rule`` is given."""
    total = math.ceil(sum(item.tokens for item in items) * factor)
    if rule is None:
        return total
    positions, tokens = prune_candidates(items, rule, factor)
    return pruned_total(total, len(positions), tokens, rule, factor)


def pruned_total(total: int, candidates: int, candidate_tokens: int, rule: PruneRule, factor: float) -> int:
    """A calibrated ``total`` with its prune candidates (raw tokens) swapped for placeholders, if they qualify."""
    if candidate_tokens * factor > rule.minimum_tokens:
        return total - (math.ceil(candidate_tokens * factor) - candidates * rule.placeholder_tokens)
    return total


def _units(items: Sequence[Item]) -> tuple[list[list[int]], set[int]]:
    """Group item indexes into atomic units (an assistant with its tool results); and orphan tool indexes."""
    units: list[list[int]] = []
    unit_of_call: dict[str, int] = {}
    orphans: set[int] = set()
    for index, item in enumerate(items):
        if item.kind == "message" and item.role == "tool":
            owner = unit_of_call.get(item.tool_call_id or "")
            if owner is None:
                orphans.add(index)
            else:
                units[owner].append(index)
            continue
        units.append([index])
        for call_id in item.tool_call_ids or ():
            unit_of_call[call_id] = len(units) - 1
    return units, orphans


def assemble(
    items: Sequence[Item],
    budget: int,
    fresh_tail: int,
    pruned: frozenset[int] = frozenset(),
    placeholder_tokens: int = 0,
) -> Assembly:
    """Fresh tail first, then older units newest first while they fit; never splits a tool call from its results.

    ``items`` are chronological. Orphan tool outputs (no call among the items) are never chosen.
    """
    units, orphans = _units(items)
    unit_cost = [sum(item_cost(items[i], pruned, placeholder_tokens) for i in unit) for unit in units]

    message_indexes = [i for i, item in enumerate(items) if item.kind == "message" and i not in orphans]
    tail_start = len(units)
    if fresh_tail > 0 and message_indexes:
        first_tail_item = message_indexes[max(0, len(message_indexes) - fresh_tail)]
        tail_start = next(u for u, unit in enumerate(units) if max(unit) >= first_tail_item)

    chosen_units = list(range(tail_start, len(units)))
    tokens = sum(unit_cost[u] for u in chosen_units)
    over_budget = tokens > budget
    exhausted = not over_budget
    if not over_budget:
        for u in range(tail_start - 1, -1, -1):
            if tokens + unit_cost[u] > budget:
                exhausted = False
                break
            tokens += unit_cost[u]
            chosen_units.append(u)

    chosen_indexes = sorted(i for u in chosen_units for i in units[u])
    chosen = [items[i] for i in chosen_indexes]
    answered = _answered_calls(chosen)
    return Assembly(
        chosen=chosen,
        pruned=pruned & {item.position for item in chosen},
        answered=answered,
        tokens=tokens,
        over_budget=over_budget,
        exhausted=exhausted,
    )


def _answered_calls(chosen: Sequence[Item]) -> dict[int, frozenset[str]]:
    """Assistant positions whose tool calls are only partly answered among the chosen items."""
    answered_ids = {item.tool_call_id for item in chosen if item.role == "tool"}
    partial: dict[int, frozenset[str]] = {}
    for item in chosen:
        if item.tool_call_ids:
            keep = frozenset(c for c in item.tool_call_ids if c in answered_ids)
            if len(keep) != len(item.tool_call_ids):
                partial[item.position] = keep
    return partial
