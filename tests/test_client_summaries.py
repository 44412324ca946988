"""Summaries written by the client's own model: ``context/summarize`` to the client that drives a session.

Real processes throughout: each client is ``SidecarClient.spawn`` of ``context-sidecar`` (a relay of a shared host,
or a process of its own), the summary calls answered by the test's hook as a client's model would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from protocol import errors as codes
from protocol import methods
from protocol import types as t
from sidecar.client import SidecarClient, SidecarRequestError
from tests.helpers.hosts import WAIT, sock_of, until_logged

RULE = "Never push to the main branch without a review."
SETTINGS = {"compaction": {"auto": False, "freshTail": 2, "leafChunkSize": 4, "minSavings": 0,
                           "keepRecentTokens": 0}, "llm": {"timeoutSeconds": 3}}


def history(count: int = 12) -> list[dict[str, Any]]:
    """A session with a standing rule, an edited file and enough words to be worth summarizing."""
    messages: list[dict[str, Any]] = [{"id": "u0", "role": "user", "content": f"Fix the parser. {RULE}"}]
    for n in range(1, count):
        if n % 3 == 1:
            messages.append({"id": f"a{n}", "role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{n}", "type": "function",
                 "function": {"name": "edit", "arguments": f'{{"path": "src/parser{n}.py"}}'}}]})
        elif n % 3 == 2:
            messages.append({"id": f"t{n}", "role": "tool", "tool_call_id": f"c{n - 1}", "content": "ok " * 200})
        else:
            messages.append({"id": f"u{n}", "role": "user", "content": f"Next step {n}: " + "details " * 150})
    return messages


class Model:
    """A client's model as the tests script it: what each summary call got, and how it answers."""

    def __init__(self, answer: Any = "MODEL SUMMARY of the span") -> None:
        self.answer = answer
        self.calls: list[t.SummarizeParams] = []

    async def __call__(self, params: t.SummarizeParams) -> t.SummarizeResult:
        self.calls.append(params)
        answer = self.answer(params) if callable(self.answer) else self.answer
        if isinstance(answer, BaseException):
            raise answer
        if answer == "hang":
            await asyncio.Event().wait()
        if isinstance(answer, str):
            return t.SummarizeResult(text=answer, model="agent-model",
                                     usage=t.SummaryCallUsage(input_tokens=900, output_tokens=40,
                                                              cache_read_tokens=100))
        return answer  # type: ignore[no-any-return]


def env_for(runtime: Path) -> dict[str, str]:
    return {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}


@contextlib.asynccontextmanager
async def client(db: Path, runtime: Path, model: Model | None = None, share: bool = True,
                 settings: dict[str, Any] | None = None, verbose: bool = False) -> AsyncIterator[SidecarClient]:
    command = [sys.executable, "-P", "-m", "sidecar", *([] if share else ["--no-share"]), *(["-v"] if verbose else [])]
    started = await SidecarClient.spawn(command, settings={"storage": {"path": str(db)}, **(settings or SETTINGS)},
                                        env=env_for(runtime), timeout=WAIT, summarize=model)
    with contextlib.suppress(SidecarRequestError):
        await started.sessions()  # attached: the first client answers initialize before its host listens
    try:
        yield started
    finally:
        await started.close()


async def summaries_of(sidecar: SidecarClient, session_id: str) -> list[str]:
    """The text of each summary in the session's context, oldest first."""
    assembled = await sidecar.assemble(session_id, prune=False)
    ids = [item.id for item in assembled.items if item.kind == "summary"]
    described = [await sidecar.describe(session_id, summary_id) for summary_id in ids]
    return [d.content for d in described]


async def test_the_driving_clients_model_writes_the_summaries(tmp_path: Path, runtime: Path) -> None:
    model = Model()
    async with client(tmp_path / "m.duckdb", runtime, model) as agent:
        await agent.ingest("s", history())
        compacted = agent.wait_for_notification(methods.CONTEXT_DID_COMPACT)
        result = await agent.compact("s", mode="incremental")
        assert result.compacted
        event = await compacted
        assert event.summarizers and set(event.summarizers) == {"client"}
        call = model.calls[0]
        assert call.session_id == "s" and call.kind == "leaf"
        assert [m["role"] for m in call.messages] == ["system", "user"]
        assert "Fix the parser" in call.messages[1]["content"]
        assert call.deadline_seconds == 3 and call.max_tokens > 0
        contents = await summaries_of(agent, "s")
        # The engine's footer stays: the standing rule and the edited files follow the model's text.
        assert contents[0].startswith("MODEL SUMMARY of the span")
        assert RULE in contents[0] and "src/parser1.py" in contents[0]


