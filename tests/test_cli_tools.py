"""``context-sidecar import`` and ``replay``, each run as a real subprocess against a real sidecar."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.cli.replay import provider_usage, split_turns
from sidecar.client import SidecarClient
from tests.conftest import PI_SESSION
from tests.helpers.transcripts import write_claude_sample, write_pi_sample

CLI = [sys.executable, "-m", "sidecar"]
needs_pi = pytest.mark.skipif(not PI_SESSION.exists(), reason="shared/data is not beside the project")
COMPACTION = re.compile(r"⤷ auto (\w+) compaction: ([\d,]+) → ([\d,]+) tokens")
TURN = re.compile(r"^ +(\d+) +\+(\d+) +([\d,]+) +(?:[\d.]+% +[\d,]+ +)([\d,]+) +([\d.]+)% +(\w+)", re.MULTILINE)
"""turn, +messages, sent tokens, (prefix share, input cost,) context tokens, percent, state."""


def run(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The CLI with these arguments, output captured."""
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout, check=False)


def number(text: str) -> int:
    """An integer printed with thousands separators."""
    return int(text.replace(",", ""))


def table(stdout: str) -> dict[str, str]:
    """The replay's final table as {row name: value}."""
    rows = stdout.split("replay summary\n", 1)[1].splitlines()
    return {line[:18].strip(): line[18:].strip() for line in rows if line.strip()}


async def stored_sessions(db: Path) -> dict[str, tuple[int, int]]:
    """{session id: (messages, summaries)} in a DB, read through a fresh sidecar."""
    async with await SidecarClient.spawn(db=str(db), settings={"compaction": {"auto": False}}) as client:
        return {s.session_id: (s.messages, s.summaries) for s in (await client.sessions()).sessions}


def test_help_describes_both_commands() -> None:
    top = run("--help")
    assert top.returncode == 0
    assert re.search(r"^  import +store a pi, Claude Code, Codex or OpenAI JSON transcript", top.stdout, re.MULTILINE)
    assert re.search(r"^  replay +walk a transcript through a real sidecar turn by turn", top.stdout, re.MULTILINE)
    replay = run("replay", "--help").stdout
    for option in ("--db", "--session", "--format", "--context-window", "--mode", "--report-usage", "--quiet"):
        assert option in replay
    assert "fresh temporary" in replay
    assert "{auto,pi,claude-code,codex,openai}" in run("import", "--help").stdout


async def test_import_reports_skipped_lines_in_order_and_is_idempotent(tmp_path: Path) -> None:
    sample = write_pi_sample(tmp_path / "pi.jsonl")
    db = tmp_path / "memory.duckdb"
    first = run("--db", db, "import", sample)  # --db before the command name must count too
    assert first.returncode == 0, first.stderr
    out = first.stdout
    assert "pi.jsonl (pi) into session sess-pi-3" in out
    assert "7 messages stored, 0 already in the session, 6 lines skipped" in out
    skipped = re.findall(r"^  skipped line (\d+): (.*)$", out, re.MULTILINE)
    assert [int(n) for n, _ in skipped] == [6, 7, 9, 10, 11, 13]
    assert dict(skipped)["9"].startswith("invalid JSON")
    assert dict(skipped)["10"] == "unknown entry type 'fancy_new_entry'"
    assert "stop reason 'aborted'" in dict(skipped)["13"]  # an aborted, empty assistant message is listed
    assert re.search(r"usage: \d+ tokens of 200,000 \(0\.\d%\), state ok", out)

    again = run("import", sample, "--db", db)
    assert again.returncode == 0, again.stderr
    assert "0 messages stored, 7 already in the session, 6 lines skipped" in again.stdout
    assert await stored_sessions(db) == {"sess-pi-3": (7, 0)}


def test_import_with_session_and_format_and_the_errors(tmp_path: Path) -> None:
    sample = write_claude_sample(tmp_path / "cc.jsonl")
    db = tmp_path / "memory.duckdb"
    named = run("import", sample, "--db", db, "--session", "mine", "--format", "claude-code")
    assert named.returncode == 0, named.stderr
    assert "cc.jsonl (claude-code) into session mine" in named.stdout
    assert "11 messages stored" in named.stdout

    missing = run("import", tmp_path / "nope.jsonl", "--db", db)
    assert missing.returncode == 1
    assert "no transcript file" in missing.stderr and missing.stdout == ""
    wrong = run("import", sample, "--db", db, "--session", "wrong", "--format", "pi")
    assert wrong.returncode == 1
    # A file that yields no messages in the given format is refused by the server, and no session is made.
    assert "no messages could be read" in wrong.stderr and "as pi" in wrong.stderr
    assert re.search(r"\d+ JSON lines read, none a pi message \(\d+ skipped: line \d+: ", wrong.stderr)
    assert "unknown entry type 'user'" in wrong.stderr


@needs_pi
def test_import_the_large_pi_session(tmp_path: Path) -> None:
    result = run("import", PI_SESSION, "--db", tmp_path / "memory.duckdb")
    assert result.returncode == 0, result.stderr
    assert "pi-large-session.jsonl (pi) into session d703a1a9-1b7b-4fb1-b512-c9738b1fe617" in result.stdout
    assert re.search(r"918 messages stored, 0 already in the session, \d+ lines skipped", result.stdout)
    # Every skipped line is an aborted or errored assistant message with nothing an API would accept.
    assert all("assistant message with no text" in line
               for line in re.findall(r"^  skipped (.*)$", result.stdout, re.MULTILINE))


