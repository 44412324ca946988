"""context/assemble: budget, fresh tail, newest-first fill, tool pairing; the engine property-tested directly."""

from __future__ import annotations

import math

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import methods
from sidecar.cli.synthetic import coding_session
from sidecar.engine.assembly import (
    DROP_SHARE,
    PruneRule,
    assemble,
    is_prunable,
    plan_window,
    prune_candidates,
    prune_step,
)
from tests.conftest import call, ingest
from tests.helpers.openai_checks import assert_valid_openai_sequence


@attrs.define(frozen=True)
class FakeItem:
    position: int
    kind: str
    role: str
    tokens: int
    tool_name: str | None = None
    tool_call_id: str | None = None
    tool_call_ids: tuple[str, ...] | None = None


@st.composite
def contexts(draw):
    """Chronological context items: user/assistant turns, some with several tool calls and results."""
    items: list[FakeItem] = []
    position = 0
    for turn in range(draw(st.integers(0, 12))):
        position += draw(st.integers(1, 3))
        items.append(FakeItem(position, draw(st.sampled_from(["message", "summary"])), "user",
                              draw(st.integers(1, 300))))
        calls = tuple(f"c{turn}_{i}" for i in range(draw(st.integers(0, 3))))
        position += 1
        items.append(FakeItem(position, "message", "assistant", draw(st.integers(1, 300)),
                              tool_call_ids=calls or None))
        answered = draw(st.lists(st.sampled_from(calls), unique=True)) if calls else []
        for call_id in answered:
            position += 1
            items.append(FakeItem(position, "message", "tool", draw(st.integers(1, 500)), tool_call_id=call_id))
    if draw(st.booleans()):
        position += 1
        items.append(FakeItem(position, "message", "tool", 50, tool_call_id="orphan"))
    return items


@settings(max_examples=300, deadline=None)
@given(items=contexts(), budget=st.integers(0, 3000), fresh_tail=st.integers(0, 8))
def test_assembly_rules_hold_for_any_context(items, budget, fresh_tail):
    plan = assemble(items, budget, fresh_tail)
    chosen = plan.chosen
    positions = [item.position for item in chosen]
    assert positions == sorted(positions)
    assert plan.tokens == sum(item.tokens for item in chosen)
    if not plan.over_budget:
        assert plan.tokens <= budget
    kept = set(positions)
    # Every summary is sent, whatever the budget: its footer carries the standing rules.
    assert {i.position for i in items if i.kind == "summary"} <= kept
    # Past the summaries, a contiguous suffix of the context (orphans aside), but for the user message of a turn the
    # fresh tail starts inside: nothing older than a dropped message is kept.
    rest = [i for i in chosen if i.kind != "summary"]
    if len(rest) > 1 and rest[0].role == "user" and rest[1].role != "user" and \
            any(i.role == "user" and i.position not in kept for i in items if rest[0].position < i.position):
        rest = rest[1:]  # not the opener of a later dropped turn: it opens the turn the tail cut
    if rest:
        skipped = [i for i in items if i.position > rest[0].position and i.position not in kept and i.kind != "summary"]
        assert all(i.role == "tool" and i.tool_call_id not in _call_ids(chosen) for i in skipped)
    # Resumed after a gap, the context never opens with an assistant message or tool output cut from its turn.
    dropped_before = [i for i in items if rest and i.position < rest[0].position and i.position not in kept
                      and not _is_orphan(i, items)]
    if rest and dropped_before and rest[0].role not in ("user", "system"):
        turn = [i for i in items if i.position < rest[0].position and (i.role == "user" or i.kind == "summary")]
        assert turn and turn[-1].position in kept, "the turn's opening message (or summary) is sent"
    # The fresh tail is always there.
    messages = [i for i in items if i.kind == "message" and not _is_orphan(i, items)]
    for item in messages[max(0, len(messages) - fresh_tail):] if fresh_tail else []:
        assert item.position in kept
    # Tool results travel with their call; calls left without results are trimmed.
    calls = _call_ids(chosen)
    for item in chosen:
        if item.role == "tool":
            assert item.tool_call_id in calls
    for item in chosen:
        if item.tool_call_ids:
            answered = {i.tool_call_id for i in chosen if i.role == "tool"}
            keep = plan.answered.get(item.position, frozenset(item.tool_call_ids))
            assert keep == frozenset(c for c in item.tool_call_ids if c in answered)