@pytest.mark.parametrize("answer", [
    SidecarRequestError(codes.SUMMARIZER_FAILED, "upstream answered 429: rate limited"),
    RuntimeError("the provider answered 500"),
    "hang",
    t.SummarizeResult(text="   "),
], ids=["refused", "crashed", "timeout", "empty"])
async def test_a_failed_summary_call_falls_back_and_the_session_goes_on(tmp_path: Path, runtime: Path,
                                                                      answer: Any) -> None:
    model = Model(answer)
    async with client(tmp_path / "m.duckdb", runtime, model) as agent:
        await agent.ingest("s", history())
        compacted = agent.wait_for_notification(methods.CONTEXT_DID_COMPACT)
        result = await agent.compact("s", mode="incremental")
        assert result.compacted, result.reason
        event = await compacted
        assert event.summarizers and set(event.summarizers) == {"deterministic"}
        assert model.calls
        contents = await summaries_of(agent, "s")
        assert RULE in contents[0]
        # The session goes on as if nothing happened.
        await agent.ingest("s", [{"id": "late", "role": "user", "content": "and now?"}])
        assembled = await agent.assemble("s")
        assert assembled.messages[-1]["content"] == "and now?"


@pytest.mark.parametrize("garbage", [["not", "a", "summary"], {"text": 42}, {"summary": "no text field"}, None],
                         ids=["list", "text-not-string", "no-text", "null"])
async def test_a_result_of_the_wrong_shape_falls_back(tmp_path: Path, runtime: Path, garbage: Any) -> None:
    """Bad input: the client answers context/summarize with something that is no result; the deterministic summary
    stands in."""
    db = tmp_path / "m.duckdb"
    async with client(db, runtime, Model()) as agent:
        agent._serve = _answering(agent._serve, garbage)  # type: ignore[method-assign]
        await agent.ingest("s", history())
        compacted = agent.wait_for_notification(methods.CONTEXT_DID_COMPACT)
        assert (await agent.compact("s", mode="incremental")).compacted
        assert set((await compacted).summarizers or {}) == {"deterministic"}


def _answering(serve: Any, result: Any) -> Any:
    async def answer(method: str, params: Any) -> Any:
        if method == methods.CONTEXT_SUMMARIZE:
            return result
        return await serve(method, params)
    return answer


async def test_the_summary_call_goes_to_the_client_that_drives_the_session(tmp_path: Path, runtime: Path) -> None:
    """Several clients on one host: an editor's compaction of the agent's session is written by the agent's
    model; a session the agent never stored in is not sent to it."""
    db = tmp_path / "m.duckdb"
    agent_model, other_model = Model("AGENT MODEL SUMMARY"), Model("OTHER MODEL SUMMARY")
    async with client(db, runtime, agent_model) as agent, client(db, runtime) as editor, \
            client(db, runtime, other_model) as other:
        await agent.ingest("agent-session", history())
        await editor.ingest("editor-session", history())
        result = await editor.compact("agent-session", mode="incremental")
        assert result.compacted
        assert (await summaries_of(editor, "agent-session"))[0].startswith("AGENT MODEL SUMMARY")
        assert agent_model.calls and not other_model.calls
        assert {c.session_id for c in agent_model.calls} == {"agent-session"}
        # The editor's own session: no client that runs summary calls drives it.
        calls = len(agent_model.calls)
        assert (await editor.compact("editor-session", mode="incremental")).compacted
        assert len(agent_model.calls) == calls and not other_model.calls
        # Another agent that stores in the session drives it from then on.
        await other.ingest("agent-session", [{"id": f"more{n}", "role": "user", "content": f"more {n} " * 200}
                                             for n in range(8)])
        assert (await editor.compact("agent-session", mode="incremental")).compacted
        assert other_model.calls and {c.session_id for c in other_model.calls} == {"agent-session"}


