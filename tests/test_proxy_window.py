"""Every request the proxy forwards fits the model's window, and once its session has summaries carries them with
their standing rules, never opening with an assistant message cut from its turn: on small windows, with steps of a
third of the window, through Chat Completions (pi's shape) and Anthropic Messages (Claude Code's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import pytest

from sidecar.testing.provider import FakeProvider
from sidecar.testing.replies import Reply, ToolCall
from tests.helpers.proxy import agent_requests, running_proxy

RULE = "Never edit the generated files under build/ by hand."
SUMMARY_TAG = '<summary id="sum_'
SYSTEM = "You are a careful coding agent."
REPLY_TOKENS = 1024
CHAT_TOOLS = [{"type": "function", "function": {"name": "read", "description": "Read a file.", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
ANTHROPIC_TOOLS = [{"name": "read", "description": "Read a file.", "input_schema": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]


def respond(request: Any) -> Reply:
    """Each prompt reads one file, then answers."""
    if request.tool_result is not None:
        return Reply(text="Read it; what next?")
    return Reply(tool_calls=(ToolCall("read", {"path": "src/parser.py"}),))


def file_text(turn: int, tokens: int) -> str:
    """A file's content of about ``tokens`` tokens (four bytes each)."""
    line = f"x_{turn} = parse(tokens)  # step {turn}\n"
    return line * (tokens * 4 // len(line))


async def chat_session(client: httpx2.AsyncClient, turns: int, step: int) -> None:
    """pi's loop over Chat Completions: the whole conversation resent every time."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for turn in range(turns):
        messages.append({"role": "user", "content": ("" if turn else RULE + " ") + f"Turn {turn}: read the parser."})
        for _ in range(2):
            body = {"model": "fake-model", "messages": messages, "tools": CHAT_TOOLS, "max_tokens": REPLY_TOKENS}
            response = await client.post("/v1/chat/completions", json=body, headers={"x-context-sidecar-session": "s"})
            assert response.status_code == 200, response.text
            message = response.json()["choices"][0]["message"]
            messages.append({k: v for k, v in message.items() if v is not None})
            if not message.get("tool_calls"):
                break
            messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                             "content": file_text(turn, step)})


async def anthropic_session(client: httpx2.AsyncClient, turns: int, step: int) -> None:
    """Claude Code's loop over Anthropic Messages: the whole conversation resent every time."""
    messages: list[dict[str, Any]] = []
    for turn in range(turns):
        text = ("" if turn else RULE + " ") + f"Turn {turn}: read the parser."
        messages.append({"role": "user", "content": [{"type": "text", "text": text}]})
        for _ in range(2):
            body = {"model": "fake-model", "system": SYSTEM, "messages": messages, "tools": ANTHROPIC_TOOLS,
                    "max_tokens": REPLY_TOKENS}
            response = await client.post("/v1/messages", json=body, headers={
                "x-context-sidecar-session": "s", "anthropic-version": "2023-06-01"})
            assert response.status_code == 200, response.text
            content = response.json()["content"]
            messages.append({"role": "assistant", "content": content})
            calls = [block for block in content if block["type"] == "tool_use"]
            if not calls:
                break
            messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0]["id"],
                                                          "content": file_text(turn, step)}]})


def texts(message: dict[str, Any]) -> list[str]:
    content = message["content"]
    if isinstance(content, str):
        return [content]
    return [block.get("text", "") for block in content or () if isinstance(block, dict)]


def has_summary(body: dict[str, Any]) -> bool:
    """Whether a user message of the request is one of the sidecar's summaries."""
    return any(text.startswith(SUMMARY_TAG) for m in body["messages"] if m["role"] == "user" for text in texts(m))


def opens_a_turn(message: dict[str, Any]) -> bool:
    """A user message that is not only tool results (Anthropic's carry them)."""
    return message["role"] == "user" and any(text for text in texts(message))


@pytest.mark.parametrize(("api", "window", "step", "store_target"), [
    ("chat", 16_384, 1_200, "duckdb"), ("chat", 32_768, 1_200, "duckdb"), ("chat", 32_768, 32_768 // 3, "duckdb"),
    ("anthropic", 16_384, 1_200, "duckdb"), ("anthropic", 49_152, 49_152 // 3, "duckdb"),
    # On a team database as the member ALICE (row-level security in every read and write): the small window
    # with many compactions, and the big steps that need a full compaction before a request can go.
    ("chat", 16_384, 1_200, "postgresql"), ("anthropic", 49_152, 49_152 // 3, "postgresql"),
], indirect=["store_target"])
async def test_every_forwarded_request_fits_and_carries_the_summary_and_the_rules(
        tmp_path: Path, runtime: Path, api: str, window: int, step: int, store_target: str) -> None:
    turns = max(12, 3 * window // step // 2)
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    with FakeProvider(responder=respond, context_window=window) as fake:
        async with running_proxy(tmp_path, fake.url, {"contextWindow": window}, env=env, db=store_target) as proxy, \
                httpx2.AsyncClient(base_url=proxy.url, timeout=120) as client:
            await (chat_session if api == "chat" else anthropic_session)(client, turns, step)
    requests = agent_requests(fake)  # not the summary calls the proxy made on the agent's model (#26)
    assert fake.rejected == [] and len(requests) >= 2 * turns, "every request was answered: none over the window"
    first = next((i for i, r in enumerate(requests) if has_summary(r.body)), None)
    assert first is not None and first < len(requests) - turns // 2, "the session compacted early enough to tell"
    later = [r.body for r in requests[first:]]
    without = [i for i, body in enumerate(later) if not has_summary(body)]
    assert without == [], f"{len(without)} of {len(later)} requests after the first compaction carry no summary"
    ruleless = [i for i, body in enumerate(later) if RULE not in json.dumps(body["messages"])]
    assert ruleless == [], f"{len(ruleless)} of {len(later)} requests lack the rule stated in the first turn"
    openings = [next(m for m in body["messages"] if m["role"] != "system") for body in later]
    assert all(opens_a_turn(m) for m in openings), [m["role"] for m in openings]
