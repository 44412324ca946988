"""Issue 12: a prompt prefix that changes only at rewrites, deltas, cache breakpoints and cache hit rates."""

from __future__ import annotations

import asyncio
import json

import pytest
from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcInvalidParams

from protocol import methods
from tests.conftest import call, ingest, running_sidecar, settings_for
from tests.helpers.openai_checks import assert_valid_openai_sequence

PROTECT = 2000
MINIMUM = 3000
OUTPUT = "x" * 4000  # about 1,000 tokens per tool output


def turn(number: int) -> tuple[list[dict], list[dict]]:
    """A turn: the user's message, then an assistant call answered by a large tool output."""
    opening = [{"id": f"u{number}", "role": "user", "content": f"step {number}: read the next file"}]
    rest = [{"id": f"a{number}", "role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{number}", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
            {"id": f"t{number}", "role": "tool", "tool_call_id": f"c{number}", "content": f"{number} {OUTPUT}"}]
    return opening, rest


def encoded(messages: list[dict]) -> list[str]:
    """Messages as the bytes a provider would see."""
    return [json.dumps(message, sort_keys=True) for message in messages]


class Prompt:
    """What a client that keeps its previous prompt holds, applying delta replies to it."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.items: list[dict] = []
        self.revision: str | None = None

    def apply(self, reply: dict) -> None:
        if reply.get("delta"):
            assert reply["keep"] <= len(self.messages)
            self.messages = self.messages[:reply["keep"]] + reply["messages"]
            self.items = self.items[:reply["keep"]] + reply["items"]
        else:
            self.messages, self.items = reply["messages"], reply["items"]
        self.revision = reply["revision"]


def settings(db, **compaction) -> dict:
    return settings_for(db, compaction={"auto": False, **compaction},
                        prune={"protectTokens": PROTECT, "minimumTokens": MINIMUM})


async def test_append_only_turns_keep_a_byte_identical_prefix_and_prune_in_steps(tmp_path):
    async with running_sidecar(settings=settings(tmp_path / "db.duckdb")) as client:
        kept = Prompt()
        previous: list[str] = []
        pruned_ever: set[str] = set()
        steps = 0
        sent: dict[str, dict] = {}
        for number in range(40):
            opening, rest = turn(number)
            sent.update({m["id"]: {k: v for k, v in m.items() if k != "id"} for m in opening + rest})
            ingested = await ingest(client, "s", opening)
            events = len(client.prune_events)
            params = {"sessionId": "s"} if kept.revision is None else {"sessionId": "s", "since": kept.revision}
            reply = await call(client, methods.CONTEXT_ASSEMBLE, params)
            kept.apply(reply)
            full = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
            assert kept.messages == full["messages"] and kept.items == full["items"], "delta + kept == full reply"
            kept.revision = full["revision"]  # the session's previous assemble now, with the same prompt
            assert full["stablePrefix"] == len(full["messages"]), "nothing changed between the two calls"
            assert ingested["usage"]["tokens"] == full["tokens"], "usage counts what assemble then returns"
            assert_valid_openai_sequence(full["messages"])
            for item, message in zip(full["items"], full["messages"], strict=True):
                assert item.get("pruned") or message == sent[item["id"]], "each message is the one ingested"
            now = encoded(full["messages"])
            pruned = {item["id"] for item in full["items"] if item.get("pruned")}
            assert pruned_ever <= pruned, "an output once pruned stays pruned"
            if len(client.prune_events) > events:  # a prune step: the one rewrite allowed
                steps += 1
                event = client.prune_events[-1]
                assert set(event["ids"]) == pruned - pruned_ever and event["ids"]
                assert reply["delta"] is False and reply["stablePrefix"] < len(previous)
                assert event["tokensSaved"] > 0 and 0 < event["tokensRewritten"] <= full["tokens"]
            else:
                assert now[:len(previous)] == previous, f"turn {number}: the previous prompt is a prefix"
                assert reply["stablePrefix"] == len(previous)
                if number:
                    assert reply["delta"] is True and reply["keep"] == len(previous)
            pruned_ever = pruned
            previous = now
            await ingest(client, "s", rest)
        assert 2 <= steps <= 40 * 1000 // MINIMUM, "steps, not one rewrite per turn"
        unpruned = {item["id"]: item["tokens"] for item in
                    (await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "prune": False}))["items"]}
        for event in client.prune_events:
            assert sum(unpruned[i] for i in event["ids"]) > MINIMUM, "each step clears more than minimumTokens"


async def test_a_compaction_takes_pending_pruning_along_and_since_then_gets_a_full_reply(tmp_path):
    config = settings_for(tmp_path / "db.duckdb", compaction={"auto": False, "freshTail": 8, "leafChunkSize": 3,
                                                              "minSavings": 0},
                          prune={"protectTokens": PROTECT, "minimumTokens": 100_000})
    async with running_sidecar(settings=config) as client:
        for number in range(8):  # far under minimumTokens of prunable output: no prune step on its own
            opening, rest = turn(number)
            await ingest(client, "s", opening + rest)
        first = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
        assert not any(item.get("pruned") for item in first["items"]) and not client.prune_events
        compacted = await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s"})
        assert compacted["compacted"], compacted["reason"]
        event = client.compact_events[-1]
        assert 0 < event["tokensRewritten"] <= event["tokensAfter"]
        reply = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "since": first["revision"]})
        assert reply["delta"] is False and "keep" not in reply
        assert reply["messages"] == (await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"}))["messages"]
        assert reply["items"][0]["kind"] == "summary"
        # The pending outputs older than the protected window went with the compaction's rewrite, not later.
        pruned = [item["id"] for item in reply["items"] if item.get("pruned")]
        assert pruned and not client.prune_events
        assert event["tokensAfter"] == reply["tokens"]


async def test_since_a_revision_not_the_last_one_gets_a_full_reply(tmp_path):
    async with running_sidecar(settings=settings(tmp_path / "db.duckdb")) as client:
        await ingest(client, "s", [{"role": "user", "content": "one"}])
        first = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
        second = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
        assert first["revision"] != second["revision"]
        for since in (first["revision"], "no-such-revision", ""):
            reply = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "since": since})
            assert reply["delta"] is False and reply["messages"] == second["messages"]
        same = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "since": reply["revision"]})
        assert same["delta"] is True and same["keep"] == 1 and same["messages"] == [] and same["stablePrefix"] == 1
        other = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "since": same["revision"],
                                                              "budget": 10})
        assert other["delta"] is False and other["stablePrefix"] == 1, "another budget is another fill: a rewrite"
        no_since = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
        assert "delta" not in no_since and "keep" not in no_since


@pytest.mark.parametrize("since", [5, True, ["r"], {"r": 1}])
async def test_since_of_the_wrong_type_is_invalid_params(tmp_path, since):
    async with running_sidecar(settings=settings(tmp_path / "db.duckdb")) as client:
        await ingest(client, "s", [{"role": "user", "content": "one"}])
        before = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
        with pytest.raises(JsonRpcInvalidParams) as raised:
            await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "since": since})
        assert raised.value.data == {"field": "since"}
        after = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "since": before["revision"]})
        assert after["delta"] is True and after["messages"] == [], "the failed call changed nothing"


async def test_stable_prefix_and_cache_breakpoints(tmp_path):
    config = settings_for(tmp_path / "db.duckdb", compaction={"auto": False, "freshTail": 4, "minSavings": 0},
                          prune={"enabled": False})
    async with running_sidecar(settings=config) as client:
        await ingest(client, "s", [{"role": "system", "content": "You are a coding agent."},
                                   {"role": "system", "content": "Project rules."}])
        first = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
        assert first["stablePrefix"] == 0 and first["cacheBreakpoints"] == [1]
        await ingest(client, "s", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
        second = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
        assert second["stablePrefix"] == 2 and second["cacheBreakpoints"] == [1, 3]
        for number in range(12):
            opening, rest = turn(number)
            await ingest(client, "s", opening + rest)
        assert (await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s", "mode": "full"}))["compacted"]
        compacted = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
        kinds = [item["kind"] for item in compacted["items"]]
        # System messages are never compacted: they still lead, the summaries right after them.
        assert [m["role"] for m in compacted["messages"][:2]] == ["system", "system"] and kinds[2] == "summary"
        leading = next(i for i, kind in enumerate(kinds) if i >= 2 and kind != "summary")
        assert compacted["stablePrefix"] == 2  # the summary replaced what followed the system messages
        assert compacted["cacheBreakpoints"] == [1, leading - 1, len(kinds) - 1]
        await ingest(client, "s", [{"role": "user", "content": "more"}])
        grown = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
        n = len(compacted["messages"])
        assert grown["stablePrefix"] == n
        assert grown["cacheBreakpoints"] == [1, leading - 1, n - 1, n]
        assert len(grown["cacheBreakpoints"]) <= 4


async def test_a_fill_over_budget_drops_a_share_then_only_appends(tmp_path):
    async with running_sidecar(settings=settings_for(tmp_path / "db.duckdb", compaction={"auto": False},
                                                     prune={"enabled": False})) as client:
        budget = 3000
        previous: list[str] = []
        moves = 0
        kept = Prompt()
        for number in range(60):
            await ingest(client, "s", [{"id": f"m{number}", "role": "user" if number % 2 else "assistant",
                                        "content": f"{number} " + "y" * 400}])
            params = {"sessionId": "s", "budget": budget, "freshTail": 2}
            kept.apply(await call(client, methods.CONTEXT_ASSEMBLE, {**params, "since": kept.revision or "none"}))
            reply = await call(client, methods.CONTEXT_ASSEMBLE, params)
            assert (kept.messages, kept.items) == (reply["messages"], reply["items"])
            kept.revision = reply["revision"]
            assert reply["tokens"] <= budget
            now = encoded(reply["messages"])
            if now[:len(previous)] != previous:
                moves += 1
                assert reply["tokens"] <= budget * 0.8, "a move frees a fifth of the budget"
            previous = now
        assert 1 <= moves <= 60 // 5, "the first item moves in steps, not every turn"


async def test_a_compaction_saving_less_than_min_savings_is_skipped(tmp_path):
    messages = [{"role": "user", "content": f"ok {i} " + "w" * 800} for i in range(12)]
    messages += [{"role": "user" if i % 2 else "assistant", "content": f"{i} " + "z" * 4000} for i in range(20)]
    for min_savings, compacted in ((0.10, False), (0.0, True)):
        db = tmp_path / f"{min_savings}.duckdb"
        async with running_sidecar(settings=settings(db, freshTail=20, minSavings=min_savings)) as client:
            await ingest(client, "s", messages)
            before = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
            result = await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s"})
            assert result["compacted"] is compacted
            if not compacted:
                assert "compaction.minSavings" in result["reason"] and result["tokensAfter"] == result["tokensBefore"]
                after = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "since": before["revision"]})
                assert after["delta"] is True and after["messages"] == [], "nothing was rewritten"
                assert not client.compact_events


async def test_min_savings_out_of_range_is_reported_and_defaulted(tmp_path):
    async with running_sidecar(settings=settings(tmp_path / "db.duckdb", minSavings=1.5)) as client:
        deadline = asyncio.get_running_loop().time() + 10
        while not any("compaction.minSavings" in m.message for m in client.messages):
            assert asyncio.get_running_loop().time() < deadline, "no window/showMessage about minSavings"
            await asyncio.sleep(0.02)
        shown = " ".join(m.message for m in client.messages)
        assert "0.1" in shown.split("compaction.minSavings", 1)[1]


async def test_cache_hit_rate_from_reported_usage(tmp_path):
    async with running_sidecar(settings=settings(tmp_path / "db.duckdb")) as client:
        first = await ingest(client, "s", [{"role": "user", "content": "hi"}])
        assert first["usage"].get("cacheHitRate") is None and first["usage"].get("cacheHitRateSmoothed") is None
        reports = [({"inputTokens": 500, "cacheReadTokens": 3000, "cacheWriteTokens": 500}, 0.75, 0.75),
                   ({"inputTokens": 4000}, 0.0, 0.525)]
        for report, last, smoothed in reports:
            waiter = client.protocol.wait_for_notification_async(methods.CONTEXT_DID_CHANGE_USAGE)
            client.protocol.notify(methods.CONTEXT_REPORT_USAGE, {"sessionId": "s", "outputTokens": 10, **report})
            pushed = await asyncio.wait_for(waiter, 10)
            assert pushed["cacheHitRate"] == pytest.approx(last)
            assert pushed["cacheHitRateSmoothed"] == pytest.approx(smoothed)
            usage = await call(client, methods.CONTEXT_USAGE, {"sessionId": "s"})
            assert (usage["cacheHitRate"], usage["cacheHitRateSmoothed"]) == \
                (pushed["cacheHitRate"], pushed["cacheHitRateSmoothed"])
        client.protocol.notify(methods.CONTEXT_REPORT_USAGE, {"sessionId": "s", "inputTokens": -1, "outputTokens": 1,
                                                             "cacheReadTokens": 5})
        usage = await call(client, methods.CONTEXT_USAGE, {"sessionId": "s"})
        assert usage["cacheHitRate"] == 0.0, "a rejected report changes nothing"
        await call(client, methods.MEMORY_DELETE_SESSION, {"sessionId": "s"})
        again = await ingest(client, "s", [{"role": "user", "content": "hi"}])
        assert again["usage"].get("cacheHitRate") is None


async def test_a_settings_change_of_protected_tools_is_a_rewrite_and_pruning_resumes(tmp_path):
    config = settings(tmp_path / "db.duckdb")
    async with running_sidecar(settings=config) as client:
        for number in range(12):
            opening, rest = turn(number)
            await ingest(client, "s", opening + rest)
        before = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
        assert any(item.get("pruned") for item in before["items"])
        waiter = client.protocol.wait_for_notification_async(methods.CONTEXT_DID_CHANGE_USAGE)
        client.protocol.notify(lsp.WORKSPACE_DID_CHANGE_CONFIGURATION, lsp.DidChangeConfigurationParams(settings={
            "contextSidecar": {**config, "prune": {**config["prune"], "protectedTools": ["read"]}}}))
        await asyncio.wait_for(waiter, 10)  # a settings change pushes every touched session's usage
        after = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "since": before["revision"]})
        assert after["delta"] is False and not any(item.get("pruned") for item in after["items"])
        usage = await call(client, methods.CONTEXT_USAGE, {"sessionId": "s"})
        assert usage["tokens"] == after["tokens"]


async def test_deltas_survive_usage_reports_that_change_the_calibration(tmp_path):
    async with running_sidecar(settings=settings(tmp_path / "db.duckdb")) as client:
        kept = Prompt()
        for number in range(12):
            opening, rest = turn(number)
            await ingest(client, "s", opening)
            reply = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "since": kept.revision or "-"})
            kept.apply(reply)
            full = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
            assert (kept.messages, reply["tokens"]) == (full["messages"], full["tokens"])
            # Kept items keep the token figures they were sent with; a report since rescales the new ones only.
            assert [(i["id"], i.get("pruned")) for i in kept.items] == \
                [(i["id"], i.get("pruned")) for i in full["items"]]
            if number and not client.prune_events:
                assert reply["delta"] is True
            kept.revision = full["revision"]
            await ingest(client, "s", rest)
            waiter = client.protocol.wait_for_notification_async(methods.CONTEXT_DID_CHANGE_USAGE)
            client.protocol.notify(methods.CONTEXT_REPORT_USAGE, {"sessionId": "s", "outputTokens": 5,
                                                                 "inputTokens": full["tokens"] * (1 + number % 3)})
            assert (await asyncio.wait_for(waiter, 10))["calibration"] != 1.0


async def test_pinned_outputs_stay_whole_behind_the_frontier_and_a_pin_is_a_rewrite(tmp_path):
    async with running_sidecar(settings=settings(tmp_path / "db.duckdb")) as client:
        await ingest(client, "s", [{"id": "sys", "role": "system", "content": "You are terse."}])
        for number in range(12):
            opening, rest = turn(number)
            if number == 1:
                rest[1]["pinned"] = True
            await ingest(client, "s", opening + rest)
            await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})  # prune steps happen at assembles
        assert client.prune_events and all("t1" not in event["ids"] for event in client.prune_events)
        first = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
        assert first["items"][0]["id"] == "sys" and first["cacheBreakpoints"][0] == 0
        items = {item["id"]: item for item in first["items"]}
        assert not items["t1"].get("pruned") and items["t2"].get("pruned"), "pinned stays whole behind the frontier"
        usage = await call(client, methods.CONTEXT_USAGE, {"sessionId": "s"})
        assert usage["tokens"] == first["tokens"], "usage counts the pinned output whole too"

        pinned = await call(client, methods.MEMORY_PIN, {"sessionId": "s", "ids": ["t2"], "pinned": True})
        assert pinned["ids"] == ["t2"]
        reply = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "since": first["revision"]})
        assert reply["delta"] is False, "a pin is a rewrite: the whole prompt comes back"
        assert not {item["id"]: item for item in reply["items"]}["t2"].get("pruned")
        assert reply["tokens"] == pinned["usage"]["tokens"]

        await call(client, methods.MEMORY_PIN, {"sessionId": "s", "ids": ["t2"], "pinned": False})
        again = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "since": reply["revision"]})
        assert again["delta"] is False
        assert {item["id"]: item for item in again["items"]}["t2"].get("pruned"), "unpinned behind the frontier"
