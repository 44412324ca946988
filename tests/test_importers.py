"""Transcript parsers: pi, Claude Code, Codex CLI, plain OpenAI JSON, and auto-detection."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from sidecar.importers import ImportFormatError, parse_transcript
from sidecar.importers.common import NO_RESULT
from tests.helpers.openai_checks import assert_valid_openai_sequence
from tests.helpers.transcripts import (
    TS,
    J,
    cc_asst,
    cc_user,
    cx_call,
    cx_msg,
    cx_out,
    text,
    write_claude_sample,
    write_codex_sample,
    write_jsonl,
    write_pi_sample,
)

PI_REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "pi-large-session.jsonl"
needs_pi = pytest.mark.skipif(not PI_REAL.exists(), reason="shared/data is not beside the project")


def all_text(messages: list[J]) -> str:
    """Every piece of text in the messages, including tool call arguments."""
    return json.dumps([(m.get("content"), m.get("tool_calls")) for m in messages])


def shape(messages: list[J]) -> list[str]:
    """Roles, with the tool_call_id for tool messages, to compare sequences at a glance."""
    return [m["role"] if m["role"] != "tool" else f"tool:{m['tool_call_id']}" for m in messages]


def skip_lines(skipped: list[str]) -> list[str]:
    """The 'line N' / 'entry N' prefixes of the skip reasons."""
    return [reason.split(":")[0] for reason in skipped]


# --- pi ---------------------------------------------------------------------------------------


@pytest.fixture
def pi_v3(tmp_path: Path) -> Path:
    """The pi sample file."""
    return write_pi_sample(tmp_path / "pi-v3.jsonl")


def test_pi_v3_branch_thinking_aborted_and_damaged_lines(pi_v3: Path) -> None:
    parsed = parse_transcript(pi_v3, "pi")
    msgs = parsed.messages
    assert_valid_openai_sequence(msgs)
    assert shape(msgs) == ["user", "assistant", "tool:call_read", "user", "assistant", "tool:call_edit",
                           "user"]  # fmt: skip
    assert msgs[0]["content"][0] == text("read a.py")
    assert msgs[0]["content"][1]["image_url"]["url"].startswith("data:image/")
    assert msgs[1]["id"] == "e2" and msgs[1]["content"] == "Ok."
    assert msgs[1]["tool_calls"][0]["function"] == {"name": "read", "arguments": '{"path": "a.py"}'}
    assert msgs[1]["metadata"]["usage"] == {"input": 10, "output": 5, "cacheRead": 100, "cacheWrite": 7}
    assert msgs[1]["metadata"]["model"] == "claude-sonnet-4-5" and msgs[1]["metadata"]["timestamp"] == TS
    assert msgs[2]["content"] == "print(1)\n[image]" and msgs[2]["id"] == "e3"
    assert msgs[3]["content"].startswith("The following is a summary of a branch")
    assert msgs[5]["content"] == NO_RESULT and msgs[5]["id"] == "e7:call_edit:no-result"
    assert msgs[5]["metadata"]["synthetic"] is True
    assert msgs[6]["content"] == "extension note"
    assert "SECRET-PI-IDEA" not in all_text(msgs) and "abandoned" not in all_text(msgs)
    assert "SECRET-PI-IDEA" in msgs[1]["reasoning"]  # thinking kept beside the message, not in its content
    assert skip_lines(parsed.skipped) == ["line 9", "line 6", "line 7", "line 10", "line 13", "line 11"]
    assert "abandoned branch" in parsed.skipped[1] and "'fancy_new_entry'" in parsed.skipped[3]
    assert "'aborted'" in parsed.skipped[4] and "'call_ghost'" in parsed.skipped[5]
    assert parsed.suggested_session_id == "sess-pi-3"
    assert parsed.session == {
        "title": "Fix a.py",
        "model": "claude-sonnet-4-5",
        "metadata": {"cwd": "/srv/dev/proj", "sourceSessionId": "sess-pi-3", "provider": "anthropic"},
    }


def test_pi_v1_hash_ids_are_stable_and_distinct(tmp_path: Path) -> None:
    same = {"type": "message", "timestamp": TS, "message": {"role": "user", "content": [text("again")]}}
    header = {"type": "session", "id": "s1", "timestamp": TS, "cwd": "/"}
    path = write_jsonl(tmp_path / "v1.jsonl", [header, same, same])
    first, second = parse_transcript(path), parse_transcript(path)
    ids = [m["id"] for m in first.messages]
    assert first.format == "pi" and len(ids) == 2 and len(set(ids)) == 2
    assert ids == [m["id"] for m in second.messages]


@needs_pi
def test_pi_real_session_counts_pairing_and_usage() -> None:
    entries = [json.loads(line) for line in PI_REAL.read_text().splitlines() if line.strip()]
    source = [e["message"] for e in entries if e["type"] == "message"]
    assistants = [m for m in source if m["role"] == "assistant"]
    blocks = [b for m in assistants for b in m["content"]]
    calls = {b["id"] for b in blocks if b["type"] == "toolCall"}
    answered = {m["toolCallId"] for m in source if m["role"] == "toolResult"}
    thoughts = [b["thinking"] for b in blocks if b["type"] == "thinking" and b["thinking"].strip()]
    useful = [m for m in assistants if any(b["type"] == "toolCall" or b.get("text") for b in m["content"])]

    parsed = parse_transcript(PI_REAL)
    msgs = parsed.messages
    assert parsed.format == "pi" and len(parsed.skipped) == len(assistants) - len(useful)
    assert all("assistant message with no text and no tool call" in reason for reason in parsed.skipped)
    assert_valid_openai_sequence(msgs)
    counts = Counter(m["role"] for m in msgs)
    assert counts["user"] == sum(1 for m in source if m["role"] == "user") == 88
    assert counts["assistant"] == len(useful) < len(assistants)
    assert counts["tool"] == len(calls) == 391
    synthetic = {m["tool_call_id"] for m in msgs if m["metadata"].get("synthetic")}
    assert synthetic == calls - answered and len(synthetic) == 18
    outputs = {m["toolCallId"]: "\n".join(b["text"] for b in m["content"]) for m in source if "toolName" in m}
    real = [m for m in msgs if m["role"] == "tool" and m["tool_call_id"] not in synthetic]
    assert real and all(m["content"] == outputs[m["tool_call_id"]] for m in real)
    assert thoughts and not any(t in all_text(msgs) for t in thoughts)
    assert all(any(t in (m.get("reasoning") or "") for m in msgs) for t in thoughts)
    for msg in (m for m in msgs if m["role"] == "assistant"):
        assert set(msg["metadata"]["usage"]) == {"input", "output", "cacheRead", "cacheWrite"}
        assert msg["metadata"]["model"] and msg["metadata"]["timestamp"].endswith("Z")
    assert parsed.suggested_session_id == entries[0]["id"]
    assert parsed.session["metadata"]["cwd"] == entries[0]["cwd"]


@needs_pi
def test_pi_real_session_ids_stable_and_unique() -> None:
    first, second = parse_transcript(PI_REAL), parse_transcript(PI_REAL, "pi")
    ids = [m["id"] for m in first.messages]
    assert len(set(ids)) == len(ids) == len(first.messages) > 900
    assert first.messages == second.messages


# --- Claude Code ------------------------------------------------------------------------------


@pytest.fixture
def claude_file(tmp_path: Path) -> Path:
    """The Claude Code sample file."""
    return write_claude_sample(tmp_path / "cc.jsonl")


def test_claude_code_transcript(claude_file: Path) -> None:
    parsed = parse_transcript(claude_file, "claude-code")
    msgs = parsed.messages
    assert_valid_openai_sequence(msgs)
    assert shape(msgs) == ["user", "assistant", "tool:toolu_read", "tool:toolu_bash", "assistant", "user",
                           "user", "assistant", "tool:toolu_edit", "user", "assistant"]  # fmt: skip
    first = msgs[1]
    assert first["id"] == "a1" and first["content"] == "Let me look."
    assert [c["function"]["name"] for c in first["tool_calls"]] == ["Read", "Bash"]
    assert json.loads(first["tool_calls"][0]["function"]["arguments"]) == {"file_path": "parser.py"}
    assert first["metadata"] == {
        "source": "claude-code", "timestamp": TS, "model": "claude-opus-4-5-20251101",
        "usage": {"input": 3, "output": 12, "cacheRead": 36761, "cacheWrite": 857}, "stopReason": "tool_use",
    }  # fmt: skip
    assert msgs[2]["id"] == "u2" and msgs[3]["content"] == "1 failed\n[image]"  # tool messages carry text only
    assert msgs[3]["metadata"]["isError"] is True
    assert msgs[5]["metadata"]["isMeta"] is True
    assert msgs[6] == {"role": "user", "content": "also rename it", "id": "u5#2",
                       "metadata": {"source": "claude-code", "timestamp": TS}}  # fmt: skip
    assert msgs[8]["content"] == NO_RESULT and msgs[8]["metadata"]["synthetic"] is True
    text_out = all_text(msgs)
    for hidden in ("SECRET-CC-THOUGHT", "sidechain", "abandoned", "API Error", "continued", "first try"):
        assert hidden not in text_out
    assert "SECRET-CC-THOUGHT" in first["reasoning"]
    reasons = dict(reason.split(": ", 1) for reason in parsed.skipped)
    assert sorted(reasons, key=lambda where: int(where.split()[1])) == [
        f"line {n}" for n in (1, 2, 3, 8, 12, 14, 15, 16, 17, 18, 19, 20, 21, 23, 24, 27, 29)]
    assert "sidechain" in reasons["line 14"] and "invalid JSON" in reasons["line 18"]
    assert "'x-future-entry'" in reasons["line 19"] and "same uuid" in reasons["line 27"]
    assert "abandoned branch" in reasons["line 16"] and "'toolu_ghost'" in reasons["line 23"]
    assert "API Error: 529" in reasons["line 24"] and "'progress' entry" in reasons["line 12"]
    assert parsed.suggested_session_id == "cc-sess"
    assert parsed.session == {
        "title": "Fix the parser",
        "model": "claude-opus-4-5-20251101",
        "metadata": {"cwd": "/repo", "sourceSessionId": "cc-sess", "gitBranch": "main",
                     "claudeCodeVersion": "2.0.76"},
    }  # fmt: skip


def test_claude_code_ids_stable_and_custom_title_wins(claude_file: Path) -> None:
    with claude_file.open("a") as fh:
        fh.write(json.dumps({"type": "custom-title", "customTitle": "Parser fix"}) + "\n")
    first, second = parse_transcript(claude_file), parse_transcript(claude_file)
    assert first.format == "claude-code" and first.session["title"] == "Parser fix"
    assert [m["id"] for m in first.messages] == [m["id"] for m in second.messages]
    assert len({m["id"] for m in first.messages}) == len(first.messages)


def test_claude_code_keeps_history_before_a_fresh_root_or_a_missing_parent(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "roots.jsonl", [
        cc_user("u1", None, "first question"),
        cc_asst("a1", "u1", "m1", text("first answer"), stop="end_turn"),
        cc_user("u2", None, "second question, after a resume"),
        cc_asst("a2", "u2", "m2", text("second answer"), stop="end_turn"),
        cc_user("u3", "not-in-this-file", "third question"),
        cc_asst("a3", "u3", "m3", text("third answer"), stop="end_turn"),
    ])  # fmt: skip
    parsed = parse_transcript(path)
    assert [m["id"] for m in parsed.messages] == ["u1", "a1", "u2", "a2", "u3", "a3"]
    assert parsed.skipped == []


# --- Codex CLI --------------------------------------------------------------------------------


@pytest.fixture
def codex_file(tmp_path: Path) -> Path:
    """The Codex sample file."""
    return write_codex_sample(tmp_path / "rollout-2026-01-03T10-00-00-0199.jsonl")


def test_codex_rollout(codex_file: Path) -> None:
    parsed = parse_transcript(codex_file, "codex")
    msgs = parsed.messages
    assert_valid_openai_sequence(msgs)
    assert shape(msgs) == ["system", "user", "user", "assistant", "tool:call_ls", "tool:call_test",
                           "assistant", "tool:call_patch", "assistant", "tool:call_sh",
                           "assistant"]  # fmt: skip
    assert msgs[1]["metadata"]["injected"] is True and "injected" not in msgs[2]["metadata"]
    turn = msgs[3]
    assert turn["content"] == "Listing and testing." and len(turn["tool_calls"]) == 2
    assert turn["tool_calls"][1]["function"] == {"name": "shell", "arguments": '{"command":["pytest"]}'}
    assert turn["metadata"]["model"] == "gpt-5-codex" and turn["metadata"]["timestamp"] == TS
    assert turn["metadata"]["usage"] == {"input": 200, "cacheRead": 1000, "output": 40}
    assert msgs[4]["content"] == "a.py\nb.py" and msgs[5]["content"] == "2 passed"
    assert json.loads(msgs[6]["tool_calls"][0]["function"]["arguments"]) == {"input": "*** Begin Patch"}
    assert msgs[7]["content"] == "Done!"
    assert msgs[8]["tool_calls"][0]["function"]["name"] == "local_shell"
    assert msgs[9]["content"] == NO_RESULT and msgs[9]["metadata"]["synthetic"] is True
    assert "SECRET-CODEX-PLAN" not in all_text(msgs)
    assert skip_lines(parsed.skipped) == ["line 18", "line 20", "line 21", "line 19"]
    assert "'image_generation_call'" in parsed.skipped[1] and "'call_nobody'" in parsed.skipped[3]
    assert "unknown rollout line type 'mystery_envelope'" in parsed.skipped[2]
    assert parsed.suggested_session_id == "0199-codex"
    assert parsed.session == {"model": "gpt-5-codex", "metadata": {
        "sourceSessionId": "0199-codex", "cwd": "/repo", "cliVersion": "0.46.0",
        "originator": "codex_cli_rs", "gitBranch": "main"}}  # fmt: skip
    again = parse_transcript(codex_file)
    assert again.format == "codex" and [m["id"] for m in again.messages] == [m["id"] for m in msgs]


def test_codex_old_layout_without_envelope(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "rollout-2025-05-07T17-24-21-5973b6c0.jsonl", [
        {"id": "5973b6c0", "timestamp": "2025-05-07T17:24:21.123Z", "instructions": None, "git": {}},
        cx_msg("user", "hi"),
        {"record_type": "state"},
        cx_call("call_1"),
        cx_out("call_1", {"content": "permission denied", "success": False}),
        cx_msg("assistant", "It failed."),
    ])  # fmt: skip
    parsed = parse_transcript(path)
    assert parsed.format == "codex" and parsed.skipped == ["line 3: resume state (old layout), not conversation"]
    assert shape(parsed.messages) == ["user", "assistant", "tool:call_1", "assistant"]
    assert parsed.messages[2]["content"] == "permission denied" and parsed.messages[2]["metadata"]["isError"]
    assert "timestamp" not in parsed.messages[0]["metadata"]
    assert parsed.suggested_session_id == "5973b6c0"
    assert_valid_openai_sequence(parsed.messages)


# --- plain OpenAI JSON ------------------------------------------------------------------------


def test_openai_json_validates_and_pairs(tmp_path: Path) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": {"path": "a"}}}
    data = {"title": "Chat", "model": "gpt-4o", "messages": [
        {"role": "system", "content": "be brief", "id": "m-sys"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {}}]},
        {"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": "SECRET-R1"},
        {"role": "tool", "tool_call_id": "c1", "content": "file a"},
        {"role": "tool", "tool_call_id": "c9", "content": "orphan"},
        {"role": "robot", "content": "?"},
        "not a message",
        {"role": "user"},
        {"role": "assistant", "content": "done", "metadata": {"timestamp": TS, "mine": 1}},
        {"role": "assistant", "content": None, "tool_calls": [{**call, "id": "c2"}]},
    ]}  # fmt: skip
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(data))
    parsed = parse_transcript(path)
    msgs = parsed.messages
    assert parsed.format == "openai"
    assert_valid_openai_sequence(msgs)
    assert shape(msgs) == ["system", "user", "assistant", "tool:c1", "assistant", "assistant", "tool:c2"]
    assert msgs[0]["id"] == "m-sys" and msgs[1]["content"] == [text("hi"), text("[image]")]
    assert msgs[2]["tool_calls"][0]["function"]["arguments"] == '{"path": "a"}'
    assert msgs[4]["metadata"] == {"timestamp": TS, "mine": 1, "source": "openai"}
    assert msgs[6]["content"] == NO_RESULT and "SECRET-R1" not in all_text(msgs)
    assert skip_lines(parsed.skipped) == ["entry 5", "entry 6", "entry 7", "entry 4"]
    assert parsed.session == {"title": "Chat", "model": "gpt-4o"}
    assert [m["id"] for m in parse_transcript(path, "openai").messages] == [m["id"] for m in msgs]


# --- detection, empty and broken files --------------------------------------------------------


@pytest.mark.parametrize("fixture, expected", [("pi_v3", "pi"), ("claude_file", "claude-code"),
                                               ("codex_file", "codex")])  # fmt: skip
def test_auto_detection(fixture: str, expected: str, request: pytest.FixtureRequest) -> None:
    assert parse_transcript(request.getfixturevalue(fixture)).format == expected


def test_auto_detection_of_openai_array_and_lines(tmp_path: Path) -> None:
    array = tmp_path / "a.json"
    array.write_text('[{"role": "user", "content": "x"}]')
    lines = write_jsonl(tmp_path / "b.jsonl", [{"role": "user", "content": c} for c in "xy"])
    assert parse_transcript(array).format == "openai" and len(parse_transcript(array).messages) == 1
    assert parse_transcript(lines).format == "openai" and len(parse_transcript(lines).messages) == 2


def test_auto_detection_reads_long_first_lines_whole(tmp_path: Path) -> None:
    pasted = cc_user("u1", None, [text("see"), {"type": "image", "source": {"data": "A" * 5_000_000}}])
    path = write_jsonl(tmp_path / "big.jsonl", [{"type": "custom-title", "customTitle": "Shot"}, pasted])
    parsed = parse_transcript(path)
    assert parsed.format == "claude-code" and parsed.session["title"] == "Shot"
    assert parsed.messages[0]["content"][1]["image_url"]["url"] == "data:image/png;base64," + "A" * 5_000_000


@pytest.mark.parametrize("fmt", ["auto", "pi", "claude-code", "codex", "openai"])
def test_empty_file_gives_no_messages(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    parsed = parse_transcript(path, fmt)
    assert parsed.messages == [] and parsed.skipped == []


def test_undetectable_and_unknown_format_raise(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "odd.jsonl", [{"hello": "world"}, "not json"])
    with pytest.raises(ImportFormatError, match="cannot tell the transcript format"):
        parse_transcript(path)
    with pytest.raises(ImportFormatError, match="unknown transcript format"):
        parse_transcript(path, "word")


@pytest.mark.parametrize("fmt", ["pi", "claude-code", "codex", "openai"])
def test_garbage_never_crashes(tmp_path: Path, fmt: str) -> None:
    junk = ["[1,2]", "null", '{"type": 5}', '{"type": "message", "message": 3}', '{"type": "user"}',
            '{"type": "response_item", "payload": []}', '{"role": "tool"}', "\x00\xff{",
            '{"a": ' * 200]  # fmt: skip
    parsed = parse_transcript(write_jsonl(tmp_path / "junk.jsonl", junk), fmt)
    assert parsed.messages == [] and len(parsed.skipped) >= 3


# --- the checker itself -----------------------------------------------------------------------

CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.mark.parametrize("messages", [
    [{"role": "tool", "tool_call_id": "c1", "content": "x"}],
    [{"role": "assistant", "content": None, "tool_calls": [CALL]}],
    [{"role": "assistant", "content": None, "tool_calls": [CALL]}, {"role": "user", "content": "hi"},
     {"role": "tool", "tool_call_id": "c1", "content": "late"}],
    [{"role": "assistant", "content": None, "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "c1",
     "content": "x"}, {"role": "tool", "tool_call_id": "c1", "content": "again"}],
    [{"role": "assistant", "content": None, "tool_calls": [{**CALL, "function": {"name": "f"}}]}],
    [{"role": "user", "content": None}],
    [{"role": "bot", "content": "x"}],
])  # fmt: skip
def test_checker_rejects_invalid_sequences(messages: list[J]) -> None:
    with pytest.raises(AssertionError):
        assert_valid_openai_sequence(messages)
