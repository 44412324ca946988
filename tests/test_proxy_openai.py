"""The proxy on OpenAI's Responses and Chat Completions APIs, with the official ``openai`` SDK as the agent."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest

from sidecar.testing.provider import FakeProvider
from sidecar.testing.replies import Reply, ToolCall
from tests.helpers.proxy import WAIT, agent_requests, messages_of, reader, running_proxy

WINDOW = 8000
SETTINGS = {"contextWindow": WINDOW,
            "compaction": {"maxTokens": 4000, "reserveTokens": 1500, "freshTail": 6, "keepRecentTokens": 1500}}
TOOL = {"type": "function", "name": "read", "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
CHAT_TOOL = {"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}
SUMMARY = re.compile(r'<summary id=\\"([^"\\]+)')


def _turn(texts: list[str], results: int) -> Reply:
    number = re.search(r"<<u(\d+)>>", texts[-1]).group(1)  # type: ignore[union-attr]
    if results < 2:
        return Reply(tool_calls=(ToolCall("read", {"path": f"src/module_{number}_{results}.py"}),))
    return Reply(text=f"Turn {number} done <<a{number}>>.")


def respond(request: Any) -> Reply:
    """Two tool calls per user turn, then an answer, in whichever API was asked."""
    if request.api == "responses":
        items = request.body["input"]
        asks = [i for i, item in enumerate(items) if item.get("role") == "user" and "<<u" in json.dumps(item)]
        results = sum(1 for item in items[asks[-1]:] if item.get("type") == "function_call_output")
        return _turn([json.dumps(items[asks[-1]])], results)
    messages = request.body["messages"]
    asks = [i for i, m in enumerate(messages) if m["role"] == "user" and "<<u" in str(m["content"])]
    return _turn([str(messages[asks[-1]]["content"])], sum(1 for m in messages[asks[-1]:] if m["role"] == "tool"))


def output(turn: int, step: int) -> str:
    return f"<<t{turn}.{step}>> def parse(tokens):\n" + "    token = tokens.pop()  # keep it\n" * 30


def ask(turn: int) -> str:
    return f"<<u{turn}>> Fix the parser bug number {turn} in src/parser.py; " + "keep the tests green. " * 20


async def responses_agent(client: openai.AsyncOpenAI, turns: int) -> list[dict[str, Any]]:
    """Codex's loop: every input item resent, output items appended as they came."""
    items: list[dict[str, Any]] = [{"type": "message", "role": "developer",
                                    "content": [{"type": "input_text", "text": "You are a careful coding agent."}]}]
    for turn in range(turns):
        items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": ask(turn)}]})
        for step in range(4):
            arguments = {"model": "gpt-5", "input": items, "tools": [TOOL], "store": False,
                         "extra_headers": {"session-id": "codex-like"}}
            if (turn + step) % 2:
                async with client.responses.stream(**arguments) as stream:
                    response = await stream.get_final_response()
            else:
                response = await client.responses.create(**arguments)
            produced = [item.model_dump(exclude_none=True) for item in response.output]
            items += produced
            calls = [item for item in produced if item["type"] == "function_call"]
            if not calls:
                break
            items.append({"type": "function_call_output", "call_id": calls[0]["call_id"], "output": output(turn, step)})
    return items


