"""What the proxy does with bad input: bodies, unknown models, a dead upstream, clients that leave, races, edits."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anthropic
import httpx2
import pytest

from sidecar.proxy.conversation import Conversation
from sidecar.testing.provider import FakeProvider
from sidecar.testing.replies import Reply
from tests.helpers.proxy import WAIT, children, reader, running_proxy, stuck_in_a_compaction, until_dead


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


async def test_a_model_with_an_unknown_window_uses_the_settings_window_and_says_so(tmp_path: Path) -> None:
    with FakeProvider() as fake:
        async with running_proxy(tmp_path, fake.url, {"contextWindow": 50000}) as proxy:
            client = anthropic.AsyncAnthropic(api_key="k", base_url=proxy.url, max_retries=0)
            await client.messages.create(model="claude-from-the-future", max_tokens=5, messages=[user("hi")])
            log = proxy.log_text()
    assert "model 'claude-from-the-future': context window unknown; using contextWindow 50000" in log


async def test_an_upstream_that_is_down_is_a_502_in_the_provider_s_shape(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"  # bound, never listening: connections are refused
        async with running_proxy(tmp_path, dead) as proxy:
            client = anthropic.AsyncAnthropic(api_key="k", base_url=proxy.url, max_retries=0)
            with pytest.raises(anthropic.APIStatusError) as caught:
                await client.messages.create(model="m", max_tokens=5, messages=[user("hi")])
    assert caught.value.status_code == 502
    assert caught.value.body["error"]["type"] == "api_error"  # type: ignore[index]
    assert "unreachable" in caught.value.body["error"]["message"]  # type: ignore[index]


async def test_a_client_that_leaves_mid_stream_leaves_no_answer_stored(tmp_path: Path) -> None:
    with FakeProvider() as fake:
        fake.script(Reply(text="slowly <<partial>> " * 40, chunk_delay=0.05), Reply(text="second answer"))
        async with running_proxy(tmp_path, fake.url) as proxy:
            body = {"model": "m", "max_tokens": 5, "stream": True, "messages": [user("first")]}
            headers = {"x-context-sidecar-session": "left"}
            async with httpx2.AsyncClient(timeout=WAIT) as http, http.stream(
                    "POST", f"{proxy.url}/v1/messages", json=body, headers=headers) as response:
                async for chunk in response.aiter_raw():
                    if b"<<partial>>" in chunk:
                        break  # leaves with the answer half read
            await asyncio.to_thread(fake.wait_for, count=1)
            client = anthropic.AsyncAnthropic(api_key="k", base_url=proxy.url, max_retries=0)
            reply = await client.messages.create(model="m", max_tokens=5, messages=[user("first")],
                                                 extra_headers=headers)
            async with reader(proxy.db) as sidecar:
                partial = await sidecar.grep("left", "<<partial>>", scope="messages")
                second = await sidecar.grep("left", "second answer", scope="messages")
    assert reply.content[0].text == "second answer"  # type: ignore[union-attr]
    assert partial.matches == [] and len(second.matches) == 1


async def test_two_agents_on_one_session_id_at_once_each_get_their_own_conversation(tmp_path: Path) -> None:
    with FakeProvider(responder=lambda request: "ok") as fake:
        async with running_proxy(tmp_path, fake.url) as proxy:
            client = anthropic.AsyncAnthropic(api_key="k", base_url=proxy.url, max_retries=0)
            headers = {"x-context-sidecar-session": "shared"}

            async def agent(name: str) -> None:
                history = [user(f"<<{name}-0>> the opening")]
                for step in range(1, 4):
                    reply = await client.messages.create(model="m", max_tokens=5, messages=history,
                                                         extra_headers=headers)
                    history += [{"role": "assistant", "content": reply.content[0].text},  # type: ignore[union-attr]
                                user(f"<<{name}-{step}>> more")]

            await asyncio.gather(agent("one"), agent("two"))
            async with reader(proxy.db) as sidecar:
                sessions = {s.session_id: s.messages for s in (await sidecar.sessions()).sessions}
    for request in fake.model_requests:
        text = json.dumps(request.body["messages"])
        assert ("<<one-" in text) != ("<<two-" in text), "a request mixed both agents' conversations"
    assert sorted(sessions.values()) == [6, 6] and "shared" in sessions  # 3 asks and 3 answers each


async def test_an_edited_history_is_stored_as_a_new_branch_and_the_old_one_kept(tmp_path: Path) -> None:
    with FakeProvider(responder=lambda request: "answer") as fake:
        async with running_proxy(tmp_path, fake.url) as proxy:
            client = anthropic.AsyncAnthropic(api_key="k", base_url=proxy.url, max_retries=0)
            headers = {"x-context-sidecar-session": "edited"}
            first = [user("<<opening>>")]
            await client.messages.create(model="m", max_tokens=5, messages=first, extra_headers=headers)
            kept = [*first, {"role": "assistant", "content": "answer"}, user("<<original ask>>")]
            await client.messages.create(model="m", max_tokens=5, messages=kept, extra_headers=headers)
            edited = [*first, {"role": "assistant", "content": "answer"}, user("<<edited ask>>")]
            await client.messages.create(model="m", max_tokens=5, messages=edited, extra_headers=headers)
            await client.messages.create(model="m", max_tokens=5, messages=first, extra_headers=headers)  # rewound
            async with reader(proxy.db) as sidecar:
                sessions = [s.session_id for s in (await sidecar.sessions()).sessions]
                original = await sidecar.grep("edited", "<<original ask>>", scope="messages")
                branches = [s for s in sessions if s.startswith("edited~")]
                found = [await sidecar.grep(b, "<<edited ask>>", scope="messages") for b in branches]
    forwarded = [json.dumps(r.body["messages"]) for r in fake.model_requests]
    assert "<<edited ask>>" in forwarded[2] and "<<original ask>>" not in forwarded[2]
    assert "<<original ask>>" not in forwarded[3] and "<<edited ask>>" not in forwarded[3]
    assert len(original.matches) == 1  # the old branch is still there, untouched
    assert sum(len(f.matches) for f in found) == 1


async def test_a_session_another_client_imported_is_never_written_into_and_a_restart_finds_its_branch(
        tmp_path: Path) -> None:
    opening = [user("<<opening>> fix the parser"), {"role": "assistant", "content": "Reading it."}]
    async with reader(tmp_path / "proxy.duckdb") as sidecar:  # the agent's transcript, as a watcher imported it
        await sidecar.ingest("imported", [{**message, "id": f"cc-{index}"} for index, message in enumerate(opening)],
                             session={"metadata": {"agent": "Claude Code 2.1.197"}})
    history = list(opening)
    with FakeProvider(responder=lambda request: "done") as fake:
        for run in range(2):  # the second proxy knows nothing of the first: it finds the branch again
            async with running_proxy(tmp_path, fake.url) as proxy:
                client = anthropic.AsyncAnthropic(api_key="k", base_url=proxy.url, max_retries=0)
                history.append(user(f"<<run {run}>> go on"))
                reply = await client.messages.create(model="m", max_tokens=5, messages=history,
                                                     extra_headers={"x-context-sidecar-session": "imported"})
                history.append({"role": "assistant", "content": reply.content[0].text})  # type: ignore[union-attr]
        async with reader(tmp_path / "proxy.duckdb") as sidecar:
            sessions = {s.session_id: s.messages for s in (await sidecar.sessions()).sessions}
            found = await sidecar.grep("imported", "<<run", scope="messages")
    branches = [name for name in sessions if name.startswith("imported~")]
    assert sessions["imported"] == 2 and found.matches == []  # never written into
    assert len(branches) == 1 and sessions[branches[0]] == len(history)  # the whole conversation, once


async def test_a_lone_surrogate_in_a_message_is_forwarded_and_its_conversation_goes_on(tmp_path: Path) -> None:
    with FakeProvider(responder=lambda request: "seen") as fake:
        async with running_proxy(tmp_path, fake.url) as proxy:
            url, headers = f"{proxy.url}/v1/messages", {"x-context-sidecar-session": "cut"}
            # A truncated tool output: the JSON escape of half an emoji, valid JSON, not encodable as UTF-8.
            history = b'{"role": "user", "content": "<<cut>> \\ud83d"}'
            async with httpx2.AsyncClient(timeout=WAIT) as http:
                first = await http.post(url, headers=headers, content=b'{"model": "m", "max_tokens": 5, '
                                        b'"messages": [' + history + b"]}")
                second = await http.post(url, headers=headers, content=b'{"model": "m", "max_tokens": 5, '
                                         b'"messages": [' + history + b', {"role": "assistant", "content": "seen"}, '
                                         b'{"role": "user", "content": "<<next>>"}]}')
            async with reader(proxy.db) as sidecar:
                stored = await sidecar.grep("cut", "<<next>>", scope="messages")
    assert first.status_code == 200 and second.status_code == 200
    assert len(fake.model_requests) == 2
    assert "\\ud83d" in fake.model_requests[1].raw.decode()  # the agent's bytes, as it sent them
    assert len(stored.matches) == 1  # stored: the sidecar's form of the message holds U+FFFD in its place


ODD_STREAM = (b'event: message_start\ndata: {"type": "message_start", "message": {"id": "m1", "type": "message", '
              b'"role": "assistant", "content": [], "usage": {"input_tokens": 3, "output_tokens": 0}}}\n\n'
              b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, "delta": "odd"}\n\n'
              b'event: message_stop\ndata: {"type": "message_stop"}\n\n')


class _OddUpstream(BaseHTTPRequestHandler):
    """An upstream whose stream holds an event of a shape no recorder expects."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(ODD_STREAM)))
        self.end_headers()
        self.wfile.write(ODD_STREAM)

    def log_message(self, format: str, *args: object) -> None:
        pass


