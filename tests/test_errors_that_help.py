"""Errors a user meets end in one line that says what to change: the tools' usage and storage errors, compactions
that replace nothing, and tool results that no assembled context will send."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sidecar.client import SidecarClient

CLI = [sys.executable, "-m", "sidecar"]
ALONE = [*CLI, "--no-share"]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=120, check=False)


def big(msg_id: str, role: str = "user", tokens: int = 400) -> dict[str, Any]:
    return {"id": msg_id, "role": role, "content": f"{msg_id} " + "word " * (tokens * 4 // 5)}


@pytest.mark.parametrize("messages", [1, 3, 20, 30, 60])
def test_the_demo_runs_with_any_number_of_messages(messages: int) -> None:
    demo = run("demo", "--db", ":memory:", "--messages", str(messages))
    assert demo.returncode == 0, demo.stderr
    assert "Traceback" not in demo.stderr
    step = next(line for line in demo.stdout.splitlines() if line.startswith("4. "))
    if messages <= 30:  # too short to compact: the demo says why, naming the settings
        assert "nothing to compact" in step and "compaction.freshTail" in step and "compaction.leafChunkSize" in step
    else:
        assert "1 round;" in step or "2 rounds;" in step
    assert f"1. Stored {messages} message{'s' if messages > 1 else ''} " in demo.stdout


@pytest.mark.parametrize(("value", "why"), [("0", "must be at least 1, not 0"), ("-3", "must be at least 1, not -3"),
                                            ("many", "not a whole number: 'many'")])
def test_the_demo_rejects_what_is_not_a_number_of_messages(value: str, why: str) -> None:
    demo = run("demo", "--db", ":memory:", "--messages", value)
    assert demo.returncode == 2
    assert demo.stderr.splitlines()[-1] == f"context-sidecar demo: error: argument --messages: {why}"
    assert demo.stdout == ""


@pytest.mark.parametrize("tool", [["demo"], ["import", FIXTURES / "pi-v3-thinking.jsonl"],
                                  ["replay", FIXTURES / "pi-v3-thinking.jsonl"]], ids=lambda tool: tool[0])
def test_a_corrupt_database_is_one_clear_line(tmp_path: Path, tool: list[str | Path]) -> None:
    corrupt = tmp_path / "corrupt.duckdb"
    corrupt.write_bytes(b"not a database, just bytes " * 100)
    ran = run(*tool, "--db", corrupt)
    assert ran.returncode == 1
    assert ran.stderr.splitlines() == [
        f"context-sidecar {tool[0]}: error: cannot open {corrupt}: IO Error: The file \"{corrupt}\" exists, but it "
        "is not a valid DuckDB database file!"]
    assert corrupt.read_bytes() == b"not a database, just bytes " * 100


def test_with_v_the_tools_pass_their_logging_on_to_the_sidecar(tmp_path: Path) -> None:
    log = tmp_path / "demo.log"
    demo = run("demo", "--db", ":memory:", "--messages", "3", "-v", "--log-file", log)
    assert demo.returncode == 0
    assert "sidecar.rpc.handlers.lifecycle: initialized with storage :memory:" in log.read_text()


async def test_nothing_to_compact_names_the_settings_that_decide() -> None:
    async with await SidecarClient.spawn(command=ALONE, db=":memory:") as client:
        await client.ingest("s", [big(f"m{i}") for i in range(12)])
        incremental = await client.compact("s", mode="incremental")
        handoff = await client.compact("s", mode="handoff")
        await client.ingest("p", [{**big("p0"), "pinned": True}, *(big(f"p{i}") for i in range(1, 30))])
        pinned = await client.compact("p", mode="incremental", )
    half = (128_000 - 8192) // 2  # of the default window's budget: a run holding that many tokens is summarized
    assert not incremental.compacted and incremental.reason == (
        "nothing to compact: 0 messages before the fresh tail (compaction.freshTail: the newest 20 messages stay), "
        f"and a leaf summary needs a run of compaction.leafChunkSize (10) or of {half:,} tokens")
    assert not handoff.compacted and handoff.reason == (
        "nothing to compact: all 12 messages are in the kept tail (compaction.freshTail: the newest 20 messages, "
        "compaction.keepRecentTokens: 16,384 tokens)")
    assert pinned.compacted is False
    assert pinned.reason is not None and "10 messages before the fresh tail" in pinned.reason
    assert pinned.reason.endswith("not broken by a system or pinned message")


async def test_over_the_threshold_with_nothing_compacted_the_hint_says_why() -> None:
    # Too few older messages for an incremental leaf (auto), and too few tokens in them; enough for a handoff.
    settings = {"contextWindow": 4000, "compaction": {"reserveTokens": 0, "freshTail": 4, "keepRecentTokens": 0}}
    async with await SidecarClient.spawn(command=ALONE, db=":memory:", settings=settings) as client:
        explained = client.wait_for_notification(
            "context/didChangeUsage", lambda usage: "replaced nothing" in (usage.hint or ""), timeout=30)
        messages = [big(f"m{i}", tokens=100) for i in range(9)] + [big("m9", tokens=3600)]
        await client.ingest("s", messages, session={"contextWindow": 4000})
        usage = await explained
        assert usage.state == "overflow"
        assert usage.hint == (
            f"Context {usage.percent:.0f}% full, over the model's window, and auto-compaction replaced nothing (older "
            "messages are dropped): nothing to compact: 9 messages before the fresh tail (compaction.freshTail: the "
            "newest 4 messages, 1 within half the prompt's budget stay), and a leaf summary needs a run of "
            "compaction.leafChunkSize (10) or of 2,000 tokens")
        assert (await client.usage("s")).hint == usage.hint
        # Once a compaction replaces something, the hint is the usual one again.
        compacted = await client.compact("s", mode="handoff")
        assert compacted.compacted
        assert "replaced nothing" not in (compacted.usage.hint or "")


def test_a_replay_that_overflows_with_nothing_left_to_compact_says_which_setting_decides() -> None:
    # Its second turn (4 messages, a few big tool outputs) is compacted though shorter than compaction.leafChunkSize:
    # it holds half the prompt's budget. What is left (the summary and the newest message) still overflows 1,024.
    replay = run("replay", FIXTURES / "claude-code-2.1-parallel.jsonl", "--context-window", "1024", "--quiet")
    assert replay.returncode == 0, replay.stderr
    timeline, summary = replay.stdout.split("replay summary")
    assert "⤷ auto " in timeline and " compaction: " in timeline, replay.stdout
    final = next(line for line in summary.splitlines() if line.startswith("  final context"))
    assert "state overflow" in final and "auto-compaction replaced nothing" in final
    assert "compaction.freshTail" in final and "compaction.leafChunkSize" in final
    wrong = run("replay", FIXTURES / "claude-code-2.1-parallel.jsonl", "--settings", "[1]")
    assert wrong.returncode == 2
    assert wrong.stderr.splitlines()[-1].endswith("argument --settings: a JSON object of settings is needed, not list")


def test_the_replay_header_counts_in_words() -> None:
    replay = run("replay", FIXTURES / "swe-agent-1.0.traj")
    assert replay.stdout.splitlines()[0] == ("context-sidecar replay: swe-agent-1.0.traj, an openai transcript of 8 "
                                             "messages in 1 turn (0 with provider usage)")


async def test_a_tool_result_that_answers_no_call_is_reported_where_it_is_ingested(tmp_path: Path) -> None:
    log = tmp_path / "sidecar.log"
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}]}
    async with await SidecarClient.spawn(command=[*ALONE, "--log-file", str(log)], db=":memory:") as client:
        first = await client.ingest("s", [{"role": "user", "content": "go"}, {"role": "tool", "tool_call_id": "c0",
                                                                            "content": "early"}, call,
                                          {"role": "tool", "tool_call_id": "c1", "content": "fine"}])
        later = await client.ingest("s", [{"role": "tool", "tool_call_id": "c1", "content": "again"},
                                          {"role": "tool", "tool_call_id": "c9", "content": "lost"}])
        matched = await client.ingest("t", [call, {"role": "tool", "tool_call_id": "c1", "content": "ok"}])
        sent = (await client.assemble("s")).messages
    assert first.warnings == [
        "messages[1]: the tool result for 'c0' answers no tool call before it in this session: it is stored, but left "
        "out of every assembled context (ingest the assistant message with that call first)"]
    assert later.warnings is not None and [w.split(":")[0] for w in later.warnings] == ["messages[1]"]
    assert "'c9'" in later.warnings[0]
    assert matched.warnings is None
    assert len(first.ids) == 4 and len(later.ids) == 2  # stored all the same
    assert [m.get("content") for m in sent if m["role"] == "tool"] == ["fine", "again"]
    logged = log.read_text()
    assert "WARNING sidecar.services.memory: ingest into s: messages[1]: the tool result for 'c0'" in logged
    assert "'c9'" in logged


def test_a_database_whose_directory_cannot_be_made_is_one_clear_line(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    ran = run("demo", "--db", blocked / "memory.duckdb")
    assert ran.returncode == 2
    assert ran.stderr.splitlines() == [f"context-sidecar demo: error: --db {blocked}/memory.duckdb: {blocked} is not "
                                       "a directory"]
