"""The context/assemble reply's encoder: what it writes structures back into the same AssembleResult."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import methods
from protocol.types import AssembleResult, ContextItem, Usage
from sidecar.assemble_reply import encode_assemble_result, encode_context_item
from sidecar.wire import camel, dumps, structure, unstructure, utf8
from tests.conftest import call, ingest, running_sidecar, settings_for

BARE_USAGE = Usage(session_id="s", tokens=120, context_window=128000, percent=0.1, threshold=100000, state="ok",
                   source="estimate", messages=3, summaries=0)
FULL_USAGE = attrs.evolve(BARE_USAGE, hint="compact soon", calibration=1.25, reported_tokens=150,
                          cache_hit_rate=0.5, cache_hit_rate_smoothed=0.4375)
CALL = {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": '{"path": "é.py"}'}}
MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": [{"type": "text", "text": "Grüße, 世界 — \"quoted\" \\ and a newline\n"}]},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "[pruned] (id t1)"},
    {"role": "user", "content": '<summary id="sum_1">… 🙂</summary>'},
]
ITEMS = [
    ContextItem(kind="message", id="sys", tokens=6),
    ContextItem(kind="message", id="ü\"1", tokens=20),
    ContextItem(kind="message", id="a1", tokens=30, pruned=False),
    ContextItem(kind="message", id="t1", tokens=12, pruned=True),
    ContextItem(kind="summary", id="sum_1", tokens=40),
]
FULL = AssembleResult(messages=MESSAGES, items=ITEMS, tokens=108, dropped=7, over_budget=True, usage=FULL_USAGE,
                      tools=[{"type": "function", "function": {"name": "memory_grep", "parameters": {}}}],
                      revision="r7", stable_prefix=3, cache_breakpoints=[0, 2, 4], delta=True, keep=3,
                      budget=96000, fixed_breakpoints=[0, 4], reason="the summaries and the newest turn need 108")
"""Every member set: a member added to AssembleResult must be added here (test_every_member_is_written)."""

RESULTS = {
    "full": FULL,
    "bare": AssembleResult(messages=[], items=[], tokens=0, dropped=0, over_budget=False, usage=BARE_USAGE),
    "full_not_delta": attrs.evolve(FULL, delta=False, keep=None, tools=None, usage=BARE_USAGE),
    "no_tools_no_breakpoints": attrs.evolve(FULL, tools=None, cache_breakpoints=None, revision=None),
    "empty_lists": attrs.evolve(FULL, messages=[], items=[], tools=[], cache_breakpoints=[]),
    "lone_surrogate": attrs.evolve(FULL, messages=[{"role": "user", "content": "half a pair: \ud83d"}],
                                   items=[ContextItem(kind="message", id="\udc00", tokens=3)]),
}


def encode(result: AssembleResult) -> bytes:
    """``result`` through the encoder, its messages, items and tools rendered first as the server renders them."""
    bare = attrs.evolve(result, messages=[], items=[], tools=None)
    tools = None if result.tools is None else utf8(dumps(result.tools))
    return encode_assemble_result(bare, [utf8(dumps(message)) for message in result.messages],
                                  [encode_context_item(item) for item in result.items], tools)


@pytest.mark.parametrize("name", RESULTS)
def test_a_reply_structures_back_into_the_result_it_encodes(name: str) -> None:
    result = RESULTS[name]
    data = json.loads(encode(result))
    assert structure(data, AssembleResult) == result
    assert data == unstructure(result), "the same members and nulls as the rest of the wire"


def test_every_member_is_written_in_the_order_of_the_type() -> None:
    fields = attrs.fields(AssembleResult)
    assert all(getattr(FULL, field.name) is not None for field in fields), "FULL sets every member"
    assert list(json.loads(encode(FULL))) == [camel(field.name) for field in fields]
    items = json.loads(encode(FULL))["items"]
    assert list(items[3]) == [camel(field.name) for field in attrs.fields(ContextItem)]


def test_a_result_holding_what_comes_as_json_text_is_refused() -> None:
    for held in ({"messages": MESSAGES}, {"items": ITEMS}, {"tools": []}):
        with pytest.raises(ValueError, match="JSON text"):
            encode_assemble_result(attrs.evolve(RESULTS["bare"], **held), [], [])


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(["message", "summary"]), id=st.text(), tokens=st.integers(0, 10**9),
       pruned=st.none() | st.booleans())
def test_any_context_item_round_trips(kind: str, id: str, tokens: int, pruned: bool | None) -> None:
    item = ContextItem(kind=kind, id=id, tokens=tokens, pruned=pruned)
    assert structure(json.loads(encode_context_item(item)), ContextItem) == item


def typed(reply: dict[str, Any]) -> AssembleResult:
    """A raw reply as AssembleResult, with nothing in it that the type does not hold."""
    result = structure(reply, AssembleResult)
    assert unstructure(result) == reply
    return result


async def test_full_and_delta_replies_of_the_server_are_assemble_results(tmp_path) -> None:
    config = settings_for(tmp_path / "db.duckdb",
                          compaction={"auto": False, "freshTail": 8, "leafChunkSize": 3, "minSavings": 0},
                          prune={"protectTokens": 2000, "minimumTokens": 100_000})
    async with running_sidecar(settings=config) as client:
        for number in range(8):
            await ingest(client, "s", [
                {"id": f"u{number}", "role": "user", "content": f"Schritt {number}: lies die nächste Datei 📄"},
                {"id": f"a{number}", "role": "assistant", "content": None, "tool_calls": [
                    {"id": f"c{number}", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
                {"id": f"t{number}", "role": "tool", "tool_call_id": f"c{number}", "content": "ü" * 4000}])
        first = typed(await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "tools": True}))
        assert first.tools and first.delta is None and first.keep is None
        compacted = await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s"})
        assert compacted["compacted"], compacted["reason"]
        rewritten = typed(await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "since": first.revision}))
        assert rewritten.delta is False and rewritten.keep is None and rewritten.tools is None
        assert rewritten.items[0].kind == "summary" and any(item.pruned for item in rewritten.items)
        await ingest(client, "s", [{"id": "last", "role": "user", "content": "und jetzt?"}])
        delta = typed(await call(client, methods.CONTEXT_ASSEMBLE,
                                 {"sessionId": "s", "since": rewritten.revision, "tools": True}))
        assert delta.delta is True and delta.keep == len(rewritten.messages) and delta.tools == first.tools
        assert [item.id for item in delta.items] == ["last"]