@needs_pi
async def test_replay_the_large_pi_session_compacts_and_keeps_everything(tmp_path: Path) -> None:
    db = tmp_path / "replay.duckdb"
    result = run("replay", PI_SESSION, "--db", db, "--context-window", "32000", "--session", "pi-replay")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "a pi transcript of 918 messages in 88 turns (79 with provider usage)" in out
    assert f"storage {db} (kept)" in out
    assert "window 32,000 (--context-window), auto-compaction incremental from 23,808 tokens" in out

    turns = TURN.findall(out)
    assert [int(t[0]) for t in turns] == list(range(1, 89))
    assert sum(int(t[1]) for t in turns) == 918
    assert all(number(t[3]) <= 32000 for t in turns), "every turn ends inside the window"
    assert all(state != "compacting" for *_, state in turns), "the replay waits for compactions to end"

    compactions = COMPACTION.findall(out)
    assert len(compactions) >= 3
    assert all(number(after) < number(before) for _, before, after in compactions)
    # The settings' mode, incremental; full only to fit, where one turn took the context over the window.
    assert all(mode == "incremental" or (mode == "full" and number(before) > 32000) for mode, before, _ in compactions)
    assert sum(mode == "incremental" for mode, _, _ in compactions) >= 3
    assert "provider" in out and "provider usage is not reported" in out

    summary = table(out)
    assert summary["turns"] == "88"
    assert summary["messages"] == "918 stored, 0 duplicates"
    assert summary["compactions"].startswith(f"{len(compactions)} (auto)")
    final_tokens = number(summary["final context"].split()[0])
    assert final_tokens == number(turns[-1][3])
    messages, summaries = (await stored_sessions(db))["pi-replay"]
    assert messages == 918, "compaction never loses a stored message"
    assert summaries == int(summary["summaries"]) >= len(compactions)

    again = run("replay", PI_SESSION, "--db", db, "--session", "pi-replay")
    assert again.returncode == 1
    assert "already holds 918 messages" in again.stderr


def test_replay_on_a_fresh_temporary_db_quiet_without_usage(tmp_path: Path) -> None:
    sample = write_pi_sample(tmp_path / "pi.jsonl")
    result = run("replay", sample, "--quiet", "--report-usage", "never", "--mode", "handoff")
    assert result.returncode == 0, result.stderr
    match = re.search(r"storage (\S+) \(a fresh temporary DB, removed at exit\)", result.stdout)
    assert match and not Path(match.group(1)).exists()
    assert "no provider usage is reported" in result.stdout
    assert "6 transcript lines skipped" in result.stdout
    summary = table(result.stdout)
    assert summary["provider usage"].startswith("0 reports")
    assert summary["messages"] == "7 stored, 0 duplicates"


def test_turns_and_provider_usage() -> None:
    system = {"role": "system", "content": "be brief"}
    user, user2 = {"role": "user", "content": "a"}, {"role": "user", "content": "b"}
    early = {"role": "assistant", "content": "x", "metadata": {"usage": {"input": 1, "output": 2}}}
    late = {"role": "assistant", "content": "y", "metadata": {"usage": {"input": 5, "output": 6, "cacheRead": 7}}}
    tool = {"role": "tool", "tool_call_id": "c", "content": "out"}
    turns = split_turns([system, user, early, tool, late, user2])
    assert [(t.number, t.opening, t.rest) for t in turns] == [(1, [system, user], [early, tool, late]),
                                                            (2, [user2], [])]
    assert provider_usage(turns[0].rest) == {"input": 5, "output": 6, "cacheRead": 7}
    assert provider_usage([tool, {"role": "assistant", "content": "z"}]) is None
    assert [t.opening for t in split_turns([system])] == [[system]]
    assert turns[0].steps == [[early, tool], [late]] and turns[1].steps == []


def test_replay_of_a_one_prompt_agent_run_compacts_mid_run(tmp_path: Path) -> None:
    history: list[dict[str, object]] = [{"role": "user", "content": "fix the failing tests"}]
    for step in range(60):  # as SWE-agent writes them: one prompt, then step after step
        call = {"id": f"c{step}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        history += [{"role": "assistant", "content": f"step {step}", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": f"c{step}", "content": f"output {step} " + "x" * 4000}]
    path = tmp_path / "run.traj"
    path.write_text(json.dumps({"history": history}))
    result = run("replay", path, "--context-window", "32000", "--quiet")
    assert result.returncode == 0, result.stderr
    assert "in 1 turn (" in result.stdout
    # Each step assembles and lets compaction run: one turn, several compactions inside it.
    assert len(COMPACTION.findall(result.stdout)) >= 2
    turns = TURN.findall(result.stdout)
    assert len(turns) == 1 and number(turns[0][3]) <= 32000


def test_replay_gives_the_same_timeline_every_run() -> None:
    # Each step's usage report starts a compaction here (the provider counted far more than the 3,000-token window):
    # the timeline must not depend on whether that compaction or the step's messages reach the sidecar first.
    settings = '{"compaction": {"freshTail": 4, "leafChunkSize": 4, "minSavings": 0}}'
    fixture = Path(__file__).resolve().parent / "fixtures" / "claude-code-2.1-parallel.jsonl"
    timelines = []
    for _ in range(3):
        result = run("replay", fixture, "--context-window", "3000", "--settings", settings)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith(" turn "))
        rows = table(result.stdout)
        timelines.append((lines[start:lines.index("replay summary")], rows["compactions"], rows["final context"],
                          rows["prefix hits"], rows["usage pushes"]))
    assert COMPACTION.search("\n".join(timelines[0][0])), "the run compacts"
    assert timelines[1] == timelines[0] and timelines[2] == timelines[0]
