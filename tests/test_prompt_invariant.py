"""What every assembled prompt holds, for every client: once a session has summaries, each ``context/assemble``
carries them with their standing rules, never opens with an assistant message cut from its turn, and fits the
budget the sidecar works out from the window, the reply's room and what the client sends beside the messages."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pygls.exceptions import JsonRpcException

from protocol import errors, methods
from tests.conftest import call, ingest, running_sidecar, settings_for

RULE = "Never edit the generated files under build/ by hand."
SUMMARY_TAG = '<summary id="sum_'
OVERHEAD = 2600
"""A system prompt and tool definitions, as pi's or Claude Code's."""


def step(turn: int, tokens: int) -> list[dict[str, Any]]:
    """One turn: a request, a file read of about ``tokens`` tokens, an answer; the first states a rule."""
    call_id = f"call_{turn}"
    return [
        {"id": f"u{turn}", "role": "user", "content": ("" if turn else RULE + " ") + f"Turn {turn}: read f{turn}.py"},
        {"id": f"a{turn}", "role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "read", "arguments": json.dumps({"path": "f"})}}]},
        {"id": f"t{turn}", "role": "tool", "tool_call_id": call_id,
         "content": f"x_{turn} = 1  # line\n" * (tokens // 4)},
        {"id": f"b{turn}", "role": "assistant", "content": f"Read f{turn}.py."},
    ]


@pytest.mark.parametrize(("window", "tokens"), [(16_384, 1_200), (32_768, 1_200), (16_384, 16_384 // 3),
                                                (32_768, 32_768 // 3)])
async def test_every_prompt_after_the_first_compaction_holds_the_summary_and_the_rules_and_fits(
        db_path, window: int, tokens: int) -> None:
    settings = settings_for(db_path, contextWindow=window, compaction={"reserveTokens": 4096})
    after = 0
    async with running_sidecar(settings=settings) as client:
        for turn in range(max(24, 3 * window // tokens)):
            await ingest(client, "s", step(turn, tokens))
            result = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "overheadTokens": OVERHEAD})
            assert result["budget"] == window - 4096 - OVERHEAD
            assert not result["overBudget"] and result["tokens"] <= result["budget"], result.get("reason")
            if not result["usage"]["summaries"]:
                continue
            after += 1
            texts = [m["content"] for m in result["messages"] if m["role"] == "user"]
            assert any(text.startswith(SUMMARY_TAG) for text in texts), f"turn {turn}: no summary"
            assert any(RULE in text for text in texts), f"turn {turn}: the standing rule is missing"
            assert next(m for m in result["messages"] if m["role"] != "system")["role"] == "user", f"turn {turn}"
    assert after >= 8, "most of the session came after the first compaction"


async def test_the_budget_leaves_room_for_the_overhead_and_the_reply_and_stays_while_they_move_little(db_path):
    async with running_sidecar(settings=settings_for(db_path, contextWindow=20_000)) as client:
        await ingest(client, "s", step(0, 400))

        async def budget(**params: Any) -> int:
            return (await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", **params}))["budget"]

        def near(value: int, wanted: float) -> bool:
            """Once it moved, a budget is set a little under what is wanted, so the next small moves keep it."""
            return wanted - 64 <= value <= wanted

        assert await budget() == 20_000 - 8192, "the window less the reserve"
        first = await budget(overheadTokens=3000)
        assert near(first, 20_000 - 8192 - 3000)
        assert await budget(overheadTokens=3020) == first, "a few tokens more: the same budget"
        moved = await budget(overheadTokens=3000, replyTokens=9000)  # more than the reserve: the reply's room
        assert near(moved, 20_000 - 9000 - 3000)
        assert near(await budget(overheadTokens=3000, replyTokens=15_000), 20_000 - 10_000 - 3000), "half the window"
        await budget(overheadTokens=3000, replyTokens=9000)
        scaled = await budget(overheadTokens=3000, replyTokens=9000, scale=2)
        assert near(scaled, (20_000 - 9000 - 3000) / 2), "rendered twice as large: half as many tokens"
        assert await budget(budget=1234, overheadTokens=3000) == 1234, "a budget named is the client's"
        usage = await call(client, methods.CONTEXT_USAGE, {"sessionId": "s"})
        alone = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "budget": 10**6})
        assert usage["tokens"] == alone["tokens"] + 3000, "usage counts the whole prompt"


@pytest.mark.parametrize(("field", "value"), [("overheadTokens", -1), ("replyTokens", -5), ("scale", 0.5),
                                              ("scale", 9), ("scale", "big"), ("overheadTokens", 1.5)])
async def test_bad_budget_params_are_refused_naming_the_field_and_change_nothing(db_path, field: str,
                                                                                 value: Any) -> None:
    async with running_sidecar(settings=settings_for(db_path, contextWindow=20_000)) as client:
        await ingest(client, "s", step(0, 400))
        before = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
        with pytest.raises(JsonRpcException) as caught:
            await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", field: value})
        assert caught.value.code == errors.INVALID_PARAMS
        assert caught.value.data["field"] == field
        again = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
        assert (again["messages"], again["budget"], again["usage"]["tokens"]) == \
            (before["messages"], before["budget"], before["usage"]["tokens"])


async def test_fixed_breakpoints_are_those_an_appended_prompt_keeps(db_path):
    from sidecar.services.prompt import cache_breakpoints  # the rule the proxy's requests sent ahead follow

    settings = settings_for(db_path, contextWindow=16_384, compaction={"reserveTokens": 4096, "auto": False})
    async with running_sidecar(settings=settings) as client:
        await ingest(client, "s", [{"id": "sys", "role": "system", "content": "You are careful."}])
        for turn in range(20):
            await ingest(client, "s", step(turn, 1200))
        assert (await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s", "mode": "full"}))["compacted"]
        first = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "overheadTokens": OVERHEAD})
        kinds = [item["kind"] for item in first["items"]]
        assert "summary" in kinds
        assert first["fixedBreakpoints"] == [0, len(kinds) - kinds[::-1].index("summary") - 1], "the leading block"
        await ingest(client, "s", step(20, 100))
        delta = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "overheadTokens": OVERHEAD,
                                                              "since": first["revision"]})
        assert delta["delta"] is True and delta["keep"] == len(first["messages"])
        total = delta["keep"] + len(delta["messages"])
        assert delta["cacheBreakpoints"] == cache_breakpoints(first["fixedBreakpoints"], delta["keep"], total)
