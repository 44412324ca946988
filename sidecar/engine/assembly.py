"""Choosing the context for the next LLM call: fresh tail, budget fill, tool pairing, pruning.

Pure functions over context items (anything with the attributes of
``sidecar.rows.ItemRow``); the caller fetches items and renders messages.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Protocol

import attrs

PRUNED_PLACEHOLDER = "[Old tool result content cleared]"
DROP_SHARE = 0.2
"""When the budget forces old items out, the fill frees this share of it, so the next turns only append again."""


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

    start: int | None = None
    """Position where the budget fill starts (anchored items before it are chosen too): the next fill's anchor."""


@attrs.define(frozen=True)
class PruneRule:
    protect_tokens: int
    minimum_tokens: int
    protected_tools: frozenset[str]
    placeholder_tokens: int


@attrs.define(frozen=True)
class PruneStep:
    """Where pruning stands: outputs at positions up to ``frontier`` are pruned; ``count``/``tokens`` newly."""

    frontier: int
    count: int = 0
    tokens: int = 0
    """Raw tokens of the outputs this step puts behind the frontier (0 when it stays), anchored ones included:
    the session's stored totals count every prunable output up to the frontier."""

    @property
    def advanced(self) -> bool:
        """Whether this is a new step, to be persisted."""
        return self.count > 0


def prune_step(items: Sequence[Item], rule: PruneRule, factor: float, frontier: int, all_count: int,
               all_tokens: int, pruned_count: int, pruned_tokens: int, coalesce: bool = False,
               keep: Sequence[Item] = ()) -> PruneStep | None:
    """RFC 007's step: prune every output older than the protected window once the newly prunable ones exceed
    ``minimumTokens`` (any amount when ``coalesce``: a compaction rewrites the prompt anyway).

    ``items`` are the newest items, covering ``protect_tokens``; ``all_*`` total every prunable output of the
    context, ``pruned_*`` those already pruned (at positions up to ``frontier``), all in raw tokens. ``keep`` are
    the prunable outputs that are anchored (pinned): never pruned, so they do not make a step worth it. None when
    ``items`` end inside the protected window: the caller passes more, or all there is.
    """
    newer = 0.0
    protected_count = protected_tokens = 0
    for item in reversed(items):
        if newer >= rule.protect_tokens:
            boundary = item.position
            break
        if item.position > frontier and is_prunable(item, rule):
            protected_count += 1
            protected_tokens += item.tokens
        newer += item.tokens * factor
    else:
        return None
    count = all_count - pruned_count - protected_count
    tokens = all_tokens - pruned_tokens - protected_tokens
    kept = [item for item in keep if frontier < item.position <= boundary]
    saved = tokens - sum(item.tokens for item in kept)
    if boundary <= frontier or count - len(kept) <= 0 or (not coalesce and saved * factor <= rule.minimum_tokens):
        return PruneStep(frontier)
    return PruneStep(boundary, count, tokens)


def prune_candidates(items: Sequence[Item], rule: PruneRule, factor: float = 1.0,
                     frontier: int = 0, keep: frozenset[int] = frozenset()) -> tuple[list[int], int]:
    """Tool outputs a compaction's coalesced prune step leaves pruned: (positions, their raw tokens).

    Those older than the protected window (its newest ``protect_tokens``, calibrated by ``factor``) and those
    already under the ``frontier``; ``items`` are the whole context, chronological, with raw estimates.
    Outputs at ``keep`` positions (anchored) never are.
    """
    newer = 0.0
    positions: list[int] = []
    total = 0
    for item in reversed(items):
        if (newer >= rule.protect_tokens or item.position <= frontier) and is_prunable(item, rule) \
                and item.position not in keep:
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


def context_total(items: Sequence[Item], rule: PruneRule | None, factor: float = 1.0, frontier: int = 0,
                  keep: frozenset[int] = frozenset()) -> int:
    """Tokens of a whole context as a compaction leaves it: calibrated, and pruned (coalesced) when ``rule`` is
    given."""
    total = math.ceil(sum(item.tokens for item in items) * factor)
    if rule is None:
        return total
    positions, tokens = prune_candidates(items, rule, factor, frontier, keep)
    return pruned_total(total, len(positions), tokens, rule, factor)


def pruned_total(total: int, count: int, tokens: int, rule: PruneRule, factor: float) -> int:
    """A calibrated ``total`` with ``count`` pruned outputs of ``tokens`` (raw) swapped for placeholders."""
    if not count:
        return total
    return total - (math.ceil(tokens * factor) - count * rule.placeholder_tokens)


