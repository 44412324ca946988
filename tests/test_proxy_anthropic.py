"""The proxy on the Anthropic Messages API, with the official ``anthropic`` SDK as the agent and a fake provider."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest

from sidecar.client import SidecarClient
from sidecar.proxy.stats import prompt_tokens
from sidecar.testing.provider import FakeProvider
from sidecar.testing.replies import Reply, ToolCall
from tests.helpers.proxy import WAIT, agent_requests, markers, messages_of, reader, running_proxy, unpaired_tool_calls

WINDOW = 8000
SETTINGS = {"contextWindow": WINDOW,
            "compaction": {"maxTokens": 4000, "reserveTokens": 1500, "freshTail": 6, "keepRecentTokens": 1500}}
SYSTEM = [{"type": "text", "text": "You are a careful coding agent. Never commit secrets.",
           "cache_control": {"type": "ephemeral"}}]
TOOLS = [{"name": "read", "description": "Read a file.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]
SUMMARY = re.compile(r'<summary id=\\"([^"\\]+)')


def respond(request: Any) -> Reply:
    """Two tool calls per user turn, then an answer that names the turn."""
    messages = request.body["messages"]
    turn = next(m for m in reversed(messages) if _is_text(m))
    number = re.search(r"<<u(\d+)>>", json.dumps(turn)).group(1)  # type: ignore[union-attr]
    results = sum(1 for m in messages[messages.index(turn):] if m["role"] == "user" and not _is_text(m))
    if results < 2:
        return Reply(tool_calls=(ToolCall("read", {"path": f"src/module_{number}_{results}.py"}),))
    return Reply(text=f"Turn {number} done <<a{number}>>: the parser keeps the last token now.")


def _is_text(message: dict[str, Any]) -> bool:
    content = message["content"]
    return message["role"] == "user" and (isinstance(content, str) or content[0].get("type") == "text")


def _unmarked(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The agent's messages without cache markers, as Claude Code moves its marker to the newest message."""
    return [{**m, "content": [{k: v for k, v in b.items() if k != "cache_control"} for b in m["content"]]}
            if isinstance(m["content"], list) else m for m in messages]


async def agent(client: anthropic.AsyncAnthropic, turns: int, session: str) -> list[dict[str, Any]]:
    """A coding agent's loop: its whole history resent every step, the newest message marked for the cache."""
    messages: list[dict[str, Any]] = []
    for turn in range(turns):
        ask = f"<<u{turn}>> Fix the parser bug number {turn} in src/parser.py; " + "keep the tests green. " * 20
        messages.append({"role": "user", "content": [{"type": "text", "text": ask}]})
        for step in range(4):
            sent = _unmarked(messages)
            sent[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
            arguments = {"model": "claude-sonnet-4-5", "max_tokens": 256, "system": SYSTEM, "tools": TOOLS,
                         "messages": sent, "extra_headers": {"x-context-sidecar-session": session}}
            if (turn + step) % 2:
                async with client.messages.stream(**arguments) as stream:
                    reply = await stream.get_final_message()
            else:
                reply = await client.messages.create(**arguments)
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
            calls = [b for b in reply.content if b.type == "tool_use"]
            if not calls:
                break
            output = f"<<t{turn}.{step}>> def parse(tokens):\n" + "    token = tokens.pop()  # keep it\n" * 30
            messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id,
                                                          "content": output}]})
    return messages


async def test_a_long_session_fits_the_window_keeps_its_prefix_and_is_stored_once(tmp_path: Path, runtime: Path,
                                                                                  store_target: str) -> None:
    env = {"XDG_RUNTIME_DIR": str(runtime)}  # a DuckDB file, then a team database as the member ALICE
    with FakeProvider(responder=respond, context_window=WINDOW) as fake:
        async with running_proxy(tmp_path, fake.url, SETTINGS, env=env, db=store_target) as proxy:
            client = anthropic.AsyncAnthropic(api_key="sk-test-key", base_url=proxy.url, max_retries=0)
            history = await agent(client, 14, "long")
            stats = httpx2.get(f"{proxy.url}/stats", timeout=WAIT).json()
            async with reader(proxy.db, env) as sidecar:
                stored = {}
                for token in re.findall(r"<<[uta][\d.]+>>", json.dumps(history)):
                    found = await sidecar.grep("long", token, scope="messages", case_sensitive=True)
                    stored[token] = len(found.matches)
            assert "sk-test-key" not in proxy.log_text()
    requests = agent_requests(fake)
    assert fake.rejected == []  # every forwarded request fit the window
    bodies = [r.body for r in requests]
    for body in bodies:
        assert unpaired_tool_calls(body["messages"]) == []
        assert markers(json.dumps(body).encode()) <= 4
    summaries = [set(SUMMARY.findall(json.dumps(body))) for body in bodies]
    compacted = [index for index in range(1, len(bodies)) if summaries[index] != summaries[index - 1]]
    assert compacted, "the session never compacted"
    assert all(summaries[index] for index in range(compacted[0], len(bodies)))  # a summary in every later request
    for index in range(1, len(requests)):
        if index in compacted:
            continue
        before, after = messages_of(requests[index - 1].raw), messages_of(requests[index].raw)
        assert after[:len(before)] == before, f"request {index} does not repeat request {index - 1}'s prefix"
    assert stored and all(count == 1 for count in stored.values()), stored
    session = next(s for s in stats["sessions"] if s["sessionId"] == "long")
    assert session["compactions"] >= 1 and session["requests"] == len(requests)
    assert session["forwardedTokens"] < session["agentTokens"]


