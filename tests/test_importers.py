"""Transcript parsers: pi, Claude Code, Codex CLI, plain OpenAI JSON, and auto-detection."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sidecar.importers import parse_transcript
from sidecar.importers.common import NO_RESULT
from tests.helpers.openai_checks import assert_valid_openai_sequence

PI_REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "pi-large-session.jsonl"


def write_jsonl(path: Path, entries: list[Any]) -> Path:
    """Write entries one per line; strings are written as they are (for corrupt lines)."""
    lines = [e if isinstance(e, str) else json.dumps(e) for e in entries]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def all_text(messages: list[dict[str, Any]]) -> str:
    """Every piece of text in the messages, including tool call arguments."""
    return json.dumps([(m.get("content"), m.get("tool_calls")) for m in messages])


def by_role(messages: list[dict[str, Any]]) -> Counter[str]:
    """Number of messages per role."""
    return Counter(m["role"] for m in messages)


# --- pi ---------------------------------------------------------------------------------------

PI_USAGE = {"input": 10, "output": 5, "cacheRead": 100, "cacheWrite": 7, "cost": {"total": 0.01}}


def pi_entry(eid: str, parent: str | None, message: dict[str, Any], ts: str = "2025-12-01T10:00:00.000Z"):
    """A v3 pi message entry."""
    return {"type": "message", "id": eid, "parentId": parent, "timestamp": ts, "message": message}


def pi_assistant(content: list[dict[str, Any]], stop: str = "toolUse") -> dict[str, Any]:
    """A pi assistant message."""
    return {
        "role": "assistant",
        "content": content,
        "api": "anthropic-messages",
        "provider": "anthropic",
        "model": "claude-sonnet-4-5",
        "usage": PI_USAGE,
        "stopReason": stop,
        "timestamp": 1764583200000,
    }


def pi_result(call_id: str, text: str, extra: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A pi toolResult message."""
    blocks = [{"type": "text", "text": text}, *(extra or [])]
    return {
        "role": "toolResult",
        "toolCallId": call_id,
        "toolName": "read",
        "content": blocks,
        "isError": False,
    }


@pytest.fixture
def pi_v3(tmp_path: Path) -> Path:
    """A version-3 pi session with a branch, thinking, an aborted call and damaged lines."""
    read = {"type": "toolCall", "id": "call_read", "name": "read", "arguments": {"path": "a.py"}}
    return write_jsonl(
        tmp_path / "pi-v3.jsonl",
        [
            {
                "type": "session",
                "version": 3,
                "id": "sess-pi-3",
                "timestamp": "2025-12-01T10:00:00Z",
                "cwd": "/work/proj",
            },
            {
                "type": "model_change",
                "id": "e0",
                "parentId": None,
                "timestamp": "2025-12-01T10:00:00Z",
                "provider": "anthropic",
                "modelId": "claude-sonnet-4-5",
            },
            pi_entry(
                "e1",
                "e0",
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "read a.py"},
                        {"type": "image", "data": "AAA", "mimeType": "image/png"},
                    ],
                    "timestamp": 1764583200000,
                },
            ),
            pi_entry(
                "e2",
                "e1",
                pi_assistant(
                    [
                        {"type": "thinking", "thinking": "SECRET-PI-THOUGHT"},
                        {"type": "text", "text": "Reading it."},
                        read,
                    ]
                ),
            ),
            pi_entry("e3", "e2", pi_result("call_read", "print(1)", [{"type": "image", "data": "B"}])),
            pi_entry("x1", "e3", {"role": "user", "content": "abandoned question"}),
            pi_entry("x2", "x1", pi_assistant([{"type": "text", "text": "abandoned answer"}], "stop")),
            {
                "type": "branch_summary",
                "id": "e4",
                "parentId": "e3",
                "timestamp": "2025-12-01T10:01:00Z",
                "fromId": "x2",
                "summary": "Tried something else.",
            },
            "{not json at all",
            {"type": "fancy_new_entry", "id": "e5", "parentId": "e4", "timestamp": "2025-12-01T10:01:00Z"},
            pi_entry("e6", "e5", pi_result("call_ghost", "orphan output")),
            pi_entry(
                "e7",
                "e6",
                pi_assistant(
                    [{"type": "toolCall", "id": "call_edit", "name": "edit", "arguments": {"path": "a.py"}}],
                    "aborted",
                ),
            ),
            pi_entry("e8", "e7", pi_assistant([], "aborted")),
            {
                "type": "custom_message",
                "id": "e9",
                "parentId": "e8",
                "timestamp": "2025-12-01T10:02:00Z",
                "customType": "note",
                "content": "extension note",
                "display": True,
            },
            {
                "type": "session_info",
                "id": "e10",
                "parentId": "e9",
                "timestamp": "2025-12-01T10:02:00Z",
                "name": "Fix a.py",
            },
        ],
    )