async def test_an_answer_the_recorder_cannot_read_still_reaches_the_agent_whole(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OddUpstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        async with running_proxy(tmp_path, f"http://127.0.0.1:{server.server_address[1]}") as proxy:
            async with httpx2.AsyncClient(timeout=WAIT) as http:
                response = await http.post(f"{proxy.url}/v1/messages", json={
                    "model": "m", "max_tokens": 5, "stream": True, "messages": [user("hi")]},
                    headers={"x-context-sidecar-session": "odd"})
            log = proxy.log_text()
    finally:
        server.shutdown()
    assert response.status_code == 200 and response.content == ODD_STREAM
    assert "the answer is not recorded" in log


async def test_a_host_stuck_in_a_compaction_does_not_hold_the_agent_s_request(tmp_path: Path) -> None:
    async with stuck_in_a_compaction(tmp_path, prepare_timeout=1) as stuck:
        client = anthropic.AsyncAnthropic(api_key="k", base_url=stuck.proxy.url, max_retries=0)
        reply = await client.messages.create(model="m", max_tokens=5, messages=stuck.history,
                                             extra_headers={"x-context-sidecar-session": "stuck"})
        log = stuck.proxy.log_text()
        await asyncio.to_thread(stuck.summarizer.wait_for)  # the compaction is there still, waiting on its model
    assert reply.content[0].text == "answered"  # type: ignore[union-attr]
    assert stuck.provider.model_requests[0].body["messages"] == stuck.history  # as the agent sent it
    assert "forwarded as the agent sent it: the sidecar took over 1s" in log


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads a process's children from /proc")
async def test_the_sidecar_process_is_out_of_the_terminal_s_reach_and_replaced_when_it_dies(tmp_path: Path) -> None:
    with FakeProvider(responder=lambda request: "ok") as fake:
        async with running_proxy(tmp_path, fake.url) as proxy:
            client = anthropic.AsyncAnthropic(api_key="k", base_url=proxy.url, max_retries=0)
            headers = {"x-context-sidecar-session": "survives"}
            history = [user("<<first>>")]
            await client.messages.create(model="m", max_tokens=5, messages=history, extra_headers=headers)
            [sidecar_pid] = children(proxy.process.pid)
            own_session = os.getsid(sidecar_pid) != os.getsid(proxy.process.pid)  # Ctrl-C's group is not its
            os.kill(sidecar_pid, signal.SIGKILL)
            # Dead, its pipes closed, before the next request: else that request may reach the process still dying,
            # its messages sent behind the answer (sidecar.proxy.ahead) and lost with it until the request after.
            await until_dead(sidecar_pid)
            history += [{"role": "assistant", "content": "ok"}, user("<<second>>")]
            await client.messages.create(model="m", max_tokens=5, messages=history, extra_headers=headers)
            async with reader(proxy.db) as sidecar:
                stored = await sidecar.grep("survives", "<<second>>", scope="messages")
            log = proxy.log_text()
    assert own_session
    assert len(stored.matches) == 1, log  # the request after the kill was stored: managed again
    assert "the sidecar process is gone: starting another" in log


def test_a_path_always_finds_a_session_name_however_many_branches_are_known() -> None:
    conversation = Conversation("agent")
    ids = ["px-aaaaaaaaaaaa", "px-bbbbbbbbbbbb"]
    names = []
    for taken in range(6):
        name = conversation.fork_name(ids, taken)
        conversation.branch(name)  # each failed attempt leaves its branch known
        names.append(name)
    assert len(set(names)) == 6 and names[0] == "agent"
