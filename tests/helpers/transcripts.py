"""Sample transcripts in each supported format, shaped like the real tools' files, with the awkward cases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TS = "2026-01-03T10:00:00.000Z"
J = dict[str, Any]


def write_jsonl(path: Path, entries: list[Any]) -> Path:
    """Write entries one per line; strings are written as they are (for corrupt lines)."""
    path.write_text("".join((e if isinstance(e, str) else json.dumps(e)) + "\n" for e in entries))
    return path


def text(t: str) -> J:
    """A text content block."""
    return {"type": "text", "text": t}


# --- pi ---------------------------------------------------------------------------------------

PI_USAGE = {"input": 10, "output": 5, "cacheRead": 100, "cacheWrite": 7, "cost": {"total": 0.01}}


def pi(eid: str, parent: str | None, role: str, content: Any, **extra: Any) -> J:
    """A version-3 pi message entry; assistant messages get provider facts and usage."""
    message = {"role": role, "content": content, "timestamp": 1767434400000, **extra}
    if role == "assistant":
        message = {"api": "anthropic-messages", "provider": "anthropic", "model": "claude-sonnet-4-5",
                   "usage": PI_USAGE, "stopReason": "toolUse", **message}  # fmt: skip
    return {"type": "message", "id": eid, "parentId": parent, "timestamp": TS, "message": message}


def pi_result(eid: str, parent: str, call_id: str, *blocks: J) -> J:
    """A pi toolResult entry."""
    return pi(eid, parent, "toolResult", list(blocks), toolCallId=call_id, toolName="read", isError=False)


def pi_entry(kind: str, eid: str, parent: str, **fields: Any) -> J:
    """A non-message pi entry."""
    return {"type": kind, "id": eid, "parentId": parent, "timestamp": TS, **fields}


def write_pi_sample(path: Path) -> Path:
    """pi v3 session sess-pi-3 (7 messages): branch, thinking, aborted call, orphan result, bad lines 9-10."""
    read = {"type": "toolCall", "id": "call_read", "name": "read", "arguments": {"path": "a.py"}}
    edit = {"type": "toolCall", "id": "call_edit", "name": "edit", "arguments": {"path": "a.py"}}
    return write_jsonl(path, [
        {"type": "session", "version": 3, "id": "sess-pi-3", "timestamp": TS, "cwd": "/srv/dev/proj"},
        pi_entry("model_change", "e0", None, provider="anthropic", modelId="claude-sonnet-4-5"),
        pi("e1", "e0", "user", [text("read a.py"), {"type": "image", "data": "AA", "mimeType": "image/png"}]),
        pi("e2", "e1", "assistant", [{"type": "thinking", "thinking": "SECRET-PI-IDEA"}, text("Ok."), read]),
        pi_result("e3", "e2", "call_read", text("print(1)"), {"type": "image", "data": "B"}),
        pi("x1", "e3", "user", "abandoned question"),
        pi("x2", "x1", "assistant", [text("abandoned answer")], stopReason="stop"),
        pi_entry("branch_summary", "e4", "e3", fromId="x2", summary="Tried something else."),
        "{not json at all",
        pi_entry("fancy_new_entry", "e5", "e4"),
        pi_result("e6", "e5", "call_ghost", text("orphan output")),
        pi("e7", "e6", "assistant", [edit], stopReason="aborted"),
        pi("e8", "e7", "assistant", [], stopReason="aborted", errorMessage="Request was aborted"),
        pi_entry("custom_message", "e9", "e8", customType="note", content="extension note", display=True),
        pi_entry("session_info", "e10", "e9", name="Fix a.py"),
    ])  # fmt: skip


# --- Claude Code ------------------------------------------------------------------------------

CC_USAGE = {"input_tokens": 3, "cache_creation_input_tokens": 857, "cache_read_input_tokens": 36761,
            "output_tokens": 12, "service_tier": "standard"}  # fmt: skip


def cc(kind: str, uuid: str, parent: str | None, message: J, **extra: Any) -> J:
    """A Claude Code user or assistant entry with the usual envelope."""
    return {"parentUuid": parent, "isSidechain": False, "userType": "external", "cwd": "/repo",
            "sessionId": "cc-sess", "version": "2.0.76", "gitBranch": "main", "type": kind,
            "message": message, "uuid": uuid, "timestamp": TS, **extra}  # fmt: skip


def cc_user(uuid: str, parent: str | None, content: Any, **extra: Any) -> J:
    """A Claude Code user entry."""
    return cc("user", uuid, parent, {"role": "user", "content": content}, **extra)


def cc_asst(uuid: str, parent: str, msg_id: str, block: J, stop: str | None = None, **extra: Any) -> J:
    """One streamed piece (one content block) of a Claude Code assistant response."""
    message = {"model": "claude-opus-4-5-20251101", "id": msg_id, "type": "message", "role": "assistant",
               "content": [block], "stop_reason": stop, "stop_sequence": None, "usage": CC_USAGE}  # fmt: skip
    return cc("assistant", uuid, parent, message, requestId=f"req_{msg_id}", **extra)


def use(call_id: str, name: str, **args: Any) -> J:
    """A tool_use block."""
    return {"type": "tool_use", "id": call_id, "name": name, "input": args}


def result(call_id: str, content: Any, **extra: Any) -> J:
    """A tool_result block."""
    return {"type": "tool_result", "tool_use_id": call_id, "content": content, **extra}


def write_claude_sample(path: Path) -> Path:
    """Claude Code session cc-sess (11 messages): streaming, sidechain, rewind, retry, compaction, damage."""
    read = cc_asst("a3", "a2", "msg_1", use("toolu_read", "Read", file_path="parser.py"))
    return write_jsonl(path, [
        {"type": "summary", "summary": "Fix the parser", "leafUuid": "a7"},
        {"type": "summary", "summary": "Somebody else's session", "leafUuid": "not-here"},
        {"type": "file-history-snapshot", "messageId": "u1", "snapshot": {}, "isSnapshotUpdate": False},
        cc_user("u1", None, "fix parser.py"),
        cc_asst("a1", "u1", "msg_1", {"type": "thinking", "thinking": "SECRET-CC-THOUGHT", "signature": "x"}),
        cc_asst("a2", "a1", "msg_1", text("Let me look.")),
        read,
        read,
        cc_asst("a4", "a3", "msg_1", use("toolu_bash", "Bash", command="pytest"), stop="tool_use"),
        cc_user("u2", "a4", [result("toolu_read", "def parse(): ...")], toolUseResult={"type": "text"}),
        cc_user("u3", "a4", [result("toolu_bash", [text("1 failed"), {"type": "image"}], is_error=True)]),
        {"type": "progress", "uuid": "p1", "parentUuid": "u3", "data": {"type": "hook_progress"}},
        cc_asst("a5", "p1", "msg_2", text("One test fails."), stop="end_turn"),
        cc_user("s1", "a5", "explore the repo", isSidechain=True, agentId="ab12"),
        cc_asst("s2", "s1", "msg_s", text("sidechain reply"), isSidechain=True, agentId="ab12"),
        cc_user("x1", "a5", "abandoned prompt"),
        cc_asst("x2", "x1", "msg_x", text("abandoned reply"), stop="end_turn"),
        '{"type": "user", "uuid": "broken',
        {"type": "x-future-entry", "uuid": "f1", "parentUuid": None},
        {"type": "system", "subtype": "compact_boundary", "uuid": "cb", "parentUuid": None,
         "logicalParentUuid": "a5", "content": "Conversation compacted"},
        cc_user("cs", "cb", "This session is being continued from a previous one.", isCompactSummary=True),
        cc_user("u4", "cs", "<local-command-caveat>Caveat: ...</local-command-caveat>", isMeta=True),
        cc_user("u5", "u4", [result("toolu_ghost", "orphan"), text("also rename it")]),
        cc_asst("e1", "u5", "msg_e", text("API Error: 529"), isApiErrorMessage=True),
        cc_asst("a6", "e1", "msg_3", use("toolu_edit", "Edit", file_path="parser.py")),
        cc_user("u6", "a6", [text("[Request interrupted by user for tool use]")]),
        cc_asst("a7", "u6", "msg_4", text("Stopped (first try)."), stop="end_turn"),
        cc_asst("a7", "u6", "msg_4", text("Stopped."), stop="end_turn"),
        {"type": "system", "subtype": "turn_duration", "uuid": "t1", "parentUuid": "a7", "durationMs": 5},
    ])  # fmt: skip


# --- Codex CLI --------------------------------------------------------------------------------


def cx(kind: str, payload: J, ts: str = TS) -> J:
    """A rollout line in the current {timestamp, type, payload} layout."""
    return {"timestamp": ts, "type": kind, "payload": payload}


def cx_msg(role: str, *texts: str) -> J:
    """A response_item message payload."""
    part = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": part, "text": t} for t in texts]}


def cx_call(call_id: str, name: str = "shell", arguments: str = '{"command":["ls"]}') -> J:
    """A function_call payload."""
    return {"type": "function_call", "name": name, "arguments": arguments, "call_id": call_id}


def cx_out(call_id: str, output: Any) -> J:
    """A function_call_output payload."""
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def token_count(inp: int, cached: int, out: int) -> J:
    """A token_count event."""
    usage = {"input_tokens": inp, "cached_input_tokens": cached, "output_tokens": out}
    return cx("event_msg", {"type": "token_count", "info": {"last_token_usage": usage}})


def write_codex_sample(path: Path) -> Path:
    """Codex rollout 0199-codex (11 messages): parallel calls, reasoning, usage, interrupted call, damage."""
    reasoning = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "SECRET-CODEX-PLAN"}],
                 "encrypted_content": "gAAA"}  # fmt: skip
    return write_jsonl(path, [
        cx("session_meta", {"id": "0199-codex", "timestamp": TS, "cwd": "/repo", "originator": "codex_cli_rs",
                            "cli_version": "0.46.0", "instructions": None, "git": {"branch": "main"}}),
        cx("response_item", cx_msg("developer", "<permissions instructions>")),
        cx("response_item", cx_msg("user", "<environment_context>cwd=/repo</environment_context>")),
        cx("response_item", cx_msg("user", "list files and run tests")),
        cx("event_msg", {"type": "user_message", "message": "list files and run tests", "kind": "plain"}),
        cx("turn_context", {"cwd": "/repo", "approval_policy": "never", "model": "gpt-5-codex"}),
        cx("response_item", reasoning),
        cx("response_item", cx_msg("assistant", "Listing and testing.")),
        cx("response_item", cx_call("call_ls")),
        cx("response_item", cx_call("call_test", arguments='{"command":["pytest"]}')),
        cx("response_item", cx_out("call_test", [{"type": "input_text", "text": "2 passed"}])),
        cx("response_item", cx_out("call_ls", "a.py\nb.py")),
        token_count(1200, 1000, 40),
        cx("response_item", {"type": "custom_tool_call", "call_id": "call_patch", "name": "apply_patch",
                             "input": "*** Begin Patch"}),
        cx("response_item", {"type": "custom_tool_call_output", "call_id": "call_patch", "output": "Done!"}),
        cx("response_item", {"type": "local_shell_call", "call_id": "call_sh", "status": "in_progress",
                             "action": {"type": "exec", "command": ["sleep", "99"]}}),
        cx("event_msg", {"type": "turn_aborted", "reason": "interrupted"}),
        "]]] garbage",
        cx("response_item", cx_out("call_nobody", "stray output")),
        cx("response_item", {"type": "image_generation_call", "id": "ig_1"}),
        cx("mystery_envelope", {}),
        cx("response_item", cx_msg("assistant", "All done.")),
    ])  # fmt: skip