async def test_before_any_compaction_the_agent_s_messages_go_upstream_as_it_sent_them(tmp_path: Path) -> None:
    with FakeProvider(responder=respond) as fake:
        async with running_proxy(tmp_path, fake.url) as proxy:
            client = anthropic.AsyncAnthropic(api_key="k", base_url=proxy.url, max_retries=0)
            history = await agent(client, 2, "plain")
    sent = _unmarked(history)
    last = fake.model_requests[-1].body
    assert _unmarked(last["messages"]) == sent[:len(last["messages"])]
    assert last["system"] == SYSTEM and last["tools"] == TOOLS


CANNED = (b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":"message",'
          b'"role":"assistant","model":"m","content":[],"stop_reason":null,"usage":{"input_tokens":12,'
          b'"output_tokens":1}}}\n\nevent: content_block_start\ndata: {"type":"content_block_start","index":0,'
          b'"content_block":{"type":"text","text":""}}\n\n: a comment line\n\nevent: content_block_delta\r\ndata: '
          b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"caf\xc3\xa9 <<answer>>"}}'
          b'\r\n\r\nevent: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
          b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":'
          b'{"output_tokens":5}}\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n')


async def canned_upstream(reader_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """An upstream that answers any request with CANNED, cut in odd places."""
    head = await reader_.readuntil(b"\r\n\r\n")
    length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
    await reader_.readexactly(length)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    for start in range(0, len(CANNED), 37):
        piece = CANNED[start:start + 37]
        writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    writer.close()


async def test_a_streamed_answer_reaches_the_client_byte_for_byte_and_is_recorded(tmp_path: Path) -> None:
    server = await asyncio.start_server(canned_upstream, "127.0.0.1", 0)
    upstream = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with running_proxy(tmp_path, upstream) as proxy:
            body = {"model": "m", "max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            async with httpx2.AsyncClient(timeout=WAIT) as http, http.stream(
                    "POST", f"{proxy.url}/v1/messages", json=body,
                    headers={"x-context-sidecar-session": "canned"}) as response:
                received = b"".join([chunk async for chunk in response.aiter_raw()])
                assert response.headers["content-type"] == "text/event-stream"
            async with reader(proxy.db) as sidecar:
                found = await sidecar.grep("canned", "<<answer>>", scope="messages")
                expanded = await sidecar.expand("canned", found.matches[0].id)
    finally:
        server.close()
    assert received == CANNED
    assert expanded.items[0].message["role"] == "assistant"
    assert json.loads(expanded.items[0].original[0])["content"][0]["text"] == "café <<answer>>"


@pytest.mark.parametrize(("status", "kind"), [(400, "invalid_request_error"), (529, "overloaded_error"),
                                              (500, "api_error")])
async def test_an_upstream_error_reaches_the_client_as_the_provider_sent_it(tmp_path: Path, status: int,
                                                                           kind: str) -> None:
    with FakeProvider() as fake:
        fake.script(Reply(status=status, error_message=f"scripted {status}"))
        async with running_proxy(tmp_path, fake.url) as proxy:
            client = anthropic.AsyncAnthropic(api_key="k", base_url=proxy.url, max_retries=0)
            with pytest.raises(anthropic.APIStatusError) as caught:
                await client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == status
    assert caught.value.body["error"] == {"type": kind, "message": f"scripted {status}"}  # type: ignore[index]


async def test_a_dropped_stream_reaches_the_client_dropped_and_is_not_stored(tmp_path: Path) -> None:
    with FakeProvider() as fake:
        fake.script(Reply(text="a long answer that is cut <<cut>> " * 5, drop_after=3))
        async with running_proxy(tmp_path, fake.url) as proxy:
            client = anthropic.AsyncAnthropic(api_key="k", base_url=proxy.url, max_retries=0)
            with pytest.raises((anthropic.APIConnectionError, httpx2.HTTPError)):
                async with client.messages.stream(model="m", max_tokens=10, messages=[{"role": "user", "content": "x"}],
                                                  extra_headers={"x-context-sidecar-session": "dropped"}) as stream:
                    await stream.get_final_message()
            async with reader(proxy.db) as sidecar:
                found = await sidecar.grep("dropped", "<<cut>>", scope="messages")
                listed = await sidecar.sessions()
    assert found.matches == []
    assert [s.messages for s in listed.sessions if s.session_id == "dropped"] == [1]  # the user's message only


async def test_a_compaction_another_client_makes_reaches_the_agent_s_next_requests(tmp_path: Path) -> None:
    settings = {"compaction": {"auto": False, "freshTail": 2, "keepRecentTokens": 0}}
    with FakeProvider(responder=lambda request: "noted <<answer>>") as fake:
        async with running_proxy(tmp_path, fake.url, settings) as proxy:
            client = anthropic.AsyncAnthropic(api_key="k", base_url=proxy.url, max_retries=0)
            history: list[dict[str, Any]] = []

            async def turn(number: int) -> None:
                history.append({"role": "user", "content": f"<<u{number}>> " + "tell me about the parser. " * 40})
                reply = await client.messages.create(model="claude-sonnet-4-5", max_tokens=50, messages=history,
                                                     extra_headers={"x-context-sidecar-session": "external"})
                history.append({"role": "assistant", "content": reply.content[0].text})  # type: ignore[union-attr]

            for number in range(12):
                await turn(number)
            async with await SidecarClient.spawn(db=str(proxy.db), settings=settings) as sidecar:
                compacted = await sidecar.compact("external", mode="full")
            for number in range(12, 16):
                await turn(number)
    assert compacted.compacted
    sent = agent_requests(fake)
    bodies = [json.dumps(request.body) for request in sent]
    after = [index for index, body in enumerate(bodies) if "<summary" in body]
    assert after and after[0] in (12, 13)  # the request on its way as the compaction landed may come before it
    assert after == list(range(after[0], 16))
    for index in range(after[0] + 1, 16):  # from then on each request repeats the one before it
        before, now = messages_of(sent[index - 1].raw), messages_of(sent[index].raw)
        assert now[:len(before)] == before


async def test_count_tokens_counts_the_context_the_next_request_sends_and_changes_nothing(tmp_path: Path) -> None:
    with FakeProvider(responder=lambda request: "done") as fake:
        async with running_proxy(tmp_path, fake.url) as proxy:
            client = anthropic.AsyncAnthropic(api_key="k", base_url=proxy.url, max_retries=0)
            headers = {"x-context-sidecar-session": "counted"}
            history: list[Any] = [{"role": "user", "content": "<<one>> fix the parser"}]
            for step in range(2):
                reply = await client.messages.create(model="claude-sonnet-4-5", max_tokens=5, messages=history,
                                                     extra_headers=headers)
                history += [{"role": "assistant", "content": reply.content[0].text},  # type: ignore[union-attr]
                            {"role": "user", "content": f"<<{step}>> go on"}]
            # Another model, another window: were the count the branch's, its budget (and prefix) would move.
            counted = await client.messages.count_tokens(model="claude-3-haiku-20240307", messages=history,
                                                         extra_headers=headers)
            await client.messages.create(model="claude-sonnet-4-5", max_tokens=5, messages=history,
                                         extra_headers=headers)
            async with reader(proxy.db) as sidecar:
                listed = {s.session_id: s.messages for s in (await sidecar.sessions()).sessions}
    count = next(r for r in fake.requests if r.api == "count_tokens")
    assert counted.input_tokens > 0
    assert messages_of(count.raw) == messages_of(fake.model_requests[-1].raw)  # what was counted was sent
    assert listed == {"counted": 6}  # nothing stored by the count


def test_cache_markers_are_not_counted_as_prompt() -> None:
    plain = b'{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}'
    marked = (b'{"messages":[{"role":"user","content":[{"type":"text","text":"hi",'
              b'"cache_control":{"type":"ephemeral","ttl":"1h"}}]}]}')
    first = (b'{"messages":[{"role":"user","content":[{"cache_control": {"type":"ephemeral"},'
             b'"type":"text","text":"hi"}]}]}')
    quoted = b'{"messages":[{"role":"user","content":"say \\"cache_control\\": {}"}]}'
    assert prompt_tokens(marked) == prompt_tokens(plain) == prompt_tokens(first) == -(-len(plain) // 4)
    assert prompt_tokens(quoted) == -(-len(quoted) // 4), "a marker's name in a message's text is text"