def test_pi_v3_branch_thinking_aborted_and_damaged_lines(pi_v3: Path) -> None:
    parsed = parse_transcript(pi_v3, "pi")
    msgs = parsed.messages
    assert_valid_openai_sequence(msgs)
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "user", "assistant", "tool", "user"]
    assert msgs[0]["content"] == [{"type": "text", "text": "read a.py"}, {"type": "text", "text": "[image]"}]
    assert msgs[1]["id"] == "e2" and msgs[1]["content"] == "Reading it."
    assert msgs[1]["tool_calls"][0]["function"] == {"name": "read", "arguments": '{"path": "a.py"}'}
    assert msgs[1]["metadata"]["usage"] == {"input": 10, "output": 5, "cacheRead": 100, "cacheWrite": 7}
    assert msgs[1]["metadata"]["model"] == "claude-sonnet-4-5"
    assert msgs[2]["content"] == "print(1)\n[image]" and msgs[2]["tool_call_id"] == "call_read"
    assert msgs[3]["content"].startswith("The following is a summary of a branch")
    assert msgs[5] == {
        "role": "tool",
        "tool_call_id": "call_edit",
        "content": NO_RESULT,
        "id": "e7:call_edit:no-result",
        "metadata": msgs[5]["metadata"],
    }
    assert msgs[5]["metadata"]["synthetic"] is True
    assert msgs[6]["content"] == "extension note"
    assert "SECRET-PI-THOUGHT" not in all_text(msgs) and "abandoned" not in all_text(msgs)
    reasons = "\n".join(parsed.skipped)
    assert "line 6: on an abandoned branch" in reasons and "line 7: on an abandoned branch" in reasons
    assert "line 9: invalid JSON" in reasons
    assert "line 10: unknown entry type 'fancy_new_entry'" in reasons
    assert "line 11: tool result for call 'call_ghost'" in reasons
    assert len(parsed.skipped) == 5
    assert parsed.suggested_session_id == "sess-pi-3"
    assert parsed.session == {
        "title": "Fix a.py",
        "model": "claude-sonnet-4-5",
        "metadata": {"cwd": "/work/proj", "sourceSessionId": "sess-pi-3", "provider": "anthropic"},
    }


def test_pi_v1_hash_ids_are_stable_and_distinct(tmp_path: Path) -> None:
    same = {
        "type": "message",
        "timestamp": "2025-11-20T23:33:01.550Z",
        "message": {"role": "user", "content": [{"type": "text", "text": "again"}], "timestamp": 1},
    }
    path = write_jsonl(
        tmp_path / "v1.jsonl", [{"type": "session", "id": "s1", "timestamp": "x", "cwd": "/"}, same, same]
    )
    first, second = parse_transcript(path), parse_transcript(path)
    ids = [m["id"] for m in first.messages]
    assert first.format == "pi" and len(ids) == 2 and len(set(ids)) == 2
    assert ids == [m["id"] for m in second.messages]


@pytest.fixture(scope="module")
def pi_real_entries() -> list[dict[str, Any]]:
    """The real pi session's entries, read independently of the parser."""
    return [json.loads(line) for line in PI_REAL.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_pi_real_session_counts_pairing_and_usage(pi_real_entries: list[dict[str, Any]]) -> None:
    parsed = parse_transcript(PI_REAL)
    msgs = parsed.messages
    assert parsed.format == "pi" and parsed.skipped == []
    assert_valid_openai_sequence(msgs)
    source = [e["message"] for e in pi_real_entries if e["type"] == "message"]
    calls = [
        b["id"] for m in source if m["role"] == "assistant" for b in m["content"] if b["type"] == "toolCall"
    ]
    answered = {m["toolCallId"] for m in source if m["role"] == "toolResult"}
    useful = [
        m
        for m in source
        if m["role"] == "assistant"
        if any(
            b["type"] in ("text", "toolCall") and (b.get("text") or b["type"] == "toolCall")
            for b in m["content"]
        )
    ]
    counts = by_role(msgs)
    assert counts["user"] == sum(1 for m in source if m["role"] == "user") == 88
    assert counts["assistant"] == len(useful)
    assert counts["tool"] == len(calls) == 391
    synthetic = [m for m in msgs if m.get("metadata", {}).get("synthetic")]
    assert {m["tool_call_id"] for m in synthetic} == set(calls) - answered and len(synthetic) == 18
    thoughts = [
        b["thinking"]
        for m in source
        if m["role"] == "assistant"
        for b in m["content"]
        if b["type"] == "thinking" and b["thinking"].strip()
    ]
    assert thoughts and not any(t in all_text(msgs) for t in thoughts)
    for msg in msgs:
        if msg["role"] == "assistant":
            assert set(msg["metadata"]["usage"]) == {"input", "output", "cacheRead", "cacheWrite"}
            assert msg["metadata"]["model"] and msg["metadata"]["timestamp"].endswith("Z")
    header = pi_real_entries[0]
    assert parsed.suggested_session_id == header["id"]
    assert parsed.session["metadata"]["cwd"] == header["cwd"]


def test_pi_real_session_ids_stable_and_unique() -> None:
    first, second = parse_transcript(PI_REAL), parse_transcript(PI_REAL, "pi")
    ids = [m["id"] for m in first.messages]
    assert len(set(ids)) == len(ids)
    assert ids == [m["id"] for m in second.messages]
    assert first.messages == second.messages
