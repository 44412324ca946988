"""The agents' own compactions in their transcripts: what each importer reads, and what memory/import records."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from sidecar.client import SidecarClient
from sidecar.importers import parse_transcript
from sidecar.importers.claude_code import summary_text
from sidecar.testing.transcripts import ClaudeCodeWriter

CLI = [sys.executable, "-m", "sidecar", "--no-share"]


def write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.parametrize("written", [
    # Claude Code 2.1: a preface paragraph, then the summary, then where the transcript is and how to go on.
    "This session is being continued from a previous conversation that ran out of context. The summary below "
    "covers the earlier portion of the conversation.\n\nTHE SUMMARY\nsecond line\n\nIf you need specific details "
    "from before compaction (like exact code snippets), read the full transcript at: /x.jsonl\nContinue the "
    "conversation from where it left off without asking the user any further questions.",
    # Claude Code 1.x: the preface on its own line, "Please continue" at the end.
    "This session is being continued from a previous conversation that ran out of context. The conversation is "
    "summarized below:\nTHE SUMMARY\nsecond line\nPlease continue the conversation from where we left it off "
    "without asking the user any further questions.",
    "This session is being continued from a previous conversation that ran out of context.\n\nSummary:\n"
    "THE SUMMARY\nsecond line\n\nRecent messages are preserved verbatim.",
])
def test_claude_codes_wrapping_is_taken_off_the_summary(written: str) -> None:
    assert summary_text(written) == "THE SUMMARY\nsecond line"


def test_an_unwrapped_summary_is_kept_whole() -> None:
    assert summary_text("  Just the summary.\n") == "Just the summary."


def test_claude_code_compaction_replaces_what_came_before_but_the_preserved(tmp_path: Path) -> None:
    writer = ClaudeCodeWriter(tmp_path / "s.jsonl", "/srv/ws", session_id="s")
    writer.turn(0)
    boundary, summary = writer.compact("Turn 0 is done.", trigger="auto")
    writer.user("after the compaction")
    lines = writer.path.read_text().splitlines()
    last_answer = json.loads(lines[-6])["uuid"]  # the answer of turn 0, before last-prompt and the boundary
    meta = {"trigger": "auto", "preTokens": 9_000, "preservedMessages": {"uuids": [last_answer]}}
    lines[-4] = json.dumps({**boundary, "compactMetadata": meta})
    writer.path.write_text("\n".join(lines) + "\n")

    parsed = parse_transcript(writer.path)

    [found] = parsed.compactions
    ids = [m["id"] for m in parsed.messages]
    assert (found.id, found.summary, found.trigger) == (boundary["uuid"], "Turn 0 is done.", "auto")
    assert found.upto == ids[ids.index(last_answer) - 1]  # the tool result before the kept answer
    assert summary["uuid"] not in ids  # the summary is the compaction, not a message of the conversation
    assert ids[-1] == json.loads(lines[-1])["uuid"]  # the history after it goes on, imported


def test_codex_compacted_line_and_pi_compaction_entry(tmp_path: Path) -> None:
    item = {"timestamp": "2026-11-20T09:00:01.000Z", "type": "response_item"}
    rollout = write(tmp_path / "rollout.jsonl", [
        {"timestamp": "2026-11-20T09:00:00.000Z", "type": "session_meta", "payload": {"id": "cx", "cwd": "/srv/ws"}},
        {**item, "payload": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]}},
        {**item, "payload": {"type": "message", "role": "assistant",
                             "content": [{"type": "output_text", "text": "b"}]}},
        {"timestamp": "2026-11-20T09:00:02.000Z", "type": "compacted", "payload": {"message": (
            "Another language model started to solve this problem and produced a summary of its thinking process. "
            "Here is the summary produced by the other language model, use the information in this summary to "
            "assist with your own analysis:\nCodex summary."), "replacement_history": []}},
        {**item, "payload": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "c"}]}},
    ])
    parsed = parse_transcript(rollout)
    [found] = parsed.compactions
    assert (found.summary, found.upto) == ("Codex summary.", parsed.messages[1]["id"])
    assert found.id == parse_transcript(rollout).compactions[0].id  # a stable id: read again, the same

    def pi(entry_id: str, parent: str | None, role: str, text: str) -> dict[str, Any]:
        return {"type": "message", "id": entry_id, "parentId": parent, "timestamp": "2026-11-20T09:00:01.000Z",
                "message": {"role": role, "content": [{"type": "text", "text": text}], "timestamp": 1}}

    session = write(tmp_path / "pi.jsonl", [
        {"type": "session", "version": 3, "id": "pi", "timestamp": "2026-11-20T09:00:00.000Z", "cwd": "/srv/ws"},
        pi("u1", None, "user", "first"), pi("a1", "u1", "assistant", "one"),
        pi("u2", "a1", "user", "second"), pi("a2", "u2", "assistant", "two"),
        {"type": "compaction", "id": "c1", "parentId": "a2", "timestamp": "2026-11-20T09:00:02.000Z",
         "summary": "pi summary.", "firstKeptEntryId": "u2", "tokensBefore": 900},
        pi("u3", "c1", "user", "third"),
    ])
    [kept] = parse_transcript(session).compactions
    assert (kept.id, kept.summary, kept.upto) == ("c1", "pi summary.", "a1")  # u2 and a2 are kept verbatim

    # The same compaction made by the sidecar through pi's extension: its summaries are the session's already.
    lines = [json.loads(line) for line in session.read_text().splitlines()]
    lines[5]["details"] = {"source": "context-sidecar", "summaryIds": ["sum_1"]}
    assert parse_transcript(write(tmp_path / "pi-sidecar.jsonl", lines)).compactions == []


async def test_memory_import_records_a_transcripts_compaction_once(tmp_path: Path) -> None:
    writer = ClaudeCodeWriter(tmp_path / "s.jsonl", "/srv/ws", session_id="imported")
    writer.user("Never push to main without a review.")
    writer.assistant("Understood.")
    for turn in range(2):
        writer.turn(turn)
    writer.compact("Both turns are done.")
    writer.user("what next?")
    async with await SidecarClient.spawn(command=CLI, db=str(tmp_path / "m.duckdb")) as client:
        compacted = client.wait_for_notification("context/didCompact", timeout=30)
        first = await client.import_transcript(str(writer.path))
        event = await compacted
        again = await client.import_transcript(str(writer.path))
        assert (first.compactions, again.compactions) == (1, 0)
        assert (event.source, event.trigger, event.session_id) == ("claude-code", "manual", "imported")
        assembled = await client.assemble("imported")
        assert [item.kind for item in assembled.items] == ["summary", "message"]
        assert assembled.messages[-1]["content"] == "what next?"
        described = await client.describe("imported", event.summary_ids[0])
        assert described.content.startswith("Both turns are done.")
        # The agent's summary carries the standing rules of what it replaced, as every summary does.
        assert described.message_count == 10 and described.rules == ["Never push to main without a review."]
