"""``context-sidecar replay``'s prompt-cache figures, through the real CLI and a real sidecar."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.test_cli_tools import run, table

ROW = re.compile(r"^ +(\d+) +\+(\d+) +([\d,]+) +([\d.]+)% +([\d,]+) +[\d,]+ +[\d.]+% +\w+", re.MULTILINE)
"""turn, +messages, sent tokens, prefix share, input cost."""


def write_small_transcript(path: Path) -> Path:
    """Four turns of a user and an assistant message, each 16 ASCII characters: 4 + 4 = 8 estimated tokens."""
    messages = []
    for turn in range(1, 5):
        messages.append({"role": "user", "content": f"please do task {turn}"})
        messages.append({"role": "assistant", "content": f"done with task {turn}"})
    assert all(len(m["content"]) == 16 for m in messages)
    path.write_text(json.dumps(messages))
    return path


def test_replay_prints_prefix_hits_and_cost_worked_out_by_hand(tmp_path: Path) -> None:
    sample = write_small_transcript(tmp_path / "small.json")
    result = run("replay", sample, "--format", "openai", "--report-usage", "never", "--compare-prune-off")
    assert result.returncode == 0, result.stderr
    # Turn N sends the 2N-1 messages so far (8 tokens each); the previous prompt is all of its prefix:
    # prompts of 8, 24, 40, 56 tokens repeat 0, 8, 24, 40 of them (0%, 33.3%, 60%, 71.4%).
    # Cost: repeated x 0.1 + the rest x 1.25 = 10, 20.8, 22.4, 24: 77.2 in all, of 128 uncached.
    rows = ROW.findall(result.stdout)
    assert [(int(t), int(sent)) for t, _, sent, _, _ in rows] == [(1, 8), (2, 24), (3, 40), (4, 56)]
    assert [share for *_, share, _ in rows] == ["0.0", "33.3", "60.0", "71.4"]
    assert [cost for *_, cost in rows] == ["10", "21", "22", "24"]
    assert " turn  +msgs   sent tokens  prefix   input cost   context after turn" in result.stdout
    summary = table(result.stdout)
    # 72 of 128 tokens repeat: 56.25%.
    assert summary["prefix hits"] == ("56.2% of 128 prompt tokens repeat the previous prompt's prefix; "
                                      "0 of 3 prompts repeat under half of the one before")
    assert summary["input cost"] == "77 at read=0.1,write=1.25,input=1 per token, 0.60x the 128 uncached"
    # Nothing is pruned or compacted in either run, so pruning off sends the same prompts.
    assert summary["pruning off"] == "prefix hits 56.2%, input cost 77"
    assert summary["cost ratio"] == "1.00x (input cost with pruning on / off)"


def test_replay_prices_are_settable(tmp_path: Path) -> None:
    sample = write_small_transcript(tmp_path / "small.json")
    result = run("replay", sample, "--report-usage", "never", "--prices", "read=0,write=1")
    assert result.returncode == 0, result.stderr
    summary = table(result.stdout)
    # Only the 128 - 72 = 56 new tokens cost anything.
    assert summary["input cost"] == "56 at read=0,write=1,input=1 per token, 0.44x the 128 uncached"
    assert summary["prefix hits"].startswith("56.2% of 128 prompt tokens")
    assert "pruning off" not in summary


@pytest.mark.parametrize(("prices", "reason"), [
    ("read=-0.5", "price read=-0.5 must be a finite number ≥ 0"),
    ("write=cheap", "price write='cheap' is not a number"),
    ("input=1,bogus=2", "unknown price 'bogus'; the prices are read, write, input"),
    ("read", "expected NAME=PRICE pairs separated by commas"),
])
def test_bad_prices_exit_2_before_anything_runs(tmp_path: Path, prices: str, reason: str) -> None:
    sample = write_small_transcript(tmp_path / "small.json")
    db = tmp_path / "kept.duckdb"
    result = run("replay", sample, "--db", db, "--prices", prices)
    assert result.returncode == 2
    assert result.stdout == ""
    assert f"context-sidecar replay: error: argument --prices: {reason}" in result.stderr
    assert result.stderr.startswith("usage: context-sidecar replay")
    assert not db.exists(), "no sidecar was started, no database made"


def test_replay_help_names_the_price_model() -> None:
    text = run("replay", "--help").stdout
    assert "--prices" in text and "--compare-prune-off" in text
    assert "read=0.1,write=1.25,input=1" in text


def write_tool_transcript(path: Path, turns: int) -> Path:
    """Turns of a user message (8 tokens), a read call (4 + 4 + 2 + 4), its 32,000-byte output (8,004), a reply (8)."""
    messages = []
    for turn in range(1, turns + 1):
        call = {"id": f"call_{turn}", "type": "function", "function": {"name": "read", "arguments": "{}"}}
        messages += [
            {"role": "user", "content": f"please do task {turn}"},
            {"role": "assistant", "content": "reading the file", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{turn}", "content": "x" * 32_000},
            {"role": "assistant", "content": f"done with task {turn}"},
        ]
    path.write_text(json.dumps(messages))
    return path


def check_appending_turns(rows: list[tuple[str, ...]]) -> None:
    """The first seven turns of write_tool_transcript(turns=9): every prompt repeats the whole previous one."""
    # Turn N sends the N-1 turns before it (8,034 tokens each) and its user message: 8 + 8,034 (N-1).
    assert len(rows) == 9
    assert [int(sent.replace(",", "")) for _, _, sent, _, _ in rows[:8]] == [8 + 8034 * n for n in range(8)]
    # Each turn makes two prompts, one per step: A = H + 8 (history H = 8,034 (N-1) and the user message), then
    # B = H + 8,026 (with the call and its output). Turn 1: A is all new, B repeats A's 8 of 8,026: 8/8,034.
    # From turn 2 A repeats the previous B (H - 8) and B repeats A (H + 8): 2H / (2H + 8,034) = (2N-2)/(2N-1).
    # Up to turn 7 the default pruning (outputs behind the newest 40,000 tokens, at least 20,000 of them) has
    # nothing to do, so every prompt repeats the whole previous one.
    assert [share for *_, share, _ in rows[:7]] == ["0.1", "66.7", "80.0", "85.7", "88.9", "90.9", "92.3"]


def test_a_prune_step_that_would_not_pay_back_before_compaction_is_not_taken(tmp_path: Path) -> None:
    sample = write_tool_transcript(tmp_path / "tools.json", turns=9)
    result = run("replay", sample, "--format", "openai", "--report-usage", "never", "--compare-prune-off")
    assert result.returncode == 0, result.stderr
    rows = ROW.findall(result.stdout)
    check_appending_turns(rows)
    # Turn 8's second prompt (64,264 tokens) leaves the outputs of turns 1-3 (24,012 tokens) behind the newest
    # 40,000. Pruning them would save 2,400 cache-read units a prompt but write the ~40,000 tokens after them anew
    # (46,000 units), while the context is some 16,000 tokens (four prompts) from the 80,000-token compaction: not
    # worth it, so the prompt only appends, 14/15 of the turn's tokens repeat, and the run costs what pruning off does.
    assert rows[7][3] == "93.3"
    summary = table(result.stdout)
    # Prompt tokens: 8,034 x (2 x 36 + 9) = 650,754; repeated: 8 in turn 1, then 2 x 8,034 x (1 + ... + 8) = 578,448:
    # 578,456 (88.9%); cost 578,456 x 0.1 + 72,298 x 1.25 = 148,218.1.
    assert summary["pruning off"] == "prefix hits 88.9%, input cost 148,218"
    assert summary["input cost"].startswith("148,218 at read=0.1,write=1.25,input=1")
    assert summary["cost ratio"].startswith("1.00x")


def test_a_pruning_step_shows_as_a_prefix_miss_and_pruning_off_only_appends(tmp_path: Path) -> None:
    sample = write_tool_transcript(tmp_path / "tools.json", turns=9)
    # At these prices (a cache read costs half, a write no premium) the same step pays back within two prompts.
    result = run("replay", sample, "--format", "openai", "--report-usage", "never", "--compare-prune-off",
                 "--prices", "read=0.5,write=1")
    assert result.returncode == 0, result.stderr
    rows = ROW.findall(result.stdout)
    check_appending_turns(rows)
    # Pruned, the outputs of turns 1-3 rewrite the prompt from its third message; appending alone would have
    # repeated 14/15 of the turn's prompt tokens (93.3%).
    assert float(rows[7][3]) < 93.3
    summary = table(result.stdout)
    # Pruning off only appends: 578,456 x 0.5 + 72,298 x 1 = 361,526.
    assert summary["pruning off"] == "prefix hits 88.9%, input cost 361,526"
    on_cost = int(summary["input cost"].split()[0].replace(",", ""))
    assert on_cost < 361_526
    ratio = summary["cost ratio"].split("x")[0]
    assert float(ratio) == pytest.approx(on_cost / 361_526, abs=0.006)
