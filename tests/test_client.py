"""sidecar.client against the real server subprocess, and a scripted fake server for server requests."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from protocol import errors as codes
from protocol import methods
from protocol.types import IngestResult, Usage, WillCompactParams, WillCompactResult
from sidecar.client import SidecarClient, SidecarConnectionLost, SidecarRequestError
from sidecar.framing import encode as frame

LIMIT = 20.0
"""No single test step may hang longer than this."""

TURN = [
    {"role": "system", "content": "You are a coding agent.", "id": "sys"},
    {"role": "user", "content": "Fix the TimeoutError in fetch()", "id": "u1",
     "metadata": {"source": "test"}},
    {"role": "assistant", "content": None, "id": "a1",
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "read", "arguments": json.dumps({"path": "net.py"})}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "def fetch():\n    raise TimeoutError", "id": "t1"},
    {"role": "assistant", "content": "fetch() raises unconditionally; I will add a retry.", "id": "a2"},
]


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[SidecarClient]:
    """An initialized client on a fresh DuckDB file."""
    db, stderr = str(tmp_path / "c.duckdb"), str(tmp_path / "stderr.log")
    async with await SidecarClient.spawn(db=db, stderr=stderr) as c:
        yield c


async def test_initialize_result(client: SidecarClient, tmp_path: Path) -> None:
    assert client.initialize_result["serverInfo"]["name"] == methods.SERVER_NAME
    caps = client.capabilities
    assert caps["protocolVersion"] == methods.PROTOCOL_VERSION
    assert caps["storage"] == str(tmp_path / "c.duckdb")
    assert {methods.MEMORY_INGEST, methods.CONTEXT_ASSEMBLE, methods.MEMORY_GREP} <= set(caps["methods"])


async def test_round_trips(client: SidecarClient) -> None:
    result = await client.ingest("s1", TURN, session={"title": "retry work", "contextWindow": 32000})
    assert isinstance(result, IngestResult)
    assert result.ids == ["sys", "u1", "a1", "t1", "a2"]
    assert result.duplicates == 0
    assert (result.usage.messages, result.usage.context_window) == (5, 32000)
    again = await client.ingest("s1", TURN[-1:])
    assert (again.ids, again.duplicates) == (["a2"], 1)

    assembled = await client.assemble("s1", budget=10000, fresh_tail=2)
    assert [item.id for item in assembled.items] == result.ids
    assert assembled.messages[2]["tool_calls"][0]["id"] == "call_1"
    assert all("id" not in m and "metadata" not in m for m in assembled.messages)
    assert 0 < assembled.tokens <= 10000 and not assembled.over_budget
    tiny = await client.assemble("s1", budget=1, fresh_tail=1)
    # System messages always go, and the user message of the turn the fresh tail starts inside.
    assert tiny.over_budget and [item.id for item in tiny.items] == ["sys", "u1", "a2"]

    expanded = await client.expand("s1", "u1")
    assert expanded.kind == "message" and expanded.items[0].message is not None
    assert expanded.items[0].message["metadata"] == {"source": "test"}

    found = await client.grep("s1", "timeouterror")
    assert [m.id for m in found.matches] == ["t1", "u1"] and not found.truncated
    assert (await client.grep("s1", "timeouterror", case_sensitive=True)).matches == []
    assert [m.id for m in (await client.grep("s1", r"retr(y|ies)", regex=True, limit=1)).matches] == ["a2"]

    described = await client.describe("s1", "t1")
    assert (described.kind, described.message_count) == ("message", 1)
    assert described.content["tool_call_id"] == "call_1"

    listed = (await client.sessions()).sessions
    assert [(s.session_id, s.messages, s.title) for s in listed] == [("s1", 5, "retry work")]
    usage = await client.usage("s1")
    assert isinstance(usage, Usage) and usage.messages == 5 and usage.tokens == assembled.tokens

    assert (await client.delete_session("s1")).deleted
    assert not (await client.delete_session("s1")).deleted
    assert (await client.sessions()).sessions == []


async def test_usage_notifications(client: SidecarClient) -> None:
    seen: list[Usage] = []
    client.on_usage(seen.append)
    armed = client.wait_for_notification(methods.CONTEXT_DID_CHANGE_USAGE, lambda u: u.messages == 2)
    unrelated = client.wait_for_notification(methods.CONTEXT_DID_CHANGE_USAGE, lambda u: u.session_id == "x",
                                             timeout=0.3)
    await client.ingest("n1", TURN[:2])
    usage = await asyncio.wait_for(armed, LIMIT)
    assert isinstance(usage, Usage) and (usage.session_id, usage.messages) == ("n1", 2)
    assert [u.messages for u in seen] == [2]
    with pytest.raises(TimeoutError):
        await unrelated


async def test_settings_pulled_by_the_server(client: SidecarClient) -> None:
    await client.ingest("w1", TURN[:2])
    requests: list[Any] = []
    client.trace = lambda way, m: requests.append(m) if way == "recv" and {"method", "id"} <= set(m) else None
    changed = client.wait_for_notification(methods.CONTEXT_DID_CHANGE_USAGE,
                                           lambda u: u.context_window == 50000)
    await client.change_settings({"contextWindow": 50000}, push=False)
    assert (await asyncio.wait_for(changed, LIMIT)).session_id == "w1"
    assert [(r["method"], type(r["id"])) for r in requests] == [("workspace/configuration", int)]


async def test_errors_carry_their_code(client: SidecarClient) -> None:
    with pytest.raises(SidecarRequestError) as unknown:
        await client.usage("nobody")
    assert unknown.value.code == codes.UNKNOWN_SESSION and unknown.value.data == {"sessionId": "nobody"}
    with pytest.raises(SidecarRequestError) as bad:
        await client.request(methods.MEMORY_GREP, {"sessionId": "s", "pattern": 5})
    assert bad.value.code == codes.INVALID_PARAMS and bad.value.data == {"field": "pattern"}
    await client.ingest("e1", TURN[:2])
    with pytest.raises(SidecarRequestError) as regex:
        await client.grep("e1", "(unclosed", regex=True)
    assert regex.value.code == codes.INVALID_PARAMS and regex.value.data["field"] == "pattern"
    with pytest.raises(SidecarRequestError) as missing:
        await client.expand("e1", "no-such-id")
    assert missing.value.code == codes.ID_NOT_FOUND
    assert (await client.usage("e1")).messages == 2  # still serving


async def test_cancelling_the_task_cancels_the_request(client: SidecarClient) -> None:
    log: list[tuple[str, Any]] = []
    client.trace = lambda way, message: log.append((way, message))
    # Big enough that its tail and the cancel leave the client's write buffer together.
    messages = [{"role": "user", "content": f"line {i} " + "x" * 500} for i in range(4000)]
    task = asyncio.create_task(client.ingest("big", messages))
    await asyncio.sleep(0)
    request_id = next(m["id"] for way, m in log if way == "send" and m.get("method") == methods.MEMORY_INGEST)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ("send", {"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": request_id}}) in log

    async def reply() -> dict[str, Any]:
        while True:
            for way, message in log:
                if way == "recv" and message.get("id") == request_id and "method" not in message:
                    return message
            await asyncio.sleep(0.01)

    answer = await asyncio.wait_for(reply(), LIMIT)
    assert answer["error"]["code"] == codes.REQUEST_CANCELLED
    with pytest.raises(SidecarRequestError) as gone:
        await client.usage("big")
    assert gone.value.code == codes.UNKNOWN_SESSION  # all or none: nothing was stored
    assert (await client.ingest("big", messages[:3])).usage.messages == 3


async def test_clean_shutdown_exit_code(tmp_path: Path) -> None:
    client = await SidecarClient.spawn(db=str(tmp_path / "s.duckdb"), stderr=str(tmp_path / "stderr.log"))
    async with client:
        await client.ingest("s", TURN[:1])
    assert client.returncode == 0
    with pytest.raises(SidecarConnectionLost):
        await client.sessions()


async def test_server_dying_fails_pending_requests(tmp_path: Path) -> None:
    client = await SidecarClient.spawn(db=str(tmp_path / "d.duckdb"), stderr=str(tmp_path / "stderr.log"))
    assert client.process is not None
    os.kill(client.process.pid, signal.SIGSTOP)  # so the request is certainly pending when it dies
    sent = asyncio.Event()
    client.trace = lambda way, message: sent.set() if message.get("method") == methods.MEMORY_SESSIONS else None
    pending = asyncio.create_task(client.sessions())
    waiter = client.wait_for_notification(methods.CONTEXT_DID_CHANGE_USAGE, timeout=None)
    await asyncio.wait_for(sent.wait(), LIMIT)
    assert not pending.done()
    os.kill(client.process.pid, signal.SIGKILL)
    with pytest.raises(SidecarRequestError) as lost:
        await asyncio.wait_for(pending, LIMIT)
    assert isinstance(lost.value, ConnectionError) and lost.value.code == codes.INTERNAL_ERROR
    with pytest.raises(SidecarConnectionLost):
        await asyncio.wait_for(waiter, LIMIT)
    with pytest.raises(SidecarConnectionLost):
        await client.usage("s")
    assert await asyncio.wait_for(client.close(), LIMIT) == -signal.SIGKILL


class FakeServer:
    """The server end of a socket pair, scripted by the test."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def send(self, message: dict[str, Any]) -> None:
        """Write one framed message."""
        self.writer.write(frame({"jsonrpc": "2.0", **message}))

    async def receive(self) -> dict[str, Any]:
        """Read one framed message."""
        header = await self.reader.readuntil(b"\r\n\r\n")
        length = int(header.split(b":")[1].split(b"\r\n")[0])
        return json.loads(await self.reader.readexactly(length))


