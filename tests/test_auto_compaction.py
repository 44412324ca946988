"""Automatic compaction, compaction hooks, and lossless recovery of the real pi session."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from pygls.exceptions import JsonRpcException

from protocol import errors, methods
from sidecar.cli.synthetic import coding_session
from sidecar.framing import FrameReader, encode
from sidecar.importers import parse_transcript
from sidecar.testing import FakeOpenAIServer, Reply
from tests.conftest import PI_SESSION, SERVER_COMMAND, call, ingest, running_sidecar, settings_for


def auto_settings(db_path, server=None, **compaction):
    llm = {"baseUrl": server.base_url, "model": "fake-model", "timeoutSeconds": 5} if server else {}
    return settings_for(db_path, compaction={"auto": True, "maxTokens": 3000, "keepRecentTokens": 0, **compaction},
                        llm=llm)


async def wait_until(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.05)


async def test_crossing_max_tokens_compacts_in_the_background_without_delaying_ingest(store_target):
    db_path = store_target
    gate = threading.Event()

    def held_summary(request):
        gate.wait(60)  # the compaction cannot end before the test opens the gate
        return Reply(text="Summary of earlier work.")

    with FakeOpenAIServer() as llm:
        llm.responder = held_summary
        async with running_sidecar(settings=auto_settings(db_path, llm)) as client:
            await ingest(client, "s", coding_session(20))
            assert client.compact_events == []
            result = await ingest(client, "s", coding_session(120)[20:])
            assert result["usage"]["tokens"] > 3000
            await wait_until(lambda: llm.chat_requests)
            assert client.compact_events == [], "the ingest reply came while the compaction was still held"
            gate.set()
            await wait_until(lambda: client.compact_events)
            event = client.compact_events[0]
            assert event["trigger"] == "auto" and event["mode"] == "incremental"
            assert event["tokensAfter"] < event["tokensBefore"]
            states = [u["state"] for u in client.usage_events]
            assert "compacting" in states
            assert states.index("compacting") < len(states) - 1  # and a figure after it ends
            usage = await call(client, methods.CONTEXT_USAGE, {"sessionId": "s"})
            assert usage["summaries"] >= 1 and usage["state"] != "compacting"


async def test_a_compact_sent_while_an_automatic_one_runs_waits_for_it_and_answers_with_its_result(db_path):
    gate = threading.Event()

    def held_summary(request):
        gate.wait(60)
        return Reply(text="Summary of earlier work.")

    with FakeOpenAIServer() as llm:
        llm.responder = held_summary
        async with running_sidecar(settings=auto_settings(db_path, llm)) as client:
            await ingest(client, "s", coding_session(120))
            await wait_until(lambda: llm.chat_requests)  # the automatic compaction is inside its summarizer call
            manual = asyncio.ensure_future(call(client, methods.CONTEXT_COMPACT, {"sessionId": "s"}))
            await call(client, methods.CONTEXT_USAGE, {"sessionId": "s"})  # a round trip: the compact was read
            assert not manual.done(), "the compact waits for the running one (it used to be refused with -32011)"
            gate.set()
            result = await manual
            await wait_until(lambda: client.compact_events)
            [event] = client.compact_events
            assert event["trigger"] == "auto"
            assert result["compacted"] is True and result["summaryIds"] == event["summaryIds"]
            assert result["tokensAfter"] == event["tokensAfter"] and result["usage"]["summaries"] >= 1
            assert result["usage"]["tokens"] < result["usage"]["threshold"], "no second compaction was needed"


async def test_a_compact_after_an_automatic_one_that_left_the_session_over_compacts_further(db_path):
    gate = threading.Event()

    def held_summary(request):
        gate.wait(60)
        return Reply(text="Summary of earlier work. " * 5)

    with FakeOpenAIServer() as llm:
        llm.responder = held_summary
        async with running_sidecar(settings=auto_settings(db_path, llm, maxTokens=1000, minSavings=0)) as client:
            await ingest(client, "s", coding_session(400))
            await wait_until(lambda: llm.chat_requests)
            manual = asyncio.ensure_future(call(client, methods.CONTEXT_COMPACT, {"sessionId": "s", "mode": "full"}))
            await call(client, methods.CONTEXT_USAGE, {"sessionId": "s"})  # a round trip: the compact was read
            assert not manual.done()
            gate.set()
            result = await manual
            await wait_until(lambda: len(client.compact_events) == 2)
            assert [e["trigger"] for e in client.compact_events] == ["auto", "manual"]
            assert result["compacted"] is True and result["mode"] == "full"
            assert result["summaryIds"] == client.compact_events[1]["summaryIds"]
            assert result["tokensBefore"] == client.compact_events[0]["tokensAfter"]


async def test_a_failing_endpoint_is_not_called_in_a_loop(db_path):
    with FakeOpenAIServer() as llm:
        llm.responder = lambda request: Reply(status=500)
        async with running_sidecar(settings=auto_settings(db_path, llm)) as client:
            await ingest(client, "s", coding_session(120))
            await wait_until(lambda: any(u["state"] == "compacting" for u in client.usage_events))
            await wait_until(lambda: client.usage_events[-1]["state"] == "compact")
            calls_after_failure = len(llm.chat_requests)
            assert calls_after_failure > 0
            for extra in range(5):
                await ingest(client, "s", [{"role": "user", "content": f"more work {extra} " * 50}])
            assert len(llm.chat_requests) == calls_after_failure, "back-off: no new calls right after a failure"
            # A manual compaction now fails on the endpoint (-32010); had an automatic one started, it would
            # still be running (-32011) or would have called the endpoint already.
            llm.responder = lambda request: Reply(status=400)  # not retried: fails at once
            with pytest.raises(JsonRpcException) as caught:
                await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s"})
            assert caught.value.code == errors.SUMMARIZER_FAILED
            assert client.compact_events == []
            everything = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "budget": 10**7})
            assert len(everything["items"]) == 125  # history kept in full


async def test_auto_compaction_is_off_with_max_tokens_minus_one(db_path):
    async with running_sidecar(settings=auto_settings(db_path, maxTokens=-1)) as client:
        result = await ingest(client, "s", coding_session(200), contextWindow=8000)
        assert result["usage"]["state"] == "overflow"
        manual = await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s"})  # -32011 if auto had started
        assert manual["compacted"] is True
        while not client.compact_events:
            await asyncio.sleep(0.02)
        assert [event["trigger"] for event in client.compact_events] == ["manual"]


async def test_hook_can_cancel_a_compaction(db_path):
    async with running_sidecar(settings=auto_settings(db_path, auto=False),
                               capabilities={"compactionHooks": True}) as client:
        asked = []

        @client.feature(methods.CONTEXT_WILL_COMPACT)
        def will_compact(params):
            asked.append(params)
            return {"action": "cancel"}

        await ingest(client, "s", coding_session(120))
        result = await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s", "mode": "full", "focus": "tests"})
        assert result["compacted"] is False and result["reason"] == "cancelled by client"
        request = asked[0].params if hasattr(asked[0], "params") else asked[0]
        assert request["sessionId"] == "s" and request["mode"] == "full" and request["trigger"] == "manual"
        assert request["focus"] == "tests" and request["messageCount"] == 120 and request["tokensBefore"] > 0
        assert client.compact_events == []
        assert (await call(client, methods.CONTEXT_USAGE, {"sessionId": "s"}))["summaries"] == 0


async def test_hook_summary_is_used_without_calling_the_model(db_path):
    with FakeOpenAIServer() as llm:
        async with running_sidecar(settings=auto_settings(db_path, llm, auto=False),
                                   capabilities={"compactionHooks": True}) as client:

            @client.feature(methods.CONTEXT_WILL_COMPACT)
            def will_compact(params):
                return {"action": "proceed", "summary": "The client's own summary: tokens now expire after 1 h."}

            await ingest(client, "s", coding_session(120))
            result = await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s"})
            assert result["compacted"] is True
            assert llm.chat_requests == []
            assert result["summary"].startswith("The client's own summary")
            system, first = [m["content"] for m in
                             (await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"}))["messages"][:2]]
            assert system.startswith("You are a careful coding agent.")  # never compacted: it leads
            assert 'kind="handoff"' in first and "expire after 1 h" in first


async def test_a_silent_hook_counts_as_proceed(db_path):
    settings = auto_settings(db_path, auto=False, hookTimeoutSeconds=0.5)
    async with running_sidecar(settings=settings, capabilities={"compactionHooks": True}) as client:
        never = asyncio.get_running_loop().create_future()
        asked = []

        @client.feature(methods.CONTEXT_WILL_COMPACT)
        async def will_compact(params):
            asked.append(params)
            await never

        await ingest(client, "s", coding_session(120))
        result = await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s"})
        assert len(asked) == 1 and not never.done(), "the hook was asked and never answered"
        assert result["compacted"] is True  # no answer within hookTimeoutSeconds counts as proceed
        never.cancel()


@pytest.mark.skipif(not PI_SESSION.exists(), reason="shared/data is not beside the project")
async def test_every_message_of_the_pi_session_is_recoverable_after_full_compaction(db_path):
    messages = parse_transcript(PI_SESSION, "pi").messages
    originals = {m["id"]: m for m in messages}
    settings = settings_for(db_path, compaction={"auto": False, "maxTokens": 2000, "freshTail": 10})
    async with running_sidecar(settings=settings) as client:
        await ingest(client, "pi", messages, model="claude-sonnet-4-5")
        result = await call(client, methods.CONTEXT_COMPACT, {"sessionId": "pi", "mode": "full"})
        assert result["compacted"] and result["tokensAfter"] < result["tokensBefore"] / 5
        items = (await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "pi", "budget": 10**7}))["items"]
        recovered: dict[str, dict] = {}
        pending = [(i["kind"], i["id"]) for i in items]
        while pending:
            _, item_id = pending.pop()
            expanded = await call(client, methods.MEMORY_EXPAND, {"sessionId": "pi", "id": item_id,
                                                                  "tokenCap": 10**9})
            assert expanded["truncated"] is False
            for child in expanded["items"]:
                if child["kind"] == "message":
                    recovered[child["id"]] = child["message"]
                else:
                    pending.append(("summary", child["id"]))
        assert recovered.keys() == originals.keys()
        assert all(recovered[key] == originals[key] for key in originals)


class RawStdio:
    """The sidecar over its stdio, frame by frame: messages sent together reach it in one read, as a client's
    back-to-back writes often do; requests from the server are answered by ``answer(method, params)``."""

    def __init__(self, process: asyncio.subprocess.Process, answer) -> None:
        self.process = process
        self.answer = answer
        self.reader = FrameReader()
        self.seen: list[dict] = []

    async def send(self, *messages: dict) -> None:
        data = b"".join(encode(message) for message in messages)
        assert len(data) <= 4096, "one atomic pipe write (PIPE_BUF)"
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        await self.process.stdin.drain()

    async def until(self, predicate, timeout: float = 20.0) -> dict:
        """The first message from the server that matches, answering its requests meanwhile."""
        assert self.process.stdout is not None
        async with asyncio.timeout(timeout):
            while True:
                for frame in self.reader.frames():
                    message = frame.message
                    self.seen.append(message)
                    if "method" in message and "id" in message:
                        await self.send({"jsonrpc": "2.0", "id": message["id"],
                                         "result": self.answer(message["method"], message.get("params"))})
                    if predicate(message):
                        return message
                data = await self.process.stdout.read(1 << 16)
                assert data, "the sidecar closed its output"
                self.reader.feed(data)


async def test_a_usage_report_and_the_next_message_read_together_start_one_compaction_of_what_was_sent(tmp_path):
    # An agent reports a call's usage (a notification) and stores the reply at once: both may arrive in one read.
    # The automatic compaction the report starts works on the context that call sent, and starts only once (a
    # second start used to fail as "already running" and hold automatic compaction back for 30 s).
    log = tmp_path / "sidecar.log"
    asked: list[dict] = []

    def answer(method, params):
        asked.append(params)
        return {"action": "proceed"}

    process = await asyncio.create_subprocess_exec(
        *SERVER_COMMAND, "--log-file", str(log), "-v",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    raw = RawStdio(process, answer)
    try:
        settings = settings_for(tmp_path / "memory.duckdb",
                                compaction={"auto": True, "freshTail": 2, "leafChunkSize": 2, "minSavings": 0})
        await raw.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "capabilities": {"experimental": {methods.EXPERIMENTAL_KEY: {"compactionHooks": True}}},
            "initializationOptions": settings}})
        await raw.until(lambda m: m.get("id") == 1)
        await raw.send({"jsonrpc": "2.0", "method": "initialized", "params": {}})
        sent = [{"id": f"m{i}", "role": "user" if i % 2 else "assistant", "content": f"step {i} " + "word " * 80}
                for i in range(1, 7)]
        await raw.send({"jsonrpc": "2.0", "id": 2, "method": methods.MEMORY_INGEST, "params": {
            "sessionId": "s", "messages": sent, "session": {"contextWindow": 4000}}})
        under = await raw.until(lambda m: m.get("id") == 2)
        assert under["result"]["usage"]["state"] == "ok"
        await raw.send({"jsonrpc": "2.0", "id": 3, "method": methods.CONTEXT_ASSEMBLE, "params": {"sessionId": "s"}})
        await raw.until(lambda m: m.get("id") == 3)
        reply = {"id": "m7", "role": "assistant", "content": "step 7 " + "word " * 80}
        await raw.send({"jsonrpc": "2.0", "method": methods.CONTEXT_REPORT_USAGE,
                        "params": {"sessionId": "s", "inputTokens": 3900, "outputTokens": 90}},
                       {"jsonrpc": "2.0", "id": 4, "method": methods.MEMORY_INGEST,
                        "params": {"sessionId": "s", "messages": [reply]}})
        compacted = await raw.until(lambda m: m.get("method") == methods.CONTEXT_DID_COMPACT)
        assert compacted["params"]["trigger"] == "auto"
        assert any(m.get("id") == 4 and "result" in m for m in raw.seen), "the reply was stored meanwhile"
        assert [params["messageCount"] for params in asked] == [len(sent)], \
            "one compaction, of the messages the reported call sent"
        await raw.send({"jsonrpc": "2.0", "id": 5, "method": "shutdown"})
        await raw.until(lambda m: m.get("id") == 5)
        await raw.send({"jsonrpc": "2.0", "method": "exit"})
        assert await asyncio.wait_for(process.wait(), 20) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    logged = log.read_text()
    assert "auto-compaction of s failed" not in logged, logged
