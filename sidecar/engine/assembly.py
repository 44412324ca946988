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
    """What assembly reads of a context item (read-only, so named tuples and frozen classes qualify)."""

    @property
    def position(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def tokens(self) -> int: ...
    @property
    def tool_name(self) -> str | None: ...
    @property
    def tool_call_id(self) -> str | None: ...
    @property
    def tool_call_ids(self) -> tuple[str, ...] | None: ...


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


def prune_candidates(items: Sequence[Item], rule: PruneRule, factor: float = 1.0,
                     keep: frozenset[int] = frozenset()) -> tuple[list[int], int]:
    """Tool outputs older than the protected window that may be pruned: (positions, their raw tokens).

    ``items`` are chronological, with raw estimates; ``factor`` (the calibration) scales them to
    provider tokens, in which the newest ``protect_tokens`` are protected. ``keep`` positions are anchored.
    """
    newer = 0.0
    positions: list[int] = []
    total = 0
    for item in reversed(items):
        if newer >= rule.protect_tokens and is_prunable(item, rule) and item.position not in keep:
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
    names = tool_name or ""
    if "," not in names:
        return names not in rule.protected_tools
    return not (set(names.split(",")) & rule.protected_tools)


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


ORPHAN_AFTER = 256
"""Items scanned past a tool result without meeting its call, after which ``plan_window`` calls it an orphan."""


@attrs.define(frozen=True)
class Window:
    """The newest items an assembly needs, and which of them to prune."""

    start: int
    """Index of the first needed item: ``assemble(items[start:], …)`` chooses what it would over all items."""

    pruned: frozenset[int]
    """Positions of tool outputs to prune, among the needed items."""

    covered: bool
    """The needed items end before ``items`` do; when false, older items than those given may be needed."""


def plan_window(items: Sequence[Item], budget: int, fresh_tail: int, rule: PruneRule | None,
                all_prunable_tokens: int = 0, factor: float = 1.0, keep: frozenset[int] = frozenset()) -> Window:
    """One backward scan: decide pruning (PROTOCOL.md's rule) and stop once the budget is surely spent.

    ``items`` are a chronological suffix of the context with raw estimates, ``all_prunable_tokens`` the raw
    tokens of every prunable output in the whole context. The window ends at a unit boundary past the
    budget and the fresh tail, so the fill stops inside it; a tool result whose call is not met within
    ``ORPHAN_AFTER`` items is taken for an orphan. Outputs at ``keep`` positions (anchored) are never pruned.
    """
    newer = 0.0
    protected_prunable = 0
    decided = rule is None
    prune = False
    placeholder = rule.placeholder_tokens if rule is not None else 0
    cost = 0
    messages = 0
    pending: dict[str, tuple[int, int, int]] = {}  # results whose call is not met yet: id -> (index, cost, count)
    pruned: list[int] = []
    calibrate = abs(factor - 1.0) >= 1e-9
    # One pass, written for speed: assemble calls this on every request over about a budget's worth of items.
    for index in range(len(items) - 1, -1, -1):
        item = items[index]
        tokens = item.tokens
        if not decided and newer >= rule.protect_tokens:  # type: ignore[union-attr]
            decided = True
            prune = (all_prunable_tokens - protected_prunable) * factor > rule.minimum_tokens  # type: ignore[union-attr]
        newer += tokens * factor
        is_tool = item.role == "tool" and item.kind == "message"
        if is_tool and rule is not None and is_prunable_output("tool", tokens, item.tool_name, rule) \
                and not (keep and item.position in keep):
            if not decided:
                protected_prunable += tokens
            elif prune:
                pruned.append(item.position)
                tokens = -1
        added = placeholder if tokens < 0 else (math.ceil(tokens * factor) if calibrate else tokens)
        cost += added
        if item.kind == "message":
            messages += 1
        if is_tool:
            call_id = item.tool_call_id or ""
            seen, spent, count = pending.get(call_id, (index, 0, 0))
            pending[call_id] = (seen, spent + added, count + 1)
        elif item.tool_call_ids and pending:
            for call_id in item.tool_call_ids:
                pending.pop(call_id, None)
        if pending:
            # The first pending result is the one waiting longest (dicts keep insertion order).
            if next(iter(pending.values()))[0] - index > ORPHAN_AFTER:
                orphans = {call_id: entry for call_id, entry in pending.items() if entry[0] - index > ORPHAN_AFTER}
                # Orphans are never chosen: they count neither in the fill nor in the fresh tail.
                messages -= sum(count for _, _, count in orphans.values())
                cost -= sum(spent for _, spent, _ in orphans.values())
                pending = {call_id: entry for call_id, entry in pending.items() if call_id not in orphans}
        elif cost > budget and messages >= fresh_tail and not is_tool:
            return Window(index, frozenset(pruned), True)
    return Window(0, frozenset(pruned), False)


def assemble(
    items: Sequence[Item],
    budget: int,
    fresh_tail: int,
    pruned: frozenset[int] = frozenset(),
    placeholder_tokens: int = 0,
    anchored: frozenset[int] = frozenset(),
    first: frozenset[int] = frozenset(),
) -> Assembly:
    """Anchored units and the fresh tail first, then older units newest first while they fit; never splits a
    tool call from its results.

    ``items`` are chronological. A unit is a message or summary with the tool results answering its calls;
    orphan tool outputs (no call among the items) are never chosen. A unit holding an ``anchored`` position
    is always chosen; items at ``first`` positions (system messages) lead the chosen list.
    """
    units: list[list[int]] = []
    costs: list[int] = []
    unit_of_call: dict[str, int] = {}
    message_indexes: list[int] = []
    forced: set[int] = set()  # units holding an anchored item
    for index, item in enumerate(items):
        cost = placeholder_tokens if item.position in pruned else item.tokens
        if item.role == "tool" and item.kind == "message":
            owner = unit_of_call.get(item.tool_call_id or "")
            if owner is not None:
                units[owner].append(index)
                costs[owner] += cost
                message_indexes.append(index)
                if anchored and item.position in anchored:
                    forced.add(owner)
            continue
        if anchored and item.position in anchored:
            forced.add(len(units))
        if item.kind == "message":
            message_indexes.append(index)
        for call_id in item.tool_call_ids or ():
            unit_of_call[call_id] = len(units)
        units.append([index])
        costs.append(cost)

    tail_start = len(units)
    if fresh_tail > 0 and message_indexes:
        first_tail_item = message_indexes[max(0, len(message_indexes) - fresh_tail)]
        # Members are appended in order, so a unit's last index is its newest.
        tail_start = next(u for u, unit in enumerate(units) if unit[-1] >= first_tail_item)

    forced = {u for u in forced if u < tail_start}
    tokens = sum(costs[tail_start:]) + sum(costs[u] for u in forced)
    over_budget = tokens > budget
    exhausted = not over_budget
    first_chosen = tail_start
    if not over_budget:
        for u in range(tail_start - 1, -1, -1):
            if u in forced:
                first_chosen = u
                continue
            if tokens + costs[u] > budget:
                exhausted = False
                break
            tokens += costs[u]
            first_chosen = u

    indexes = [i for unit in units[first_chosen:] for i in unit]
    indexes += [i for u in forced if u < first_chosen for i in units[u]]
    chosen = [items[i] for i in sorted(indexes)]
    # Every item at ``first`` is chosen (anchored); usually they lead already, and the check is cheap.
    if first and not all(item.position in first for item in chosen[:len(first)]):
        chosen = [item for item in chosen if item.position in first] + \
            [item for item in chosen if item.position not in first]
    return Assembly(
        chosen=chosen,
        pruned=frozenset(item.position for item in chosen if item.position in pruned) if pruned else pruned,
        answered=_answered_calls(chosen),
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