async def test_answers_server_requests() -> None:
    left, right = socket.socketpair()
    client_streams = await asyncio.open_connection(sock=left)
    server = FakeServer(*await asyncio.open_connection(sock=right))
    asked: list[WillCompactParams] = []

    async def will_compact(params: WillCompactParams) -> WillCompactResult:
        asked.append(params)
        return WillCompactResult(action="cancel")

    client = await SidecarClient.connect(*client_streams, settings={"contextWindow": 64000},
                                         will_compact=will_compact, initialize=False)
    progress: list[Any] = []
    client.on_progress(progress.append)
    server.writer.write(b"junk without a header\r\n\r\n")
    server.send({"method": "$/progress", "params": {"token": "t", "value": {"kind": "begin", "title": "x"}}})
    server.send({"id": 1, "method": methods.CONTEXT_WILL_COMPACT, "params": {
        "sessionId": "s", "mode": "full", "trigger": "auto", "tokensBefore": 900, "messageCount": 12}})
    server.send({"id": 2, "method": "window/workDoneProgress/create", "params": {"token": "t"}})
    server.send({"id": 3, "method": "workspace/configuration",
                 "params": {"items": [{"section": "contextSidecar"}, {"section": "other"}]}})
    server.send({"id": 4, "method": "made/up", "params": {}})
    replies = {m["id"]: m for m in [await asyncio.wait_for(server.receive(), LIMIT) for _ in range(4)]}
    assert replies[1]["result"] == {"action": "cancel"}
    assert asked[0].tokens_before == 900 and asked[0].focus is None
    assert replies[2]["result"] is None and "error" not in replies[2]
    assert replies[3]["result"] == [{"contextWindow": 64000}, None]
    assert replies[4]["error"]["code"] == codes.METHOD_NOT_FOUND
    assert progress == [{"token": "t", "value": {"kind": "begin", "title": "x"}}]

    ask = asyncio.create_task(client.request("custom/echo", {"a": 1}))
    sent = await asyncio.wait_for(server.receive(), LIMIT)
    server.send({"id": sent["id"], "result": {"echo": sent["params"]}})
    assert await asyncio.wait_for(ask, LIMIT) == {"echo": {"a": 1}}
    server.writer.close()
    await client.close(timeout=1)


