"""Shapes the real agents send (Claude Code 2.1.197, Codex 0.169.0; tests/agents has the agents themselves): side calls
under the agent's session id, system entries mid-conversation, reasoning items, a conversation found after a restart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai

from sidecar.testing.provider import FakeProvider
from tests.helpers.proxy import WAIT, reader, running_proxy

TOOLS = [{"name": "Bash", "description": "Run a command.",
          "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]
TITLE = {"model": "claude-haiku-4-5", "max_tokens": 512, "stream": False,
         "system": [{"type": "text", "text": "Generate a concise, sentence-case title (3-7 words)."}],
         "messages": [{"role": "user", "content": [{"type": "text", "text": "<session>\nfix the parser\n</session>"}]}],
         "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


async def test_an_agent_s_side_call_under_its_session_id_is_forwarded_as_sent_and_not_stored(tmp_path: Path) -> None:
    headers = {"x-claude-code-session-id": "cc-main", "x-api-key": "k", "anthropic-version": "2023-06-01"}
    with FakeProvider(responder=lambda request: "answer") as fake:
        async with running_proxy(tmp_path, fake.url) as proxy:
            title = json.dumps(TITLE, separators=(",", ":")).encode()
            # Claude Code asks for a title first, under its session id.
            async with httpx2.AsyncClient(timeout=WAIT) as http:
                sent = await http.post(f"{proxy.url}/v1/messages", content=title, headers=headers)
            client = anthropic.AsyncAnthropic(api_key="k", base_url=proxy.url, max_retries=0)
            history = [user("fix the parser")]
            for step in range(2):
                reply = await client.messages.create(model="claude-sonnet-4-5", max_tokens=50, messages=history,
                                                     tools=TOOLS, extra_headers={"x-claude-code-session-id": "cc-main"})
                history += [{"role": "assistant", "content": reply.content[0].text},  # type: ignore[union-attr]
                            user(f"step {step} done")]
            stats = (await http_get(f"{proxy.url}/stats"))["sessions"]
            async with reader(proxy.db) as sidecar:
                sessions = {s.session_id: s.messages for s in (await sidecar.sessions()).sessions}
    assert sent.status_code == 200 and fake.requests[0].raw == title
    assert sessions == {"cc-main": 4}  # the conversation, under the agent's own id; not the title call
    assert [(s["sessionId"], s["requests"], s["sideRequests"]) for s in stats] == [("cc-main", 2, 1)]


async def http_get(url: str) -> Any:
    async with httpx2.AsyncClient(timeout=WAIT) as http:
        return (await http.get(url)).json()


async def test_a_conversation_stored_as_a_branch_is_found_again_by_a_restarted_proxy(tmp_path: Path) -> None:
    first = [user("<<subagent>> explore the repository")]  # another conversation took the session id first
    main = [user("<<main>> fix the parser")]
    with FakeProvider(responder=lambda request: "done") as fake:
        for run in range(2):
            async with running_proxy(tmp_path, fake.url) as proxy:
                client = anthropic.AsyncAnthropic(api_key="k", base_url=proxy.url, max_retries=0)
                for history in ((first, main) if run == 0 else (main,)):
                    reply = await client.messages.create(model="m", max_tokens=5, messages=history, tools=TOOLS,
                                                         extra_headers={"x-claude-code-session-id": "cc-two"})
                    history += [{"role": "assistant", "content": reply.content[0].text},  # type: ignore[union-attr]
                                user(f"run {run} goes on")]
        async with reader(tmp_path / "proxy.duckdb") as sidecar:
            sessions = {s.session_id: s.messages for s in (await sidecar.sessions()).sessions}
    assert sessions.pop("cc-two") == 2  # the first conversation: its ask and answer
    assert list(sessions.values()) == [4]  # the main one: one branch over both runs, each message once


async def test_a_system_entry_the_budget_keeps_first_gets_a_user_message_before_it(tmp_path: Path) -> None:
    settings = {"contextWindow": 4000, "compaction": {"auto": False, "reserveTokens": 500, "freshTail": 2},
                "prune": {"enabled": False}}
    history: list[dict[str, Any]] = [user("<<opening>> " + "a long description of the parser. " * 250),
                                      {"role": "system", "content": "Always answer in French."}]
    with FakeProvider(responder=lambda request: "d'accord") as fake:
        async with running_proxy(tmp_path, fake.url, settings) as proxy:
            client = anthropic.AsyncAnthropic(api_key="k", base_url=proxy.url, max_retries=0)
            for step in range(6):
                reply = await client.messages.create(model="m", max_tokens=5, messages=history,
                                                     extra_headers={"x-context-sidecar-session": "mid-system"})
                history += [{"role": "assistant", "content": reply.content[0].text},  # type: ignore[union-attr]
                            user(f"question {step} " + "about the parser " * 60)]
    last = fake.model_requests[-1].body["messages"]
    assert "<<opening>>" not in json.dumps(last)  # the budget left the opening out; the system entry stays
    assert last[0]["role"] == "user" and last[1] == {"role": "system", "content": "Always answer in French."}


async def test_a_reasoning_item_whose_call_is_left_out_is_left_out_with_it(tmp_path: Path) -> None:
    def reasoning(number: int) -> dict[str, Any]:
        return {"type": "reasoning", "id": f"rs_{number}", "summary": [], "encrypted_content": f"gAAAA-{number}"}

    def call(number: int) -> dict[str, Any]:
        return {"type": "function_call", "id": f"fc_{number}", "call_id": f"call_{number}", "name": "exec_command",
                "arguments": "{}"}

    items: list[Any] = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "run it"}]},
                        reasoning(1), call(1), reasoning(2), call(2),
                        {"type": "function_call_output", "call_id": "call_1", "output": "ok"},
                        # the user stopped the second command: no output for it
                        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "never mind"}]}]
    with FakeProvider(responder=lambda request: "ok") as fake:
        async with running_proxy(tmp_path, fake.url) as proxy:
            client = openai.AsyncOpenAI(api_key="k", base_url=f"{proxy.url}/v1", max_retries=0)
            await client.responses.create(model="gpt-5", input=items, store=False,
                                          extra_headers={"session-id": "codex-stopped"},
                                          tools=[{"type": "function", "name": "exec_command", "parameters": {}}])
    sent = [(item.get("type"), item.get("id")) for item in fake.model_requests[-1].body["input"]]
    # The call without an output is left out, and the reasoning that led to it with it (the API refuses one alone).
    assert sent == [("message", None), ("reasoning", "rs_1"), ("function_call", "fc_1"),
                    ("function_call_output", None), ("message", None)]


async def test_a_restarted_proxy_renders_what_the_request_holds_without_reading_it_back(tmp_path: Path) -> None:
    history = [user("<<opening>> fix the parser")]
    with FakeProvider(responder=lambda request: "done") as fake:
        for run in range(2):
            async with running_proxy(tmp_path, fake.url) as proxy:
                client = anthropic.AsyncAnthropic(api_key="k", base_url=proxy.url, max_retries=0)
                for step in range(3 if run == 0 else 1):
                    reply = await client.messages.create(model="m", max_tokens=5, messages=history, tools=TOOLS,
                                                         extra_headers={"x-context-sidecar-session": "again"})
                    history += [{"role": "assistant", "content": reply.content[0].text},  # type: ignore[union-attr]
                                user(f"run {run} step {step} goes on")]
                log = proxy.log_text()
        async with reader(tmp_path / "proxy.duckdb") as sidecar:
            sessions = {s.session_id: s.messages for s in (await sidecar.sessions()).sessions}
    assert sessions == {"again": len(history) - 1}  # found again: each message once
    assert "read back from memory" not in log  # the second run's request held every message it rendered
