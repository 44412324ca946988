"""Pruning old tool outputs, provider-reported usage, calibration, model windows and usage states."""

from __future__ import annotations

import asyncio

import pytest
from lsprotocol import types as lsp

from protocol import methods
from tests.conftest import call, ingest, running_sidecar, settings_for
from tests.helpers.openai_checks import assert_valid_openai_sequence

PROTECT = 300


def tool_rounds(count: int, size: int = 400, tool: str = "read", prefix: str = "") -> list[dict]:
    """A user message, then ``count`` assistant tool calls each answered by an output of ``size`` bytes."""
    messages: list[dict] = [{"id": f"{prefix}u", "role": "user", "content": "look at the files"}]
    for i in range(count):
        name = tool(i) if callable(tool) else tool
        messages.append({"id": f"{prefix}a{i}", "role": "assistant", "content": None, "tool_calls": [
            {"id": f"{prefix}c{i}", "type": "function", "function": {"name": name, "arguments": "{}"}}]})
        messages.append({"id": f"{prefix}t{i}", "role": "tool", "tool_call_id": f"{prefix}c{i}",
                         "content": f"output {i} " + "x" * size})
    return messages


def expected_candidates(items: list[dict], protect: int, protected_ids: set[str] = frozenset()) -> list[dict]:
    """The spec's rule, from the unpruned items: tool outputs older than the newest ``protect`` tokens."""
    newer = 0
    found = []
    for item in reversed(items):
        if newer >= protect and item["id"].startswith("t") and item["id"] not in protected_ids:
            found.append(item)
        newer += item["tokens"]
    return found


async def assembled(client, session="s", **params):
    return await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": session, **params})


async def unpruned_items(db_path, messages):
    async with running_sidecar(settings=settings_for(db_path, compaction={"auto": False})) as client:
        await ingest(client, "s", messages)
        return (await assembled(client, prune=False))["items"]


@pytest.mark.parametrize("over", [False, True])
async def test_pruning_starts_just_over_minimum_tokens(tmp_path, over):
    messages = tool_rounds(12)
    items = await unpruned_items(tmp_path / "probe.duckdb", messages)
    candidates = expected_candidates(items, PROTECT)
    total = sum(item["tokens"] for item in candidates)
    minimum = total - 1 if over else total  # pruned only when the candidates together exceed minimumTokens
    settings = settings_for(tmp_path / "db.duckdb", compaction={"auto": False},
                            prune={"protectTokens": PROTECT, "minimumTokens": minimum})
    async with running_sidecar(settings=settings) as client:
        await ingest(client, "s", messages)
        result = await assembled(client)
        pruned = [i["id"] for i in result["items"] if i.get("pruned")]
        assert sorted(pruned) == (sorted(i["id"] for i in candidates) if over else [])
        assert_valid_openai_sequence(result["messages"])
        usage = await call(client, methods.CONTEXT_USAGE, {"sessionId": "s"})
        assert usage["tokens"] == result["tokens"], "usage counts the context as assembled, pruned"
        if over:
            by_id = dict(zip([i["id"] for i in result["items"]], result["messages"], strict=True))
            assert by_id[pruned[0]]["content"] == f"[Old tool result content cleared] (id {pruned[0]})"
            assert result["tokens"] < sum(i["tokens"] for i in items)


async def test_the_protected_window_and_protected_tools_are_never_pruned(tmp_path):
    messages = tool_rounds(12, tool=lambda i: "skill" if i % 3 == 0 else "read")
    settings = settings_for(tmp_path / "db.duckdb", compaction={"auto": False},
                            prune={"protectTokens": PROTECT, "minimumTokens": 10})
    async with running_sidecar(settings=settings) as client:
        await ingest(client, "s", messages)
        items = (await assembled(client, prune=False))["items"]
        result = await assembled(client)
        pruned = {i["id"] for i in result["items"] if i.get("pruned")}
        skill_outputs = {f"t{i}" for i in range(12) if i % 3 == 0}
        expected = {i["id"] for i in expected_candidates(items, PROTECT, skill_outputs)}
        assert pruned == expected and pruned
        assert not pruned & skill_outputs
        newest = [i["id"] for i in items][-2:]
        assert not pruned & set(newest)
        original = await call(client, methods.MEMORY_EXPAND, {"sessionId": "s", "id": sorted(pruned)[0]})
        assert original["items"][0]["message"]["content"].startswith("output ")
        assert (await assembled(client, prune=False))["items"] == items  # nothing stored was changed


async def test_prune_false_and_prune_disabled(tmp_path):
    settings = settings_for(tmp_path / "db.duckdb", compaction={"auto": False},
                            prune={"enabled": False, "protectTokens": PROTECT, "minimumTokens": 10})
    async with running_sidecar(settings=settings) as client:
        await ingest(client, "s", tool_rounds(12))
        assert not any(i.get("pruned") for i in (await assembled(client))["items"])
        assert any(i.get("pruned") for i in (await assembled(client, prune=True))["items"])
        assert not any(i.get("pruned") for i in (await assembled(client, prune=False))["items"])


