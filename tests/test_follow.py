"""``import --follow``: a transcript written line by line (and in half lines) while it is followed."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from sidecar.agents.follow import Follower, Step
from sidecar.cli.import_command import client_importer
from sidecar.client import SidecarClient, SidecarRequestError
from sidecar.importers import ImportFormatError, parse_transcript
from sidecar.testing.transcripts import ClaudeCodeWriter
from tests.helpers.openai_checks import assert_valid_openai_sequence

FIXTURES = Path(__file__).parent / "fixtures"
SETTINGS = {"compaction": {"auto": False}, "prune": {"enabled": False}}
WAIT = 30.0
"""Upper bound of every wait for an event; they end as soon as it happens."""


async def stored_ids(client: SidecarClient, session_id: str | None) -> list[str]:
    """The session's stored messages in context order (none before it exists)."""
    if session_id is None or session_id not in {s.session_id for s in (await client.sessions()).sessions}:
        return []
    assembled = await client.assemble(session_id, budget=10_000_000, prune=False)
    assert_valid_openai_sequence(assembled.messages)
    return [item.id for item in assembled.items]


def expected_ids(path: Path) -> list[str]:
    """What one import of the file's complete lines stores."""
    try:
        parsed = parse_transcript(path, follow=True)
    except ImportFormatError:
        return []  # nothing that tells the format yet: nothing stored
    return [m["id"] for m in parsed.messages]


async def follow_until(follower: Follower, client: SidecarClient, want: list[str]) -> list[Step]:
    """Step the follower until the stored session holds ``want``; the steps taken."""
    steps: list[Step] = []
    deadline = asyncio.get_running_loop().time() + WAIT
    while await stored_ids(client, follower.session) != want:
        assert asyncio.get_running_loop().time() < deadline, f"session never reached {len(want)} messages"
        steps.append(await follower.step())
        await asyncio.sleep(0.05)
    return steps


@pytest.mark.parametrize("name", ["claude-code-2.1-parallel.jsonl", "codex-0.46-rollout.jsonl",
                                  "pi-v3-thinking.jsonl"])
async def test_each_line_and_half_line_is_stored_as_written(tmp_path: Path, name: str) -> None:
    lines = (FIXTURES / name).read_text().splitlines(keepends=True)
    live = tmp_path / "live.jsonl"
    live.write_text("")
    async with await SidecarClient.spawn(db=str(tmp_path / "m.duckdb"), settings=SETTINGS) as client:
        follower = Follower(client_importer(client), live)
        for index, line in enumerate(lines):
            half = len(line) // 2
            with live.open("a") as fh:
                fh.write(line[:half])  # an entry written in two pieces: the first half waits
            await follower.step()
            assert await stored_ids(client, follower.session) == expected_ids(live)
            with live.open("a") as fh:
                fh.write(line[half:])
            want = expected_ids(live)
            await follow_until(follower, client, want)
            skipped = follower.last.skipped if follower.last else []
            assert not any("invalid JSON" in reason for reason in skipped), index  # half lines are never read
        once = parse_transcript(FIXTURES / name)
        assert await stored_ids(client, follower.session) == [m["id"] for m in once.messages]


async def test_invalid_line_truncation_replacement_and_deletion(tmp_path: Path) -> None:
    lines = (FIXTURES / "pi-v3-thinking.jsonl").read_text().splitlines(keepends=True)
    live = tmp_path / "live.jsonl"
    live.write_text("".join(lines[:5]) + "{not json\n")
    async with await SidecarClient.spawn(db=str(tmp_path / "m.duckdb"), settings=SETTINGS) as client:
        follower = Follower(client_importer(client), live)
        steps = await follow_until(follower, client, expected_ids(live))
        assert any("line 6: invalid JSON" in reason for step in steps for reason in step.skipped)
        with live.open("a") as fh:
            fh.writelines(lines[5:8])  # following goes on after the bad line
        await follow_until(follower, client, expected_ids(live))
        stored = await stored_ids(client, follower.session)

        live.write_text("".join(lines[:4]))  # truncated: nothing stored is lost, nothing twice
        steps = await follow_until(follower, client, stored)
        steps.append(await follower.step())
        assert await stored_ids(client, follower.session) == stored

        live.unlink()
        assert "is gone" in " ".join((await follower.step()).notes)
        assert (await follower.step()).notes == []  # said once, then waits
        replacement = tmp_path / "new.jsonl"
        replacement.write_text("".join(lines))
        replacement.rename(live)  # back, as a new file (another inode)
        step = await follower.step()
        assert "is back" in " ".join(step.notes)
        await follow_until(follower, client, expected_ids(FIXTURES / "pi-v3-thinking.jsonl"))


