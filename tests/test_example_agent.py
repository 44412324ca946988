"""examples/chat_agent.py as a subprocess against a local OpenAI-compatible server, with scripted stdin."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from sidecar.testing import FakeOpenAIServer, RecordedRequest, Reply

AGENT = Path(__file__).resolve().parents[1] / "examples" / "chat_agent.py"
AGENT_SYSTEM = "You are a concise, helpful assistant."
SUMMARY = "SUMMARY: Ada asked to remember her name and the number 42."
SETTINGS = {"compaction": {"freshTail": 2, "leafChunkSize": 2}}
USAGE = re.compile(r"^(?:> )*\[context: ([\d,]+) tokens of 4,000 \([\d.]+%\), (\w+), (\w+)\]$", re.MULTILINE)


def reply_to(request: RecordedRequest) -> str:
    """The agent gets an echo of its last message; anything else is the sidecar asking for a summary."""
    messages = request.body["messages"]
    if messages[0]["content"] == AGENT_SYSTEM:
        return f"Noted ({len(messages)} messages): {messages[-1]['content'][:40]}"
    return SUMMARY


def chat(server: FakeOpenAIServer, db: Path, lines: list[str]) -> subprocess.CompletedProcess[str]:
    """Run the agent on these input lines."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    argv = [sys.executable, str(AGENT), "--base-url", server.base_url, "--model", "fake-model", "--db", str(db),
            "--session", "chat-1", "--context-window", "4000", "--settings", json.dumps(SETTINGS)]
    return subprocess.run(argv, input="".join(f"{line}\n" for line in lines), capture_output=True, text=True,
                          env=env, timeout=60, check=False)


def agent_calls(server: FakeOpenAIServer) -> list[list[dict[str, Any]]]:
    """The messages of each chat call the agent made, in order."""
    return [r.body["messages"] for r in server.chat_requests if r.body["messages"][0]["content"] == AGENT_SYSTEM]


def provider_total(messages: list[dict[str, Any]], reply: str) -> int:
    """What the fake server reports for a call: prompt and completion characters / 4, each rounded down."""
    return sum(len(str(m.get("content") or "")) for m in messages) // 4 + len(reply) // 4


def test_the_chat_agent_keeps_its_history_in_the_sidecar_compacts_on_request_and_resumes(tmp_path: Path) -> None:
    db = tmp_path / "chat.duckdb"
    turns = [(f"turn {i}: please remember that my name is Ada and the number is 42. " * 3).strip() for i in range(4)]
    with FakeOpenAIServer(responder=reply_to) as server:
        result = chat(server, db, [*turns, "/compact keep the names", "what is my name?", "/usage", "/quit"])
        assert result.returncode == 0, result.stderr
        calls = agent_calls(server)
        summary_calls = [r.body for r in server.chat_requests if r.body["messages"][0]["content"] != AGENT_SYSTEM]

    out = result.stdout
    assert len(calls) == 5
    first_reply = f"Noted (2 messages): {turns[0][:40]}"
    assert calls[0] == [{"role": "system", "content": AGENT_SYSTEM}, {"role": "user", "content": turns[0]}]
    # The second call carries the first turn, which only the sidecar kept.
    assert calls[1] == [*calls[0], {"role": "assistant", "content": first_reply}, {"role": "user", "content": turns[1]}]
    assert f"assistant: {first_reply}" in out

    usage = USAGE.findall(out)
    assert len(usage) == 7  # five turns, /compact, /usage
    replies = re.findall(r"^(?:> )*assistant: (.*)$", out, re.MULTILINE)
    turn_usage = [usage[i] for i in (0, 1, 2, 3, 5)]
    for messages, reply, (tokens, state, source) in zip(calls, replies, turn_usage, strict=True):
        assert (int(tokens.replace(",", "")), state, source) == (provider_total(messages, reply), "ok", "provider")

    assert summary_calls and all("Additionally: keep the names" in json.dumps(b["messages"]) for b in summary_calls)
    compaction = re.search(r"^(?:> )*\[manual incremental compaction: ([\d,]+) -> ([\d,]+) tokens\]$", out,
                           re.MULTILINE)
    assert compaction and int(compaction.group(2).replace(",", "")) < int(compaction.group(1).replace(",", ""))
    assert usage[4][2] == "estimate", "right after compacting, the figure is the sidecar's own estimate"
    after = calls[4]
    assert after[1]["role"] == "user" and after[1]["content"].startswith("<summary ") and SUMMARY in after[1]["content"]
    assert len(after) < len(calls[3]) + 2 and after[-1] == {"role": "user", "content": "what is my name?"}
    assert usage[6] == usage[5], "/usage shows the figure of the last turn"

    with FakeOpenAIServer(responder=reply_to) as server:
        again = chat(server, db, ["and the number?"])
        assert again.returncode == 0, again.stderr
        resumed = agent_calls(server)[0]
    last_reply = {"role": "assistant", "content": f"Noted ({len(after)} messages): what is my name?"}
    assert resumed[1:] == [*after[1:], last_reply, {"role": "user", "content": "and the number?"}], "resumed"


SECRET = "The deploy key hint is BLUE-HERON-42."


def tool_using_model(request: RecordedRequest) -> Reply | str:
    """Asked about the hint, the fake model searches with memory_grep, then answers from the tool result."""
    messages = request.body["messages"]
    if messages[0]["content"] != AGENT_SYSTEM:
        return "SUMMARY: the user shared some notes."
    last = messages[-1]
    if last["role"] == "tool":
        found = "BLUE-HERON-42" if "BLUE-HERON-42" in last["content"] else "nothing"
        return f"From my memory tools: {found}."
    if "hint" in str(last["content"]) and "memory_grep" in json.dumps(request.body.get("tools")):
        return Reply(text="", tool_calls=(("call_7", "memory_grep", '{"pattern": "blue-heron"}'),))
    return "Noted."


def test_the_chat_agents_model_searches_compacted_history_with_the_memory_tools(tmp_path: Path) -> None:
    db = tmp_path / "chat.duckdb"
    lines = [f"note {i}: {SECRET if i == 0 else 'nothing special today, just chatting along.'}" for i in range(5)]
    with FakeOpenAIServer(responder=tool_using_model) as server:
        result = chat(server, db, [*lines, "/compact", "what was the deploy key hint?", "/quit"])
        assert result.returncode == 0, result.stderr
        calls = agent_calls(server)
    out = result.stdout
    assert "[manual incremental compaction:" in out
    before_tool, after_tool = calls[-2], calls[-1]
    assert all(SECRET not in str(m.get("content")) for m in before_tool), "the note was compacted away"
    assert '[tool memory_grep {"pattern": "blue-heron"}]' in out
    call, answer = after_tool[-2:]
    assert call["role"] == "assistant" and call["tool_calls"][0]["id"] == "call_7"
    assert answer["role"] == "tool" and answer["tool_call_id"] == "call_7" and "BLUE-HERON-42" in answer["content"]
    assert "compacted into sum_" in answer["content"]
    assert "assistant: From my memory tools: BLUE-HERON-42." in out
