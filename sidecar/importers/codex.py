"""Parser for Codex CLI rollouts (~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl), old and new layout."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from sidecar.importers.common import (
    AgentCompaction,
    ParsedTranscript,
    base_metadata,
    blocks_to_text,
    image_part,
    iter_json_lines,
    parsed,
    parts_content,
    reasoning_text,
    stable_id,
    tool_call,
)
from sidecar.importers.detect import CODEX_ENVELOPES

SOURCE = "codex"
# Response items with nothing to import: server-side search, undo snapshots, and encrypted compaction state.
_SILENT_ITEMS = {
    "web_search_call",
    "ghost_snapshot",
    "compaction",
    "compaction_summary",
    "other",
}
_ROLES = {"user": "user", "assistant": "assistant", "developer": "system", "system": "system"}
_INJECTED_PREFIXES = ("<environment_context>", "<user_instructions>", "# AGENTS.md instructions")
# Codex hands its summary on behind this preface (its SUMMARY_PREFIX); the summary is what follows it.
_SUMMARY_PREFACE = re.compile(r"^Another language model started to solve this problem.*?analysis:[ \t]*\n", re.DOTALL)
# How exec outputs state their exit code: "Exit code: 1" (0.4x and later), "Process exited with code 1".
_EXIT_CODE = re.compile(r"^(?:Exit code:|Process exited with code)\s*(-?\d+)", re.MULTILINE)


class _State:
    """What the parser knows while it walks the file."""

    def __init__(self) -> None:
        """Start with an empty conversation."""
        self.skipped: list[str] = []
        self.messages: list[dict[str, Any]] = []
        self.meta: dict[str, Any] | None = None
        self.model: str | None = None
        self.awaiting_usage: dict[str, Any] | None = None
        self.reasoning: list[str] = []
        """Reasoning summaries waiting for the assistant message they precede."""
        self.encrypted: int = 0
        self.reasoning_lines: list[int] = []
        self.exit_codes: dict[str, int] = {}
        self.outputs: dict[str, dict[str, Any]] = {}
        self.lines: dict[int, str] = {}
        self.compactions: list[AgentCompaction] = []
        self.context_lines: list[int] = []


def parse(path: Path, follow: bool = False) -> ParsedTranscript:
    """Parse a Codex rollout JSONL file."""
    state = _State()
    first = True
    for lineno, raw, obj in iter_json_lines(path, state.skipped, state.lines, follow):
        kind = obj.get("type")
        where = f"line {lineno}"
        if kind in CODEX_ENVELOPES and "payload" in obj:
            _envelope(state, lineno, raw, obj)
        elif first and kind is None and isinstance(obj.get("id"), str) and "timestamp" in obj:
            state.meta = obj  # The old layout opens with the bare session meta.
            state.context_lines.append(lineno)
        elif obj.get("record_type") == "state":
            state.skipped.append(f"{where}: resume state (old layout), not conversation")
        elif "payload" in obj:
            state.skipped.append(f"{where}: unknown rollout line type {kind!r}")
        elif isinstance(kind, str) and kind not in CODEX_ENVELOPES:
            _response_item(state, lineno, raw, obj, None)
        else:
            state.skipped.append(f"{where}: unknown line (type {kind!r})")
        first = False
    if state.reasoning or state.encrypted:
        state.skipped.append("end of file: reasoning with no assistant message after it yet")
    return parsed(SOURCE, state.messages, state.skipped, state.lines, state.compactions, session=_session(state),
                  suggested_session_id=_session_id(state.meta), context_lines=state.context_lines)


def _envelope(state: _State, lineno: int, raw: str, obj: dict[str, Any]) -> None:
    """Handle one {timestamp, type, payload} line."""
    payload = obj["payload"]
    kind = obj["type"]
    if not isinstance(payload, dict):
        state.skipped.append(f"line {lineno}: {kind} line whose payload is not an object")
        return
    if kind in ("session_meta", "turn_context"):
        state.context_lines.append(lineno)
    if kind == "session_meta":
        if state.meta is None:
            state.meta = payload
    elif kind == "turn_context":
        if isinstance(payload.get("model"), str) and payload["model"]:
            state.model = payload["model"]
    elif kind == "response_item":
        _response_item(state, lineno, raw, payload, obj.get("timestamp"))
    elif kind == "compacted":
        summary = payload.get("message")
        if isinstance(summary, str) and summary.strip():
            text = _SUMMARY_PREFACE.sub("", summary, count=1).strip() or summary.strip()
            state.compactions.append(AgentCompaction(id=stable_id(SOURCE, lineno, raw), summary=text, line=lineno))
        else:
            state.skipped.append(f"line {lineno}: compacted line without a summary message")
    elif kind == "event_msg" and payload.get("type") == "token_count":
        _token_count(state, payload)
    elif kind == "event_msg" and payload.get("type") == "exec_command_end":
        _exit_code(state, payload.get("call_id"), payload.get("exit_code"))


def _response_item(state: _State, lineno: int, raw: str, item: dict[str, Any], timestamp: Any) -> None:
    """Turn one ResponseItem into a message, a tool call, or nothing."""
    kind = item.get("type")
    where = f"line {lineno}"
    msg_id = stable_id(SOURCE, lineno, raw)
    if kind == "message":
        _message(state, msg_id, where, item, timestamp)
    elif kind == "function_call":
        _call(state, msg_id, where, timestamp, item.get("call_id"), item.get("name"), item.get("arguments"))
    elif kind == "custom_tool_call":
        arguments = {"input": item.get("input")}
        _call(state, msg_id, where, timestamp, item.get("call_id"), item.get("name"), arguments)
    elif kind == "local_shell_call":
        call_id = item.get("call_id") or item.get("id")
        _call(state, msg_id, where, timestamp, call_id, "local_shell", item.get("action"))
    elif kind in ("function_call_output", "custom_tool_call_output"):
        _output(state, msg_id, where, item, timestamp)
    elif kind == "reasoning":
        _reasoning(state, item)
        state.reasoning_lines.append(lineno)
    elif kind not in _SILENT_ITEMS:
        state.skipped.append(f"{where}: unknown response item type {kind!r}")


def _message(state: _State, msg_id: str, where: str, item: dict[str, Any], timestamp: Any) -> None:
    """A user, assistant, developer or system message."""
    role = _ROLES.get(str(item.get("role")))
    content = item.get("content")
    if role is None or not isinstance(content, list):
        state.skipped.append(f"{where}: message with role {item.get('role')!r} or content not understood")
        return
    texts: list[str] = []
    parts: list[dict[str, Any]] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("text"), str):
            texts.append(part["text"])
            parts.append({"type": "text", "text": part["text"]})
        elif "image" in str(part.get("type", "")):
            parts.append(image_part(None, None, part.get("image_url")) or {"type": "text", "text": "[image]"})
    body = parts_content(parts)
    if body is None:
        return
    facts: dict[str, Any] = {}
    if role == "assistant":
        facts["model"] = state.model
    first_text = texts[0] if texts else ""
    if role == "user" and first_text.lstrip().startswith(_INJECTED_PREFIXES):
        facts["injected"] = True  # Context Codex adds itself (environment, AGENTS.md), not typed by the user.
    msg: dict[str, Any] = {"role": role, "content": body, "id": msg_id,
                           "metadata": base_metadata(SOURCE, timestamp, **facts)}
    msg["_where"] = where
    msg["_lines"] = [int(where.split()[1])]
    state.messages.append(msg)
    if role == "assistant":
        _take_reasoning(state, msg)
        state.awaiting_usage = msg


def _call(
    state: _State, msg_id: str, where: str, timestamp: Any, call_id: Any, name: Any, arguments: Any
) -> None:
    """A tool call, attached to the assistant message right before it or to a new one."""
    if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
        state.skipped.append(f"{where}: tool call without a call_id or name")
        return
    last = state.messages[-1] if state.messages else None
    if last is None or last["role"] != "assistant":
        last = {
            "role": "assistant",
            "content": None,
            "id": msg_id,
            "metadata": base_metadata(SOURCE, timestamp, model=state.model),
            "_where": where,
            "_lines": [],
        }
        state.messages.append(last)
    last.setdefault("tool_calls", []).append(tool_call(call_id, name, arguments))
    last.setdefault("_lines", []).append(int(where.split()[1]))
    _take_reasoning(state, last)
    state.awaiting_usage = last


def _output(state: _State, msg_id: str, where: str, item: dict[str, Any], timestamp: Any) -> None:
    """A tool result."""
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        state.skipped.append(f"{where}: tool output without a call_id")
        return
    output = item.get("output")
    facts: dict[str, Any] = {}
    if isinstance(output, str) and output.startswith("{"):
        try:  # exec and apply_patch outputs of 0.2x-0.3x: {"output": ..., "metadata": {"exit_code": ...}}
            decoded = json.loads(output)
        except (json.JSONDecodeError, RecursionError):
            decoded = None
        if isinstance(decoded, dict) and isinstance(decoded.get("metadata"), dict) and "output" in decoded:
            code = decoded["metadata"].get("exit_code")
            if isinstance(code, int):
                facts["exitCode"] = code
    if isinstance(output, dict):
        # Older rollouts stored {content, success}; newer ones a string or a list of content items.
        if output.get("success") is False:
            facts["isError"] = True
        output = output.get("content")
    text = blocks_to_text(output)
    if "exitCode" not in facts and (found := _EXIT_CODE.search(text[:400])):
        facts["exitCode"] = int(found.group(1))
    if "exitCode" not in facts and call_id in state.exit_codes:
        facts["exitCode"] = state.exit_codes[call_id]
    if facts.get("exitCode"):
        facts["isError"] = True
    msg = {
        "role": "tool",
        "tool_call_id": call_id,
        "content": text,
        "id": msg_id,
        "metadata": base_metadata(SOURCE, timestamp, **facts),
        "_where": where,
        "_lines": [int(where.split()[1])],
    }
    state.messages.append(msg)
    state.outputs[call_id] = msg


def _exit_code(state: _State, call_id: Any, code: Any) -> None:
    """An exec_command_end event: the command's exit code, for its output before or after it."""
    if not isinstance(call_id, str) or not isinstance(code, int) or isinstance(code, bool):
        return
    state.exit_codes[call_id] = code
    output = state.outputs.get(call_id)
    if output is not None and "exitCode" not in output["metadata"]:
        output["metadata"]["exitCode"] = code
        if code:
            output["metadata"]["isError"] = True