async def test_cancelling_a_running_compaction_task_leaves_the_session_unchanged(tmp_path: Path) -> None:
    from sidecar.cli.synthetic import coding_session
    from sidecar.testing import FakeOpenAIServer, Reply

    gate = threading.Event()

    def held_summary(request: object) -> Reply:
        gate.wait(60)
        return Reply(text="slow summary")

    with FakeOpenAIServer() as llm:
        llm.responder = held_summary
        settings = {"compaction": {"auto": False},
                    "llm": {"baseUrl": llm.base_url, "model": "fake-model", "timeoutSeconds": 60}}
        async with await SidecarClient.spawn(db=str(tmp_path / "c.duckdb"), settings=settings) as client:
            states: list[str] = []
            client.on_usage(lambda usage: states.append(usage.state))
            await client.ingest("s", coding_session(120))
            before = await client.assemble("s", prune=False)
            task = asyncio.ensure_future(client.compact("s", mode="full"))
            while not llm.chat_requests:  # the compaction is under way, waiting on the model
                await asyncio.sleep(0.05)
            states.clear()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            gate.set()  # the model answers now: a server that went on would apply the summaries
            while not states or states[-1] == "compacting":  # the compaction's end pushes the usage again
                await asyncio.sleep(0.05)
            after = await client.assemble("s", prune=False)
            assert [i.id for i in after.items] == [i.id for i in before.items]
            assert (await client.usage("s")).summaries == 0