async def chat_agent(client: openai.AsyncOpenAI, turns: int) -> list[dict[str, Any]]:
    """A Chat Completions agent's loop (pi's shape): every message resent."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful coding agent."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": ask(turn)})
        for step in range(4):
            arguments = {"model": "gpt-4o", "messages": messages, "tools": [CHAT_TOOL],
                         "extra_headers": {"x-context-sidecar-session": "chat-like"}}
            if (turn + step) % 2:
                stream = await client.chat.completions.create(stream=True, **arguments)
                text, calls = "", {}
                async for chunk in stream:
                    delta = chunk.choices[0].delta if chunk.choices else None
                    text += (delta.content or "") if delta else ""
                    for call in (delta.tool_calls or []) if delta else []:
                        entry = calls.setdefault(call.index, {"id": "", "type": "function",
                                                              "function": {"name": "", "arguments": ""}})
                        entry["id"] = call.id or entry["id"]
                        entry["function"]["name"] += call.function.name or ""
                        entry["function"]["arguments"] += call.function.arguments or ""
                message: dict[str, Any] = {"role": "assistant", "content": text or None}
                if calls:
                    message["tool_calls"] = list(calls.values())
            else:
                completion = await client.chat.completions.create(**arguments)
                message = completion.choices[0].message.model_dump(exclude_none=True)
            messages.append(message)
            if not message.get("tool_calls"):
                break
            messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                             "content": output(turn, step)})
    return messages


def unpaired(api: str, elements: list[dict[str, Any]]) -> list[str]:
    """Calls without their outputs and outputs without their calls, in a forwarded conversation."""
    if api == "responses":
        calls = [(i, e["call_id"]) for i, e in enumerate(elements) if e.get("type") == "function_call"]
        outputs = [(i, e["call_id"]) for i, e in enumerate(elements) if e.get("type") == "function_call_output"]
    else:
        calls = [(i, c["id"]) for i, e in enumerate(elements) for c in e.get("tool_calls") or ()]
        outputs = [(i, e["tool_call_id"]) for i, e in enumerate(elements) if e["role"] == "tool"]
    made = {call: index for index, call in calls}
    answered = {call: index for index, call in outputs}
    return [f"call {c}" for c in made if c not in answered] + \
        [f"output {c}" for c, i in answered.items() if c not in made or made[c] > i]


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_a_long_session_fits_the_window_keeps_its_prefix_and_is_stored_once(tmp_path: Path, api: str) -> None:
    key, session = ("input", "codex-like") if api == "responses" else ("messages", "chat-like")
    with FakeProvider(responder=respond, context_window=WINDOW) as fake:
        async with running_proxy(tmp_path, fake.url, SETTINGS) as proxy:
            client = openai.AsyncOpenAI(api_key="sk-test-key", base_url=f"{proxy.url}/v1", max_retries=0)
            history = await (responses_agent(client, 12) if api == "responses" else chat_agent(client, 12))
            async with reader(proxy.db) as sidecar:
                stored = {}
                for token in set(re.findall(r"<<[uta][\d.]+>>", json.dumps(history))):
                    stored[token] = len((await sidecar.grep(session, token, scope="messages",
                                                            case_sensitive=True)).matches)
            assert "sk-test-key" not in proxy.log_text()
    requests = agent_requests(fake)
    assert fake.rejected == []
    bodies = [r.body for r in requests]
    assert all(unpaired(api, body[key]) == [] for body in bodies)
    summaries = [set(SUMMARY.findall(json.dumps(body))) for body in bodies]
    compacted = [index for index in range(1, len(bodies)) if summaries[index] != summaries[index - 1]]
    assert compacted and all(summaries[index] for index in range(compacted[0], len(bodies)))
    for index in range(1, len(requests)):
        if index not in compacted:
            before, after = messages_of(requests[index - 1].raw, key), messages_of(requests[index].raw, key)
            assert after[:len(before)] == before, f"request {index} does not repeat request {index - 1}'s prefix"
    assert stored and all(count == 1 for count in stored.values()), stored


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/chat/completions"])
async def test_bad_bodies_get_openai_s_400_and_upstream_errors_pass_through(tmp_path: Path, path: str) -> None:
    with FakeProvider() as fake:
        fake.script(Reply(status=429, error_message="slow down"))
        async with running_proxy(tmp_path, fake.url) as proxy:
            bad = httpx2.post(f"{proxy.url}{path}", content=b'{"model": "m", "input": ',
                              headers={"content-type": "application/json"}, timeout=WAIT)
            client = openai.AsyncOpenAI(api_key="k", base_url=f"{proxy.url}/v1", max_retries=0)
            with pytest.raises(openai.RateLimitError) as caught:
                if path == "/v1/responses":
                    await client.responses.create(model="m", input=[{"role": "user", "content": "hi"}])
                else:
                    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    assert caught.value.status_code == 429 and "slow down" in str(caught.value)


async def test_a_conversation_kept_by_the_provider_passes_through_untouched(tmp_path: Path) -> None:
    with FakeProvider() as fake:
        async with running_proxy(tmp_path, fake.url) as proxy:
            body = {"model": "m", "previous_response_id": "resp_1", "input": [{"role": "user", "content": "more"}]}
            raw = json.dumps(body, indent=1).encode()
            httpx2.post(f"{proxy.url}/v1/responses", content=raw, headers={"content-type": "application/json"},
                        timeout=WAIT)
    assert fake.model_requests[0].raw == raw


@pytest.mark.parametrize("header", ["session-id", "session_id"])
async def test_codex_s_session_header_in_either_spelling_names_the_session(tmp_path: Path, header: str) -> None:
    with FakeProvider(responder=lambda request: "ok") as fake:
        async with running_proxy(tmp_path, fake.url) as proxy:
            client = openai.AsyncOpenAI(api_key="k", base_url=f"{proxy.url}/v1", max_retries=0)
            await client.responses.create(model="gpt-5", input=[{"role": "user", "content": "hi"}], tools=[TOOL],
                                          store=False, extra_headers={header: "codex-thread"})
            async with reader(proxy.db) as sidecar:
                sessions = [s.session_id for s in (await sidecar.sessions()).sessions]
    assert sessions == ["codex-thread"]


async def test_conversations_with_one_system_prompt_and_no_session_header_are_sessions_of_their_own(
        tmp_path: Path) -> None:
    with FakeProvider(responder=lambda request: "ok") as fake:
        async with running_proxy(tmp_path, fake.url) as proxy:
            client = openai.AsyncOpenAI(api_key="k", base_url=f"{proxy.url}/v1", max_retries=0)
            for task in ("<<one>> fix the parser", "<<two>> write the docs"):
                history: list[Any] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": task}]
                for _ in range(2):
                    reply = await client.chat.completions.create(model="gpt-4o", messages=history)
                    history += [{"role": "assistant", "content": reply.choices[0].message.content},
                                {"role": "user", "content": "go on"}]
            async with reader(proxy.db) as sidecar:
                sessions = {s.session_id: s.messages for s in (await sidecar.sessions()).sessions}
    assert sorted(sessions.values()) == [5, 5]  # system, ask, answer, ask, answer: one session each, no branch
    assert all(name.startswith("proxy-") and "~" not in name for name in sessions)