def _reference_assemble(items, budget, fresh_tail, pruned, placeholder):
    """The assembly rules written plainly, without regard to speed: what ``assemble`` must agree with."""
    units, owner_of, orphans = [], {}, set()
    for index, item in enumerate(items):
        if item.kind == "message" and item.role == "tool":
            owner = owner_of.get(item.tool_call_id)
            if owner is None:
                orphans.add(index)
            else:
                units[owner].append(index)
            continue
        units.append([index])
        for call_id in item.tool_call_ids or ():
            owner_of[call_id] = len(units) - 1
    cost = [sum(placeholder if items[i].position in pruned else items[i].tokens for i in unit) for unit in units]
    messages = [i for i, item in enumerate(items) if item.kind == "message" and i not in orphans]
    tail = len(units)
    if fresh_tail and messages:
        first = messages[max(0, len(messages) - fresh_tail)]
        tail = min(u for u, unit in enumerate(units) if max(unit) >= first)

    def opens(u):
        return items[units[u][0]].kind == "summary" or items[units[u][0]].role in ("user", "system")

    summaries = {u for u in range(tail) if items[units[u][0]].kind == "summary"}
    chosen = set(range(tail, len(units))) | summaries
    tokens = sum(cost[u] for u in chosen)
    start = tail
    if tokens <= budget:
        for u in range(tail - 1, -1, -1):
            if u in summaries:
                start = u
                continue
            if tokens + cost[u] > budget:
                break
            tokens += cost[u]
            chosen.add(u)
            start = u
    if 0 < start < len(units) and start - 1 not in summaries and not opens(start):
        later = [u for u in range(start + 1, tail + 1) if u == len(units) or opens(u)]
        if later:  # resume at the next turn
            for u in range(start, later[0]):
                if u not in summaries:
                    chosen.discard(u)
                    tokens -= cost[u]
        else:  # the tail starts inside a turn: its user message comes too, the fill making room
            opener = max((u for u in range(start) if opens(u)), default=None)
            if opener is not None and opener not in summaries:
                chosen.add(opener)
                tokens += cost[opener]
                while tokens > budget and start < tail:
                    if start not in summaries:
                        chosen.discard(start)
                        tokens -= cost[start]
                    start += 1
    return sorted(items[i].position for u in chosen for i in units[u]), tokens


@settings(max_examples=300, deadline=None)
@given(items=contexts(), budget=st.integers(0, 3000), fresh_tail=st.integers(0, 8), data=st.data())
def test_assemble_agrees_with_the_plain_reference(items, budget, fresh_tail, data):
    tools = [item.position for item in items if item.role == "tool"]
    pruned = frozenset(data.draw(st.lists(st.sampled_from(tools), unique=True))) if tools else frozenset()
    plan = assemble(items, budget, fresh_tail, pruned, 7)
    positions, tokens = _reference_assemble(items, budget, fresh_tail, pruned, 7)
    assert [item.position for item in plan.chosen] == positions
    assert plan.tokens == tokens
    assert plan.pruned == pruned & set(positions)


def _reference_pruning(items, rule, frontier):
    """Persisted pruning written plainly: every prunable output up to the frontier."""
    return frozenset(item.position for item in items if item.position <= frontier and is_prunable(item, rule))


def _calibrated(items, factor):
    return [attrs.evolve(item, tokens=math.ceil(item.tokens * factor)) for item in items]


@settings(max_examples=400, deadline=None)
@given(items=contexts(), budget=st.integers(0, 3000), fresh_tail=st.integers(0, 8),
       protect=st.integers(0, 1500), minimum=st.integers(0, 1500), frontier=st.integers(0, 60),
       factor=st.sampled_from([1.0, 0.6, 1.7]), prune=st.booleans())
def test_the_window_assembles_exactly_what_the_whole_context_would(items, budget, fresh_tail, protect, minimum,
                                                                   frontier, factor, prune):
    # Pruning is a persisted frontier now (issue 12), no longer decided on each call: the window gets it as is.
    rule = PruneRule(protect, minimum, frozenset({"skill"}), 7) if prune else None
    pruned = _reference_pruning(items, rule, frontier) if rule else frozenset()
    whole = assemble(_calibrated(items, factor), budget, fresh_tail, pruned, 7)

    window = plan_window(items, budget, fresh_tail, rule, frontier, factor)
    older = [i for i in items[:window.start] if i.kind == "summary"]  # always sent: the caller adds them
    part = assemble(_calibrated(older + items[window.start:], factor), budget, fresh_tail, window.pruned, 7)

    assert [i.position for i in part.chosen] == [i.position for i in whole.chosen]
    assert (part.tokens, part.over_budget, part.pruned, part.answered) == \
        (whole.tokens, whole.over_budget, whole.pruned, whole.answered)
    if window.covered:
        assert not part.exhausted
    else:
        assert window.start == 0


