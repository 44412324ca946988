"""Pruning pays its way: pruned outputs count whole toward compaction, and a step is taken only when it pays back."""

from __future__ import annotations

import pytest

from protocol import methods
from sidecar.config.settings import read_settings
from tests.conftest import call, ingest, running_sidecar, settings_for
from tests.test_auto_compaction import wait_until
from tests.test_pruning_usage import PROTECT, assembled, tool_rounds, unpruned_items

WINDOW = 100_000
FREE = {"cacheReadPrice": 1, "cacheWritePrice": 1}
"""A provider without prompt caching: every token costs the same, so every prune step pays."""


async def whole_and_pruned(tmp_path, messages) -> tuple[int, int]:
    """The context's tokens unpruned, and what pruning (protect PROTECT, no auto-compaction) takes off them."""
    items = await unpruned_items(tmp_path / "probe.duckdb", messages)
    whole = sum(item["tokens"] for item in items)
    settings = settings_for(tmp_path / "probe-pruned.duckdb", compaction={"auto": False},
                            prune={"protectTokens": PROTECT, "minimumTokens": 10})
    async with running_sidecar(settings=settings) as client:
        await ingest(client, "s", messages)
        result = await assembled(client)
    assert any(item.get("pruned") for item in result["items"])
    return whole, whole - result["tokens"]


@pytest.mark.parametrize("postpone", [False, True])
async def test_pruned_outputs_count_whole_toward_the_compaction_threshold(tmp_path, postpone):
    messages = tool_rounds(12)
    whole, saved = await whole_and_pruned(tmp_path, messages)
    settings = settings_for(tmp_path / "db.duckdb", contextWindow=WINDOW,
                            compaction={"auto": False, "maxTokens": whole - 1},
                            prune={"protectTokens": PROTECT, "minimumTokens": 10, "postponeCompaction": postpone})
    async with running_sidecar(settings=settings) as client:
        await ingest(client, "s", messages)
        result = await assembled(client)
        usage = await call(client, methods.CONTEXT_USAGE, {"sessionId": "s"})
    assert result["tokens"] == usage["tokens"] == whole - saved, "usage is the prompt as sent, pruned"
    if postpone:
        assert usage["threshold"] == whole - 1 and usage["state"] == "ok"
    else:
        # The threshold comes down by what pruning saves: over it exactly when the unpruned context is.
        assert usage["threshold"] == whole - 1 - saved and usage["state"] == "compact"
        assert "over the compaction threshold" in usage["hint"]


async def test_auto_compaction_comes_when_it_would_without_pruning(tmp_path):
    messages = tool_rounds(12)
    whole, _ = await whole_and_pruned(tmp_path, messages)
    settings = settings_for(tmp_path / "db.duckdb", contextWindow=WINDOW,
                            compaction={"auto": True, "maxTokens": whole - 1, "freshTail": 4},
                            prune={"protectTokens": PROTECT, "minimumTokens": 10, **FREE})
    async with running_sidecar(settings=settings) as client:
        reply = await ingest(client, "s", messages)
        assert reply["usage"]["tokens"] < whole - 1, "the pruned prompt alone is under maxTokens"
        await wait_until(lambda: client.compact_events)
    event = client.compact_events[0]
    assert event["trigger"] == "auto" and event["tokensAfter"] < event["tokensBefore"]


async def test_with_postpone_compaction_the_pruned_prompt_stays_under_the_threshold(tmp_path):
    messages = tool_rounds(12)
    whole, saved = await whole_and_pruned(tmp_path, messages)
    settings = settings_for(tmp_path / "db.duckdb", contextWindow=WINDOW,
                            compaction={"auto": True, "maxTokens": whole - 1, "freshTail": 4},
                            prune={"protectTokens": PROTECT, "minimumTokens": 10, "postponeCompaction": True, **FREE})
    async with running_sidecar(settings=settings) as client:
        reply = await ingest(client, "s", messages)
        usage = await call(client, methods.CONTEXT_USAGE, {"sessionId": "s"})
        result = await assembled(client)
    # Auto-compaction starts from these very figures: under the threshold, nothing starts.
    assert reply["usage"]["state"] == usage["state"] == "ok" and usage["tokens"] < usage["threshold"] == whole - 1
    assert result["tokens"] == whole - saved and not any(item["kind"] == "summary" for item in result["items"])


@pytest.mark.parametrize(("headroom", "prices", "taken"), [
    (1_000, {}, False),  # compaction is a prompt or so away: the rewrite would never pay back
    (80_000, {}, True),  # hundreds of prompts before compaction: the savings add up
    (1_000, FREE, True),  # no cache to lose
    (1_000, {"cacheReadPrice": 0.1, "cacheWritePrice": 0.1}, True),  # writing costs no more than reading
])
async def test_a_prune_step_is_taken_only_when_it_pays_back_before_compaction(tmp_path, headroom, prices, taken):
    messages = tool_rounds(12)
    whole, saved = await whole_and_pruned(tmp_path, messages)
    settings = settings_for(tmp_path / "db.duckdb", contextWindow=200_000,
                            compaction={"auto": True, "maxTokens": whole + headroom},
                            prune={"protectTokens": PROTECT, "minimumTokens": 10, **prices})
    async with running_sidecar(settings=settings) as client:
        await ingest(client, "s", messages)
        result = await assembled(client)
        again = await assembled(client)
        usage = await call(client, methods.CONTEXT_USAGE, {"sessionId": "s"})
    pruned = [item["id"] for item in result["items"] if item.get("pruned")]
    assert bool(pruned) == taken
    assert bool(client.prune_events) == taken, "context/didPrune is sent for a step taken, and only then"
    assert result["tokens"] == usage["tokens"] == (whole - saved if taken else whole)
    assert again["stablePrefix"] == len(again["messages"]), "a declined step is not taken on the next call either"
    assert client.compact_events == []


async def test_when_the_unpruned_context_no_longer_fits_a_step_is_taken_whatever_it_costs(tmp_path):
    messages = tool_rounds(12)
    whole, saved = await whole_and_pruned(tmp_path, messages)
    # The default budget (window - reserve) is under the whole context: compaction is over due but has nothing it
    # may compact (every message is in the fresh tail), so pruning is what keeps old messages in the prompt.
    settings = settings_for(tmp_path / "db.duckdb", contextWindow=whole + 500,
                            compaction={"auto": True, "maxTokens": 0, "reserveTokens": 1000, "freshTail": 100},
                            prune={"protectTokens": PROTECT, "minimumTokens": 10})
    async with running_sidecar(settings=settings) as client:
        await ingest(client, "s", messages)
        result = await assembled(client)
    assert any(item.get("pruned") for item in result["items"])
    assert result["tokens"] == whole - saved and result["dropped"] == 0 and not result["overBudget"]


def test_cache_prices_out_of_range_or_not_numbers_fall_back_to_their_defaults() -> None:
    settings, problems = read_settings({"prune": {"cacheReadPrice": -0.1, "cacheWritePrice": "high",
                                                  "postponeCompaction": "yes"}})
    assert settings.prune.cache_read_price == 0.1 and settings.prune.cache_write_price == 1.25
    assert settings.prune.postpone_compaction is False
    assert problems == ["prune.cacheReadPrice: -0.1 is outside 0..100; using the default 0.1",
                        "prune.cacheWritePrice: expected a number, got the string 'high'; using the default 1.25",
                        "prune.postponeCompaction: expected a boolean, got the string 'yes'; using the default False"]
