"""The prompt-cache model of sidecar.cli.prompt_cache, on prompts whose figures are worked out by hand."""

from __future__ import annotations

import pytest

from sidecar.cli.prompt_cache import Prices, PromptCache, message_bytes, parse_prices, shared_prefix

SYSTEM = {"role": "system", "content": "be brief"}
ASK = {"role": "user", "content": "fix the parser"}
CALL = {"role": "assistant", "content": "reading it"}
OUTPUT = {"role": "tool", "tool_call_id": "c1", "content": "def parse(): ..."}
PRUNED = {"role": "tool", "tool_call_id": "c1", "content": "[Old tool result content cleared]"}
NEXT = {"role": "user", "content": "now the tests"}


def test_three_prompts_priced_by_hand() -> None:
    cache = PromptCache()
    first = cache.send([SYSTEM, ASK], [10, 20])
    # Nothing before it: all 30 tokens are written, 30 * 1.25.
    assert (first.repeated, first.kept, first.cost) == (0, 0, 37.5)
    second = cache.send([SYSTEM, ASK, CALL, OUTPUT], [10, 20, 30, 40])
    # The two leading messages repeat: 30 read (* 0.1 = 3), 70 written (* 1.25 = 87.5).
    assert (second.repeated, second.kept, second.cost, second.previous_tokens) == (30, 2, 90.5, 30)
    assert second.share == pytest.approx(0.3)
    third = cache.send([SYSTEM, ASK, CALL, PRUNED, NEXT], [10, 20, 30, 5, 35])
    # The output became a placeholder: only the first three messages (60 tokens) repeat; 40 written = 56.
    assert (third.repeated, third.kept, third.cost) == (60, 3, 56.0)
    fourth = cache.send([SYSTEM, {"role": "user", "content": "<summary>…</summary>"}, NEXT], [10, 15, 35])
    # A summary replaced the old messages: 10 of 60 repeat (< half of the previous 100): 1 + 62.5.
    assert (fourth.repeated, fourth.kept, fourth.cost) == (10, 1, 63.5)
    assert cache.prompts == 4
    assert cache.tokens == 30 + 100 + 100 + 60
    assert cache.repeated == 0 + 30 + 60 + 10
    assert cache.hit_rate == pytest.approx(100 / 290)
    assert cache.cost == pytest.approx(37.5 + 90.5 + 56.0 + 63.5)
    assert cache.uncached_cost == 290
    assert cache.short == 1  # only the fourth repeats less than half of the prompt before it


def test_prices_change_the_cost_not_the_hit_rate() -> None:
    cache = PromptCache(Prices(read=0.5, write=1.0, input=2.0))
    cache.send([SYSTEM], [100])
    cache.send([SYSTEM, ASK], [100, 50])
    assert cache.cost == pytest.approx(100 + 100 * 0.5 + 50)
    assert cache.uncached_cost == 500
    assert cache.hit_rate == pytest.approx(100 / 250)


def test_byte_for_byte_means_key_order_and_values() -> None:
    reordered = {"content": "fix the parser", "role": "user"}
    assert message_bytes(ASK) != message_bytes(reordered)
    assert message_bytes({"content": "é"}) == '{"content":"é"}'.encode()
    assert shared_prefix([message_bytes(SYSTEM), message_bytes(ASK)],
                         [message_bytes(SYSTEM), message_bytes(reordered)]) == 1
    assert shared_prefix([], [message_bytes(SYSTEM)]) == 0
    assert shared_prefix([message_bytes(SYSTEM), message_bytes(ASK)], [message_bytes(SYSTEM)]) == 1
    cache = PromptCache()
    cache.send([SYSTEM, ASK], [1, 1])
    assert cache.send([SYSTEM, reordered], [1, 1]).kept == 1


def test_a_prompt_needs_a_token_count_per_message() -> None:
    with pytest.raises(ValueError, match="2 messages but 1 token counts"):
        PromptCache().send([SYSTEM, ASK], [3])


def test_parse_prices() -> None:
    assert parse_prices("read=0.1,write=1.25,input=1.0") == Prices()
    assert parse_prices(" write = 2 ") == Prices(write=2.0)
    assert parse_prices("read=0,input=3e-1") == Prices(read=0.0, input=0.3)
    assert Prices().text() == "read=0.1,write=1.25,input=1"


@pytest.mark.parametrize(("text", "message"), [
    ("read=-0.1", "must be a finite number ≥ 0"),
    ("write=cheap", "is not a number"),
    ("input=nan", "must be a finite number ≥ 0"),
    ("read=inf", "must be a finite number ≥ 0"),
    ("read", "expected NAME=PRICE pairs"),
    ("read=0.1,", "expected NAME=PRICE pairs"),
    ("=1", "expected NAME=PRICE pairs"),
    ("output=1", "unknown price 'output'"),
    ("read=1,read=2", "given twice"),
])
def test_bad_prices_are_refused_with_a_reason(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_prices(text)