def _reasoning(state: _State, item: dict[str, Any]) -> None:
    """A reasoning item: its readable summary (and text, when not encrypted) goes with the next assistant message."""
    for key in ("summary", "content"):
        for part in item.get(key) or ():
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                state.reasoning.append(part["text"])
    if item.get("encrypted_content"):
        state.encrypted += 1


def _take_reasoning(state: _State, msg: dict[str, Any]) -> None:
    """Attach the waiting reasoning to an assistant message."""
    if state.reasoning:
        joined = reasoning_text([msg.get("reasoning") or "", *state.reasoning])
        if joined:
            msg["reasoning"] = joined
    if state.encrypted:
        msg["metadata"]["encryptedReasoning"] = msg["metadata"].get("encryptedReasoning", 0) + state.encrypted
    msg.setdefault("_lines", []).extend(state.reasoning_lines)
    msg["_lines"].sort()
    state.reasoning = []
    state.encrypted = 0
    state.reasoning_lines = []


def _token_count(state: _State, payload: dict[str, Any]) -> None:
    """Attach the last model call's token usage to the assistant message it produced."""
    info = payload.get("info")
    last = info.get("last_token_usage") if isinstance(info, dict) else None
    target = state.awaiting_usage
    if not isinstance(last, dict) or target is None:
        return
    numbers = {k: v for k, v in last.items() if isinstance(v, int)}
    cached = numbers.get("cached_input_tokens", 0)
    # OpenAI counts cached tokens inside input_tokens; keep input and cacheRead disjoint as pi does.
    usage = {"input": max(numbers.get("input_tokens", 0) - cached, 0), "cacheRead": cached}
    if "output_tokens" in numbers:
        usage["output"] = numbers["output_tokens"]
    target["metadata"]["usage"] = usage
    state.awaiting_usage = None


def _session_id(meta: dict[str, Any] | None) -> str | None:
    """The rollout's own session id."""
    if not meta:
        return None
    for key in ("id", "session_id", "thread_id"):
        if isinstance(meta.get(key), str) and meta[key]:
            return meta[key]
    return None


def _session(state: _State) -> dict[str, Any]:
    """Session facts: model, working directory, source id, CLI version, git branch."""
    session: dict[str, Any] = {}
    meta = state.meta or {}
    model = state.model or meta.get("model")
    if isinstance(model, str) and model:
        session["model"] = model
    facts: dict[str, Any] = {}
    source_id = _session_id(meta)
    if source_id:
        facts["sourceSessionId"] = source_id
    for key, out in (("cwd", "cwd"), ("cli_version", "cliVersion"), ("originator", "originator")):
        if isinstance(meta.get(key), str) and meta[key]:
            facts[out] = meta[key]
    git = meta.get("git")
    if isinstance(git, dict) and isinstance(git.get("branch"), str):
        facts["gitBranch"] = git["branch"]
    if facts:
        session["metadata"] = facts
    return session