async def test_a_file_that_fails_to_import_is_tried_again_when_it_changes_not_at_every_look(tmp_path: Path) -> None:
    live = tmp_path / "live.jsonl"
    too_long = "x" * 600
    writer = ClaudeCodeWriter(live, str(tmp_path), session_id=too_long)  # no session id the store takes
    for turn in range(20):
        writer.turn(turn)
    async with await SidecarClient.spawn(db=str(tmp_path / "m.duckdb"), settings=SETTINGS) as client:
        follower = Follower(client_importer(client), live)
        with pytest.raises(SidecarRequestError, match="sessionId"):
            await follower.step()
        # The unchanged file would fail the same way: it is not read again at the next look (a host following it
        # read it whole five times a second).
        assert not follower.changed()
        assert not (await follower.step()).imported
        live.write_text(live.read_text().replace(too_long, "cc-fixed"))
        assert follower.changed()
        step = await follower.step()
    assert step.imported and step.stored > 0 and follower.session == "cc-fixed"


async def read_until(stream: asyncio.StreamReader, pattern: str) -> list[str]:
    """Lines of the stream up to and including one containing ``pattern`` (bounded wait)."""
    seen: list[str] = []
    while True:
        line = (await asyncio.wait_for(stream.readline(), WAIT)).decode()
        assert line, f"output ended before {pattern!r}: {seen}"
        seen.append(line)
        if pattern in line:
            return seen


def interruptible() -> None:
    """In the child before it starts: SIGINT at its default, as a terminal's foreground job has it.

    A test run started in the background by a non-interactive shell inherits SIGINT ignored, and the command
    rightly keeps ignoring it then.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def start_follow(path: Path, db: Path) -> Any:
    """``context-sidecar import --follow`` as a subprocess."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sidecar", "import", "--follow", str(path), "--db", str(db),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, preexec_fn=interruptible)


async def stop(process: Any) -> tuple[int, str]:
    """Ctrl-C; the exit code and the rest of the output."""
    process.send_signal(signal.SIGINT)
    out, err = await asyncio.wait_for(process.communicate(), WAIT)
    return process.returncode, out.decode() + err.decode()


async def test_the_command_follows_stops_on_ctrl_c_and_restarts_without_duplicates(tmp_path: Path) -> None:
    lines = (FIXTURES / "codex-0.46-rollout.jsonl").read_text().splitlines(keepends=True)
    live, db = tmp_path / "rollout.jsonl", tmp_path / "m.duckdb"
    live.write_text("".join(lines[:4]))
    process = await start_follow(live, db)
    assert process.stdout is not None
    await read_until(process.stdout, "+2 messages in session 0199a1b2")
    with live.open("a") as fh:
        fh.write("".join(lines[4:7]) + lines[7][:40])
    await read_until(process.stdout, "+2 messages")  # the call and its stand-in result; half a line waits
    code, rest = await stop(process)
    assert code == 0 and "stopped" in rest and "Traceback" not in rest

    with live.open("a") as fh:
        fh.write(lines[7][40:] + "".join(lines[8:]))  # written while nobody followed
    process = await start_follow(live, db)
    assert process.stdout is not None
    # The stand-in replaced by the real output, and the call's assistant message given its token usage.
    await read_until(process.stdout, "+5 messages, 2 updated")
    code, rest = await stop(process)
    assert code == 0, rest
    async with await SidecarClient.spawn(db=str(db), settings=SETTINGS) as client:
        once = parse_transcript(FIXTURES / "codex-0.46-rollout.jsonl")
        assert await stored_ids(client, "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b") == [m["id"] for m in once.messages]
        assert (await client.sessions()).sessions[0].messages == len(once.messages)


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups")
async def test_ctrl_c_in_a_terminal_reaches_the_server_too_and_still_exits_0(tmp_path: Path) -> None:
    live, db = tmp_path / "rollout.jsonl", tmp_path / "m.duckdb"
    live.write_text((FIXTURES / "codex-0.46-rollout.jsonl").read_text())
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sidecar", "import", "--follow", str(live), "--db", str(db),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
        preexec_fn=interruptible)
    assert process.stdout is not None
    await read_until(process.stdout, "messages in session")
    os.killpg(process.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    out, err = await asyncio.wait_for(process.communicate(), WAIT)
    assert process.returncode == 0, out.decode() + err.decode()
    assert "Traceback" not in err.decode()