@pytest.mark.parametrize("orphans", [[590], [588, 590]])
def test_the_window_does_not_count_an_orphan_tool_output_toward_the_budget(orphans):
    """An orphan (a result with no call) is never chosen, so the window must not stop early on its tokens."""
    items = [FakeItem(p, "message", "user", 10) for p in range(1, 601)]
    for position in orphans:  # two orphans may answer the same missing call
        items[position - 1] = FakeItem(position, "message", "tool", 2000, tool_call_id="no-such-call")
    whole = assemble(items, 3000, 0)
    window = plan_window(items, 3000, 0, None)
    part = assemble(items[window.start:], 3000, 0)
    assert [i.position for i in part.chosen] == [i.position for i in whole.chosen]
    assert part.tokens == whole.tokens == 3000


def _call_ids(items) -> set[str]:
    return {c for i in items for c in (i.tool_call_ids or ())}


def _is_orphan(item, items) -> bool:
    return item.role == "tool" and not any(item.tool_call_id in (i.tool_call_ids or ()) and i.position < item.position
                                           for i in items)


async def test_assemble_respects_budget_and_returns_chronological_valid_messages(sidecar):
    session = coding_session(300)
    await ingest(sidecar, "s", session)
    full = await call(sidecar, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "prune": False})
    assert [i["id"] for i in full["items"]] == [m["id"] for m in session]
    assert full["dropped"] == 0 and full["overBudget"] is False
    for budget in (500, 2000, 9000):
        result = await call(sidecar, methods.CONTEXT_ASSEMBLE,
                            {"sessionId": "s", "budget": budget, "freshTail": 3, "prune": False})
        assert result["tokens"] <= budget and result["overBudget"] is False
        assert result["tokens"] == sum(i["tokens"] for i in result["items"])
        assert result["dropped"] == len(session) - len(result["items"])
        ids = [i["id"] for i in result["items"]]
        # The system message first (never left out), then a newest-first fill in chronological order.
        assert ids[0] == "sys-0" and ids[1:] == [m["id"] for m in session][-len(ids) + 1:]
        assert_valid_openai_sequence(result["messages"])
        assert all(set(m) <= {"role", "content", "name", "tool_calls", "tool_call_id"} for m in result["messages"])


async def test_fresh_tail_wins_over_the_budget(sidecar):
    session = coding_session(60)
    await ingest(sidecar, "s", session)
    result = await call(sidecar, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "budget": 10, "freshTail": 6})
    assert result["overBudget"] is True
    assert len(result["items"]) >= 6
    assert result["tokens"] > 10
    assert_valid_openai_sequence(result["messages"])


async def test_tail_starting_at_a_tool_result_pulls_in_its_call(sidecar):
    session = [
        {"id": "u", "role": "user", "content": "go"},
        {"id": "a", "role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
        {"id": "t1", "role": "tool", "tool_call_id": "c1", "content": "one"},
        {"id": "t2", "role": "tool", "tool_call_id": "c2", "content": "two"},
    ]
    await ingest(sidecar, "s", session)
    result = await call(sidecar, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "budget": 0, "freshTail": 1})
    assert [i["id"] for i in result["items"]] == ["u", "a", "t1", "t2"], "and the user message the call answers"
    assert_valid_openai_sequence(result["messages"])