ORPHAN_AFTER = 256
"""Items scanned past a tool result without meeting its call, after which ``plan_window`` calls it an orphan."""
TURN_SCAN = 4096
"""Items ``plan_window`` scans past a spent budget for the start of the turn the fill may resume at."""


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
                frontier: int = 0, factor: float = 1.0, keep: frozenset[int] = frozenset()) -> Window:
    """One backward scan: mark the pruned outputs (those up to the prune ``frontier``) and stop once the budget
    is surely spent.

    ``items`` are a chronological suffix of the context with raw estimates. The window ends at a unit boundary
    past the budget and the fresh tail, so the fill stops inside it; a tool result whose call is not met within
    ``ORPHAN_AFTER`` items is taken for an orphan. Outputs at ``keep`` positions (anchored) are never pruned,
    even behind the frontier.
    """
    placeholder = rule.placeholder_tokens if rule is not None else 0
    if rule is None:
        frontier = -1
    cost = 0
    messages = 0
    pending: dict[str, tuple[int, int, int]] = {}  # results whose call is not met yet: id -> (index, cost, count)
    pruned: list[int] = []
    calibrate = abs(factor - 1.0) >= 1e-9
    spent_at = -1  # index where the budget was first surely spent
    # One pass, written for speed: assemble calls this on every request over about a budget's worth of items.
    for index in range(len(items) - 1, -1, -1):
        item = items[index]
        tokens = item.tokens
        is_tool = item.role == "tool" and item.kind == "message"
        if is_tool and item.position <= frontier and not (keep and item.position in keep) and \
                is_prunable_output("tool", tokens, item.tool_name, rule):  # type: ignore[arg-type]
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
            # The fill may have to resume at a turn's start (``_turn_start``): the window reaches back to one.
            if spent_at < 0:
                spent_at = index
            if item.kind == "summary" or item.role in ("user", "system") or spent_at - index > TURN_SCAN:
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
    anchor: int | None = None,
) -> Assembly:
    """Anchored units, summaries and the fresh tail first, then older units newest first while they fit; never splits
    a tool call from its results.

    ``items`` are chronological. A unit is a message or summary with the tool results answering its calls;
    orphan tool outputs (no call among the items) are never chosen. A unit holding an ``anchored`` position, and
    every summary (its footer carries the standing rules of what it replaced), is always chosen; items at ``first``
    positions (system messages) lead the chosen list. ``anchor`` (where the previous fill started) keeps the fill's
    start where it was while everything from there fits, so the prompt only grows; once it does not, older units go
    until ``DROP_SHARE`` of the budget is free again. Where older units are left out, the fill starts at a turn (a
    user message), never at an assistant message cut from the message it answers (``_turn_start``).
    """
    units: list[list[int]] = []
    costs: list[int] = []
    unit_of_call: dict[str, int] = {}
    message_indexes: list[int] = []
    forced: set[int] = set()  # units holding an anchored item, and summaries
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
        if item.kind == "summary" or (anchored and item.position in anchored):
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
    limit = budget
    over_budget = tokens > budget
    exhausted = not over_budget
    first_chosen = tail_start
    fill = not over_budget
    if fill and anchor is not None and units:
        start = next((u for u, unit in enumerate(units) if items[unit[0]].position >= anchor), len(units))
        if start <= tail_start:
            kept = tokens + sum(costs[u] for u in range(start, tail_start) if u not in forced)
            if kept <= budget:
                first_chosen, tokens, exhausted, fill = start, kept, forced.issuperset(range(start)), False
            else:
                budget = math.floor(budget * (1 - DROP_SHARE))
    if fill:
        for u in range(tail_start - 1, -1, -1):
            if u in forced:
                first_chosen = u
                continue
            if tokens + costs[u] > budget:
                exhausted = False
                break
            tokens += costs[u]
            first_chosen = u
    moved, tokens = _turn_start(items, units, costs, forced, first_chosen, tail_start, tokens, limit)
    if moved != first_chosen:
        first_chosen, exhausted = moved, False
    return _assembly(items, units, first_chosen, tokens, over_budget or tokens > limit, exhausted, pruned, forced,
                     first)


def appendable(messages: Iterable[tuple[str, Sequence[str] | None, str | None]]) -> bool:
    """Whether messages, as (role, their tool call ids, the call a tool output answers), can be appended to an
    assembled prompt as they are: no system message (those lead the prompt), every call among them answered among
    them, every tool output answering one of them (else older messages would change)."""
    calls: set[str] = set()
    results: set[str | None] = set()
    for role, call_ids, answers in messages:
        if role == "system":
            return False
        calls.update(call_ids or ())
        if role == "tool":
            results.add(answers)
    return results == calls


def opens_turn(item: Item) -> bool:
    """Whether a context may resume at this item after a gap: a user or system message, or a summary."""
    return item.kind == "summary" or item.role in ("user", "system")


def _turn_start(items: Sequence[Item], units: list[list[int]], costs: list[int], forced: set[int], start: int,
                tail_start: int, tokens: int, budget: int) -> tuple[int, int]:
    """(first unit of the fill, tokens): where the fill leaves older units out and would start at an assistant
    message or tool output, it starts at the next turn instead; when the fresh tail itself starts inside a turn,
    the turn's user message is chosen too (``forced`` gains it) and the fill makes room for it.

    Right after a chosen unit (a summary, a pinned message) nothing is left out, and the fill may start anywhere.
    """
    if start <= 0 or start >= len(units) or (start - 1) in forced or opens_turn(items[units[start][0]]):
        return start, tokens
    for u in range(start + 1, tail_start + 1):
        if u == len(units) or opens_turn(items[units[u][0]]):  # the next turn, or nothing when there is no tail
            return u, tokens - sum(costs[v] for v in range(start, u) if v not in forced)
    opener = next((u for u in range(start - 1, -1, -1) if opens_turn(items[units[u][0]])), None)
    if opener is None or opener in forced:
        return start, tokens  # no user message to resume at, or a summary holds the turn's start
    forced.add(opener)
    tokens += costs[opener]
    while tokens > budget and start < tail_start:
        if start not in forced:
            tokens -= costs[start]
        start += 1
    return start, tokens


def _assembly(items: Sequence[Item], units: list[list[int]], first_chosen: int, tokens: int, over_budget: bool,
              exhausted: bool, pruned: frozenset[int] = frozenset(), forced: set[int] | frozenset[int] = frozenset(),
              first: frozenset[int] = frozenset()) -> Assembly:
    """The Assembly of the units from ``first_chosen`` on and the ``forced`` (anchored) ones before it, the items
    at ``first`` positions leading."""
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
        start=items[units[first_chosen][0]].position if first_chosen < len(units) else None,
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