async def test_assemble_kept_applies_deltas_to_the_kept_prompt(client: SidecarClient) -> None:
    await client.ingest("k", TURN)
    first = await client.assemble_kept("k")
    assert not first.delta and len(first.messages) == 5
    for number in range(3):
        await client.ingest("k", [{"role": "user", "content": f"and then {number}", "id": f"n{number}"}])
        kept = await client.assemble_kept("k")
        assert kept.delta is True and kept.keep == 5 + number
        whole = await client.assemble("k")  # a plain reply; the server's previous prompt is now this one
        assert (kept.messages, kept.items, kept.tokens) == (whole.messages, whole.items, whole.tokens)
        client._kept["k"].revision = whole.revision  # the same prompt, so a delta against it is as good
    other = await client.assemble_kept("k", budget=10, fresh_tail=1)  # the fill drops old items: not a delta
    # The system message is always sent (pinned context); the fill drops the rest but the newest.
    assert other.delta is False and [item.id for item in other.items] == ["sys", "n2"]


async def test_requests_sent_without_waiting_are_handled_in_the_order_sent(client: SidecarClient) -> None:
    sent = []
    for number in range(1, 4):
        after = f"p{number - 1}" if number > 1 else ""
        sent.append(await client.send(methods.MEMORY_INGEST, {
            "sessionId": "piped", "after": after, "messages": [{"id": f"p{number}", "role": "user",
                                                                "content": f"message {number}"}]}))
        sent.append(await client.send(methods.CONTEXT_ASSEMBLE, {"sessionId": "piped"}))
    replies = await asyncio.wait_for(asyncio.gather(*sent), LIMIT)
    assembled = [[item["id"] for item in reply["items"]] for reply in replies[1::2]]
    assert assembled == [["p1"], ["p1", "p2"], ["p1", "p2", "p3"]]
    assert [reply["ids"] for reply in replies[0::2]] == [["p1"], ["p2"], ["p3"]]