async def test_a_client_that_left_no_longer_writes_summaries(tmp_path: Path, runtime: Path) -> None:
    db = tmp_path / "m.duckdb"
    model = Model()
    async with client(db, runtime) as editor:
        async with client(db, runtime, model) as agent:
            await agent.ingest("s", history())
        assert (await editor.compact("s", mode="incremental")).compacted
        assert not model.calls
        assert not (await summaries_of(editor, "s"))[0].startswith("MODEL SUMMARY")


async def test_a_process_of_its_own_asks_its_client_too(tmp_path: Path, runtime: Path) -> None:
    model = Model()
    async with client(tmp_path / "m.duckdb", runtime, model, share=False) as agent:
        await agent.ingest("s", history())
        assert (await agent.compact("s", mode="handoff")).compacted
        assert model.calls[0].kind == "handoff"
        assert (await summaries_of(agent, "s"))[0].startswith("MODEL SUMMARY")


async def test_initialize_says_the_server_takes_summary_calls(tmp_path: Path, runtime: Path) -> None:
    async with client(tmp_path / "m.duckdb", runtime, Model(), share=False) as agent:
        assert agent.capabilities.get("clientSummaries") is True


AHEAD = {"compaction": {"maxTokens": 3000, "freshTail": 2, "leafChunkSize": 4, "minSavings": 0, "keepRecentTokens": 0,
                        "summarizeAhead": 0.5}, "llm": {"timeoutSeconds": 30}}
WRITTEN_AHEAD = "summaries written ahead, waiting for the threshold"


async def test_summaries_are_written_ahead_and_replace_the_history_at_the_threshold(tmp_path: Path,
                                                                                   runtime: Path) -> None:
    db = tmp_path / "m.duckdb"
    model = Model()
    async with client(db, runtime, model, settings=AHEAD, verbose=True) as agent:
        usage = (await agent.ingest("s", history())).usage
        assert usage.threshold / 2 <= usage.tokens < usage.threshold
        await until_logged(sock_of(runtime, db).with_suffix(".log"), WRITTEN_AHEAD)
        calls = len(model.calls)
        assert calls
        # Written, not applied: the history is as it was, and the session is not shown compacting.
        assert not [item for item in (await agent.assemble("s")).items if item.kind == "summary"]
        assert (await agent.usage("s")).state != "compacting"
        compacted = agent.wait_for_notification(methods.CONTEXT_DID_COMPACT)
        crossed = await agent.ingest("s", [{"id": f"big{n}", "role": "user", "content": f"more {n} " * 300}
                                           for n in range(4)])
        assert crossed.usage.tokens >= crossed.usage.threshold
        event = await compacted
        assert event.trigger == "auto" and set(event.summarizers or {}) == {"client"}
        assert len(model.calls) == calls  # no summary call after the threshold: they were made before it
        assert (await summaries_of(agent, "s"))[0].startswith("MODEL SUMMARY")


async def test_a_compact_request_lands_the_summaries_written_ahead_at_once(tmp_path: Path, runtime: Path) -> None:
    db = tmp_path / "m.duckdb"
    model = Model()
    async with client(db, runtime, model, settings=AHEAD, verbose=True) as agent:
        await agent.ingest("s", history())
        await until_logged(sock_of(runtime, db).with_suffix(".log"), WRITTEN_AHEAD)
        calls = len(model.calls)
        result = await agent.compact("s")
        assert result.compacted and len(model.calls) == calls
        assert (await summaries_of(agent, "s"))[0].startswith("MODEL SUMMARY")


async def test_a_deterministic_session_is_not_compacted_ahead(tmp_path: Path, runtime: Path) -> None:
    db = tmp_path / "m.duckdb"
    async with client(db, runtime, None, settings=AHEAD) as editor:
        usage = (await editor.ingest("s", history())).usage
        assert usage.threshold / 2 <= usage.tokens < usage.threshold
        # Nothing to win by writing a deterministic summary early: the history stays until the threshold.
        assert not [item for item in (await editor.assemble("s")).items if item.kind == "summary"]
        assert (await editor.usage("s")).state != "compacting"