async def test_unanswered_tool_calls_are_trimmed_from_the_assembled_copy(sidecar):
    await ingest(sidecar, "s", [
        {"id": "u", "role": "user", "content": "go"},
        {"id": "a", "role": "assistant", "content": "Reading both.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
        {"id": "t1", "role": "tool", "tool_call_id": "c1", "content": "one"},
    ])
    result = await call(sidecar, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
    assistant = result["messages"][1]
    assert [c["id"] for c in assistant["tool_calls"]] == ["c1"]
    assert_valid_openai_sequence(result["messages"])
    stored = await call(sidecar, methods.MEMORY_EXPAND, {"sessionId": "s", "id": "a"})
    assert len(stored["items"][0]["message"]["tool_calls"]) == 2  # the stored original is untouched


async def test_default_budget_is_window_minus_reserve(sidecar):
    await ingest(sidecar, "s", [{"role": "user", "content": "y" * 4000} for _ in range(15)], contextWindow=20000)
    result = await call(sidecar, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "freshTail": 0})
    assert result["budget"] == 20000 - 8192 and result["tokens"] <= result["budget"]
    # 15,000 tokens do not fit it: compacted (automatic compaction started with the ingest), or left out.
    assert result["dropped"] > 0 or any(item["kind"] == "summary" for item in result["items"])


@settings(max_examples=300, deadline=None)
@given(items=contexts(), protect=st.integers(0, 800), minimum=st.integers(0, 800),
       factor=st.sampled_from([1.0, 0.6, 1.7]))
def test_prune_steps_only_advance_and_each_clears_the_minimum(items, protect, minimum, factor):
    """Items arrive one by one; each assemble takes a step when due: pruned stays pruned, steps are worth it."""
    rule = PruneRule(protect, minimum, frozenset({"skill"}), 7)
    frontier = pruned_count = pruned_tokens = 0
    pruned: set[int] = set()
    for end in range(1, len(items) + 1):
        seen = items[:end]
        prunable = [item for item in seen if is_prunable(item, rule)]
        step = prune_step(seen, rule, factor, frontier, len(prunable), sum(i.tokens for i in prunable),
                          pruned_count, pruned_tokens)
        if step is None or not step.advanced:
            continue
        newly = {i.position for i in prunable if frontier < i.position <= step.frontier}
        assert step.frontier > frontier
        assert step.count == len(newly) and step.tokens == sum(i.tokens for i in prunable if i.position in newly)
        assert step.tokens * factor > minimum, "a step clears more than minimumTokens"
        candidates, _ = prune_candidates(seen, rule, factor)
        assert newly <= set(candidates) | pruned, "only outputs older than the protected window"
        frontier, pruned_count, pruned_tokens = step.frontier, pruned_count + step.count, pruned_tokens + step.tokens
        assert not pruned & newly
        pruned |= newly
    assert pruned == {i.position for i in items if i.position <= frontier and is_prunable(i, rule)}


@settings(max_examples=300, deadline=None)
@given(items=contexts(), budget=st.integers(0, 3000), fresh_tail=st.integers(0, 8), data=st.data())
def test_an_anchored_fill_only_grows_until_it_must_drop_a_share(items, budget, fresh_tail, data):
    """Appending keeps the previous fill as a prefix; when it cannot, DROP_SHARE of the budget is freed."""
    cut = data.draw(st.integers(0, len(items)))
    before = assemble(items[:cut], budget, fresh_tail)
    if not before.chosen or before.over_budget:
        return
    after = assemble(items, budget, fresh_tail, anchor=before.start)
    old = [item.position for item in before.chosen]
    new = [item.position for item in after.chosen]
    if after.over_budget:
        return
    assert after.tokens <= budget
    if new[:len(old)] != old:
        tail = assemble(items, 0, fresh_tail)
        assert after.tokens <= math.floor(budget * (1 - DROP_SHARE)) or new == [i.position for i in tail.chosen]


@settings(max_examples=300, deadline=None)
@given(items=contexts(), budget=st.integers(0, 3000), fresh_tail=st.integers(0, 8), data=st.data())
def test_anchored_items_are_always_chosen_and_the_fill_anchor_still_only_grows(items, budget, fresh_tail, data):
    """Pinned units and system messages (leading) are always chosen; the fill anchor keeps the rest a prefix."""
    items = [FakeItem(0, "message", "system", data.draw(st.integers(1, 300))), *items]
    pinned = data.draw(st.sets(st.sampled_from([i.position for i in items if i.role != "tool"])))
    anchored = frozenset(pinned | {0})
    first = frozenset({0})
    cut = data.draw(st.integers(1, len(items)))
    before = assemble(items[:cut], budget, fresh_tail, anchored=anchored, first=first)
    after = assemble(items, budget, fresh_tail, anchored=anchored, first=first, anchor=before.start)
    for plan, offered in ((before, items[:cut]), (after, items)):
        chosen = [item.position for item in plan.chosen]
        assert chosen[0] == 0, "the system message leads"
        assert anchored & {item.position for item in offered} <= set(chosen), "anchored items are always chosen"
        assert plan.over_budget or plan.tokens <= budget
    if before.over_budget or after.over_budget:
        return
    old = [item.position for item in before.chosen]
    new = [item.position for item in after.chosen]
    if new[:len(old)] != old:
        tail = assemble(items, 0, fresh_tail, anchored=anchored, first=first)
        assert after.tokens <= math.floor(budget * (1 - DROP_SHARE)) or new == [i.position for i in tail.chosen]



def test_the_fill_anchor_keeps_anchored_items_before_it_and_system_messages_lead():
    """A fill kept at its anchor still sends the pinned and system items older than it, the system one first."""
    items = [FakeItem(position, "message", "assistant" if position % 2 else "user", 100) for position in range(1, 11)]
    items[3] = FakeItem(4, "message", "system", 50)  # a system message that came later
    anchored, first = frozenset({2, 4}), frozenset({4})
    before = assemble(items, 460, 2, anchored=anchored, first=first)
    assert [item.position for item in before.chosen] == [4, 2, 8, 9, 10] and before.start == 8
    grown = [*items, FakeItem(11, "message", "user", 10)]
    after = assemble(grown, 460, 2, anchored=anchored, first=first, anchor=before.start)
    assert [item.position for item in after.chosen] == [4, 2, 8, 9, 10, 11], "only appended"
    assert after.start == 8 and after.tokens == before.tokens + 10 == 460