async def test_summaries_are_never_pruned(tmp_path):
    settings = settings_for(tmp_path / "db.duckdb", compaction={"auto": False, "freshTail": 6},
                            prune={"protectTokens": 50, "minimumTokens": 10})
    async with running_sidecar(settings=settings) as client:
        await ingest(client, "s", tool_rounds(30))
        assert (await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s"}))["compacted"]
        result = await assembled(client)
        summaries = [i for i in result["items"] if i["kind"] == "summary"]
        assert summaries and not any(i.get("pruned") for i in summaries)
        assert_valid_openai_sequence(result["messages"])


async def test_reported_usage_overrides_until_the_next_change(tmp_path):
    async with running_sidecar(settings=settings_for(tmp_path / "db.duckdb", compaction={"auto": False})) as client:
        first = await ingest(client, "s", tool_rounds(3), contextWindow=100_000)
        assert first["usage"]["source"] == "estimate"
        waiter = client.protocol.wait_for_notification_async(methods.CONTEXT_DID_CHANGE_USAGE)
        client.protocol.notify(methods.CONTEXT_REPORT_USAGE, {"sessionId": "s", "inputTokens": 5000,
                                                             "outputTokens": 100, "cacheReadTokens": 1000,
                                                             "cacheWriteTokens": 50})
        reported = await asyncio.wait_for(waiter, 10)
        # input + cacheRead + cacheWrite + output: cache writes are prompt tokens too
        assert reported["source"] == "provider" and reported["tokens"] == 6150
        usage = await call(client, methods.CONTEXT_USAGE, {"sessionId": "s"})
        assert usage["source"] == "provider" and usage["tokens"] == 6150
        after = await ingest(client, "s", [{"role": "user", "content": "next"}])
        assert after["usage"]["source"] == "estimate"


async def test_reported_usage_over_the_window_is_overflow(tmp_path):
    async with running_sidecar(settings=settings_for(tmp_path / "db.duckdb", compaction={"auto": False})) as client:
        await ingest(client, "s", tool_rounds(2), contextWindow=10_000)
        waiter = client.protocol.wait_for_notification_async(methods.CONTEXT_DID_CHANGE_USAGE)
        client.protocol.notify(methods.CONTEXT_REPORT_USAGE,
                               {"sessionId": "s", "inputTokens": 9000, "outputTokens": 1500})
        usage = await asyncio.wait_for(waiter, 10)
        assert usage["state"] == "overflow" and "/compact" in usage["hint"]


@pytest.mark.parametrize("params", [
    {"sessionId": "s", "inputTokens": -5, "outputTokens": 10},
    {"sessionId": "s", "inputTokens": 10, "outputTokens": 10, "cacheReadTokens": -1},
    {"sessionId": "s", "inputTokens": "many", "outputTokens": 10},
    {"sessionId": "s", "inputTokens": 10},
    {"sessionId": "nope", "inputTokens": 10, "outputTokens": 10},
])
async def test_bad_reports_are_ignored_and_change_nothing(tmp_path, params):
    async with running_sidecar(settings=settings_for(tmp_path / "db.duckdb", compaction={"auto": False})) as client:
        await ingest(client, "s", tool_rounds(2))
        before = await call(client, methods.CONTEXT_USAGE, {"sessionId": "s"})
        events = len(client.usage_events)
        client.protocol.notify(methods.CONTEXT_REPORT_USAGE, params)
        after = await call(client, methods.CONTEXT_USAGE, {"sessionId": "s"})  # answered after the notification
        assert after == before
        assert len(client.usage_events) == events
        assert (await call(client, methods.MEMORY_SESSIONS, {}))["sessions"][0]["messages"] == 5


async def test_calibration_converges_on_the_providers_counts(tmp_path):
    factor = 1.6
    async with running_sidecar(settings=settings_for(tmp_path / "db.duckdb", compaction={"auto": False})) as client:
        await ingest(client, "s", tool_rounds(20), contextWindow=200_000)
        raw = (await assembled(client))["tokens"]
        for turn in range(8):
            result = await assembled(client)
            prompt = round(result["tokens"] / result["usage"]["calibration"] * factor)
            client.protocol.notify(methods.CONTEXT_REPORT_USAGE,
                                   {"sessionId": "s", "inputTokens": prompt, "outputTokens": 0})
            await ingest(client, "s", [{"id": f"n{turn}", "role": "user", "content": "continue"}])
        usage = await call(client, methods.CONTEXT_USAGE, {"sessionId": "s"})
        assert usage["calibration"] == pytest.approx(factor, rel=0.02)
        assert usage["source"] == "estimate"
        calibrated = (await assembled(client))["tokens"]
        assert calibrated == pytest.approx((raw + 8 * 6) * factor, rel=0.03)


async def test_a_fixed_prompt_overhead_is_an_offset_not_a_ratio(tmp_path):
    overhead = 20_000  # what a coding agent's system prompt and tool definitions add to every call
    async with running_sidecar(settings=settings_for(tmp_path / "db.duckdb", compaction={"auto": False})) as client:
        await ingest(client, "s", tool_rounds(2), contextWindow=200_000)
        for turn in range(10):
            result = await assembled(client)
            prompt = overhead + round(result["tokens"] / result["usage"]["calibration"])
            client.protocol.notify(methods.CONTEXT_REPORT_USAGE,
                                   {"sessionId": "s", "inputTokens": prompt, "outputTokens": 0})
            await ingest(client, "s", tool_rounds(4, size=800, prefix=f"r{turn}")[1:])
        usage = await call(client, methods.CONTEXT_USAGE, {"sessionId": "s"})
        assert usage["calibration"] == pytest.approx(1.0, abs=0.1)  # a plain ratio would sit at its 4.0 cap


async def test_zero_provider_usage_is_ignored(tmp_path):
    async with running_sidecar(settings=settings_for(tmp_path / "db.duckdb", compaction={"auto": False})) as client:
        await ingest(client, "s", tool_rounds(5))
        before = await call(client, methods.CONTEXT_USAGE, {"sessionId": "s"})
        client.protocol.notify(methods.CONTEXT_REPORT_USAGE, {"sessionId": "s", "inputTokens": 0, "outputTokens": 0,
                                                              "cacheReadTokens": 0, "cacheWriteTokens": 0})
        after = await call(client, methods.CONTEXT_USAGE, {"sessionId": "s"})  # answered after the notification
        assert after == before and after["source"] == "estimate" and after["tokens"] > 0


@pytest.mark.parametrize(("model", "window"), [
    ("gpt-4o", 128_000),
    ("claude-sonnet-4-5", 200_000),
    ("anthropic/claude-sonnet-4-5-20250929", 200_000),
    ("gpt-4.1-mini-2025-04-14", 1_047_576),
    ("my-local-model", 50_000),
    ("custom-coder", 32_768),
    ("gpt-4o-mini", 64_000),
])
async def test_model_context_windows_and_overrides(tmp_path, model, window):
    models = {"custom-coder": {"contextWindow": 32_768}, "gpt-4o-mini": {"contextWindow": 64_000}}
    settings = settings_for(tmp_path / "db.duckdb", contextWindow=50_000, models=models)
    async with running_sidecar(settings=settings) as client:
        result = await ingest(client, "s", [{"role": "user", "content": "hi"}], model=model)
        assert result["usage"]["contextWindow"] == window
        explicit = await ingest(client, "t", [{"role": "user", "content": "hi"}], model=model, contextWindow=9000)
        assert explicit["usage"]["contextWindow"] == 9000


async def test_every_state_transition_is_notified(tmp_path):
    settings = settings_for(tmp_path / "db.duckdb", compaction={"auto": False, "freshTail": 2})
    async with running_sidecar(settings=settings) as client:
        await ingest(client, "s", [{"role": "user", "content": "x" * 400}], contextWindow=40_000)
        for i in range(19):  # ~2,250 tokens each: ok up to 28k, suggest, compact from 30k, overflow past 40k
            await ingest(client, "s", [{"role": "user", "content": f"{i} " + "y" * 9_000}])
        states = [u["state"] for u in client.usage_events]
        assert states[0] == "ok" and "suggest" in states and "compact" in states and states[-1] == "overflow"
        assert states.index("suggest") < states.index("compact") < states.index("overflow")
        hints = {u["state"]: u.get("hint") for u in client.usage_events}
        assert hints["ok"] is None and all("/compact" in hints[s] for s in ("suggest", "compact", "overflow"))
        client.usage_events.clear()
        result = await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s", "mode": "full"})
        assert result["compacted"]
        states = [u["state"] for u in client.usage_events]
        assert "compacting" in states and states[-1] != "compacting"
        assert client.usage_events[states.index("compacting")]["hint"]


async def test_settings_change_of_protected_tools_recounts(tmp_path):
    settings = settings_for(tmp_path / "db.duckdb", compaction={"auto": False},
                            prune={"protectTokens": PROTECT, "minimumTokens": 10})
    async with running_sidecar(settings=settings) as client:
        await ingest(client, "s", tool_rounds(12))
        assert any(i.get("pruned") for i in (await assembled(client))["items"])
        pushed = len(client.usage_events)
        client.protocol.notify(lsp.WORKSPACE_DID_CHANGE_CONFIGURATION, lsp.DidChangeConfigurationParams(settings={
            "contextSidecar": {**settings, "prune": {**settings["prune"], "protectedTools": ["read"]}}}))
        while len(client.usage_events) == pushed:  # a settings change pushes every touched session's usage
            await asyncio.sleep(0.02)
        result = await assembled(client)
        assert not any(i.get("pruned") for i in result["items"])
        usage = await call(client, methods.CONTEXT_USAGE, {"sessionId": "s"})
        assert usage["tokens"] == result["tokens"]
