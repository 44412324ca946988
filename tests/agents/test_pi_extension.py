"""pi with the context-sidecar extension (editors/pi), offline: the sidecar assembles every prompt pi sends.

pi runs in RPC mode with ``-e editors/pi`` against the fake provider; the extension starts the checkout's
``context-sidecar`` from the world's PATH, on the world's per-user database, shared through a host as an
editor would share it. The world's refusing proxy checks after each test that nothing left the machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.client import SidecarClient
from sidecar.testing import RecordedRequest, Reply, ToolCall, reference_policy
from sidecar.testing.conversation import prompt_chars
from tests.agents.runners import Claude, Pi, PiRpc
from tests.agents.world import AgentWorld
from tests.helpers.proxy import is_summary_call

EXTENSION = Path(__file__).resolve().parents[2] / "editors" / "pi"
SUMMARY_TAG = '<summary id="sum_'
FACT = "the deploy password hint is QUOKKA-314"
MAX_TOKENS = 4096
"""The runner's model asks for this many output tokens; the reserve covers it."""


def configure(pi: Pi, *, window: int, reserve: int | None, keep_recent: int = 20_000,
              sidecar: dict[str, Any] | None = None, extension: dict[str, Any] | None = None) -> None:
    """pi's window and compaction settings (pi's defaults with ``reserve`` None), and the extension's
    (``contextSidecar``) in pi's settings.json."""
    pi.context_window = window
    pi.dir.mkdir(parents=True, exist_ok=True)
    settings: dict[str, Any] = {"contextSidecar": {**(extension or {}), "settings": sidecar or {}}}
    if reserve is not None:
        settings["compaction"] = {"reserveTokens": reserve, "keepRecentTokens": keep_recent}
    (pi.dir / "settings.json").write_text(json.dumps(settings), encoding="utf-8")


def with_extension(pi: Pi, env: dict[str, str] | None = None) -> PiRpc:
    """``pi --mode rpc -e editors/pi``."""
    return pi.rpc("-e", str(EXTENSION), env=env)


def prompt_tokens(request: RecordedRequest) -> int:
    """The request's prompt as the fake provider counts it against its window, with the output it asks for."""
    body = request.body
    return prompt_chars("chat", body) // 4 + int(body.get("max_completion_tokens") or body.get("max_tokens") or 0)


def words(step: int) -> str:
    """A prompt of about 500 tokens that names its step."""
    return f"step {step}: " + f"keep rule {step} of the tokenizer intact while editing parser.py. " * 30


def user_texts(request: RecordedRequest) -> list[str]:
    """The texts of the request's user messages, as sent."""
    out = []
    for message in request.body["messages"]:
        if message["role"] == "user":
            content = message["content"]
            out.append(content if isinstance(content, str) else "".join(p.get("text", "") for p in content))
    return out


def pi_requests(world: AgentWorld) -> list[RecordedRequest]:
    """pi's own requests to its model, without the sidecar's summary calls that the extension runs on it."""
    return [r for r in world.provider.model_requests if not is_summary_call(r)]


def notices(rpc: PiRpc) -> list[str]:
    """What the extension told the user (pi's notify, sent as extension UI requests in RPC mode)."""
    return [e["message"] for e in rpc.events if e.get("type") == "extension_ui_request" and e.get("method") == "notify"]


def session_file(pi: Pi) -> tuple[str, list[dict[str, Any]]]:
    """pi's session id and its entries."""
    [path] = pi.sessions()
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return lines[0]["id"], lines[1:]


@pytest.fixture
async def memory(agent_world: AgentWorld) -> AsyncIterator[SidecarClient]:
    """A client of the world's database through the same host as pi's extension, as an editor would connect."""
    client = await SidecarClient.spawn([str(agent_world.sidecar)], env=agent_world.env())
    try:
        yield client
    finally:
        await client.close()


def test_after_the_sidecar_compacts_pi_sends_its_summary_within_the_window(pi: Pi, agent_world: AgentWorld) -> None:
    window = 16_000
    agent_world.provider.context_window = window  # a prompt over it would be answered with the API's 400
    configure(pi, window=window, reserve=5_000, sidecar={"compaction": {"freshTail": 4, "leafChunkSize": 4}})
    with with_extension(pi) as rpc:
        requests: list[RecordedRequest] = []
        for step in range(40):
            before = len(pi_requests(agent_world))
            rpc.prompt(words(step))
            requests += pi_requests(agent_world)[before:]
            if any(text.startswith(SUMMARY_TAG) for text in user_texts(requests[-1])):
                break
        else:
            pytest.fail("no request carried a summary of the sidecar after 40 prompts of 500 tokens")
        assert not any(e.get("type") == "compaction_start" for e in rpc.events), "pi never compacted itself"
        after = rpc.prompt(words(99))

    assert agent_world.provider.rejected == []
    sizes = [prompt_tokens(r) for r in requests]
    assert max(sizes) <= window, sizes
    assert max(sizes) > window // 2, "the session filled the window: the budget, not chance, kept it within"
    last = user_texts(pi_requests(agent_world)[-1])
    assert last[0].startswith(SUMMARY_TAG), "the sidecar's summary opens the conversation"
    assert not any(text.startswith("step 0:") for text in last), "the summary stands for the first steps"
    assert last[-1].startswith("step 99:") and any(e.get("type") == "agent_end" for e in after)


RULE = "Never edit the generated files under build/ by hand."
PI_SUMMARIZER = "You are a context summarization assistant"


def reading(request: RecordedRequest) -> Reply:
    """The fake model of a tool-heavy session: each prompt asks to read a file, read with pi's ``read`` tool."""
    if request.tool_result is not None:
        return Reply(text="Read it. " + request.tool_result[:40])
    asked = re.search(r"read (notes/\S+\.txt)", request.last_user_text)
    if asked and any(tool.name == "read" for tool in request.tools):
        return Reply(tool_calls=(ToolCall("read", {"path": asked.group(1)}),))
    return Reply(text="Noted.")


def reading_session(agent_world: AgentWorld, rpc: PiRpc, turns: int) -> list[RecordedRequest]:
    """``turns`` prompts, each reading a file of about 1,200 tokens; the first states a standing rule. pi's requests."""
    notes = agent_world.workspace / "notes"
    notes.mkdir(exist_ok=True)
    agent_world.provider.responder = reading
    for turn in range(turns):
        (notes / f"f{turn}.txt").write_text(f"file {turn}\n" + f"line of file {turn}: x = {turn}\n" * 200)
        rpc.prompt(("" if turn else RULE + " ") + f"Turn {turn}: read notes/f{turn}.txt and tell me what it holds.")
    return pi_requests(agent_world)


def after_compaction(agent_world: AgentWorld, window: int) -> list[RecordedRequest]:
    """pi's requests from the first that carries a summary on, each checked: the summary and the standing rule are
    there, the conversation does not open with an assistant message cut from its turn; and every request to the
    model (the sidecar's summary calls, which run on it too, as well) fits the window."""
    requests = pi_requests(agent_world)
    first = next((i for i, r in enumerate(requests) if any(t.startswith(SUMMARY_TAG) for t in user_texts(r))), None)
    assert first is not None, "the sidecar compacted and its summary reached the provider"
    later = requests[first:]
    missing = [i for i, r in enumerate(later) if not any(t.startswith(SUMMARY_TAG) for t in user_texts(r))]
    assert missing == [], f"{len(missing)} of {len(later)} requests after the first compaction carry no summary"
    ruleless = [i for i, r in enumerate(later) if not any(RULE in t for t in user_texts(r))]
    assert ruleless == [], f"{len(ruleless)} of {len(later)} requests lack the rule stated in the first turn"
    opening = [next(m["role"] for m in r.body["messages"] if m["role"] != "system") for r in later]
    assert set(opening) == {"user"}, opening
    summary_calls = len(agent_world.provider.model_requests) - len(requests)
    assert summary_calls > 0, "the sidecar's summaries were written by pi's model"
    sizes = [prompt_tokens(r) for r in agent_world.provider.model_requests]
    assert max(sizes) <= window, sizes
    return later


def test_every_request_after_the_first_compaction_carries_the_summary_and_the_rules_on_a_16k_model(
        pi: Pi, agent_world: AgentWorld) -> None:
    window = 16_384
    agent_world.provider.context_window = window
    configure(pi, window=window, reserve=4096)
    with with_extension(pi) as rpc:
        requests = reading_session(agent_world, rpc, 30)
        later = after_compaction(agent_world, window)
    assert len(later) >= 20, "most of the session came after the first compaction"
    assert agent_world.provider.rejected == []
    assert not any(e.get("type") == "compaction_start" for e in rpc.events), "pi never compacted itself"
    assert all("memory_grep" in {t.name for t in r.tools} for r in requests), "the extension never stepped aside"


def test_pi_with_its_default_settings_on_a_16k_model_works_and_says_once_which_setting_to_change(
        pi: Pi, agent_world: AgentWorld) -> None:
    """pi's default reserve (16,384) is the whole window: pi asks to compact before every turn."""
    window = 16_384
    agent_world.provider.context_window = window
    configure(pi, window=window, reserve=None)
    with with_extension(pi) as rpc:
        requests = reading_session(agent_world, rpc, 24)
        after_compaction(agent_world, window)
    assert agent_world.provider.rejected == []
    assert not any(PI_SUMMARIZER in json.dumps(r.body["messages"][:1]) for r in requests), "pi's summarizer unused"
    assert all("memory_grep" in {t.name for t in r.tools} for r in requests), "the extension never stepped aside"
    said = notices(rpc) or [line for line in rpc.stderr.splitlines() if "context-sidecar" in line]
    advice = [text for text in said if "compaction.reserveTokens" in text]
    assert len(advice) == 1 and "8192 or less" in advice[0], said
    assert not any("pi keeps its own context" in text for text in said), said


async def test_pis_compact_command_compacts_through_the_sidecar(pi: Pi, agent_world: AgentWorld,
                                                                memory: SidecarClient) -> None:
    configure(pi, window=200_000, reserve=16_384, keep_recent=600,
              sidecar={"compaction": {"freshTail": 2, "leafChunkSize": 2, "minSavings": 0}})
    with with_extension(pi) as rpc:
        for step in range(8):
            rpc.prompt(words(step))
        asked = len(pi_requests(agent_world))
        compacted = rpc.request({"type": "compact", "customInstructions": "the tokenizer rules"}, timeout=60)
        # The sidecar's summary calls run on pi's model (context/summarize); pi's own summarizer is never called.
        assert len(pi_requests(agent_world)) == asked, "pi's own summarizer was never called"
        summary = compacted["data"]["summary"]
        assert summary.startswith(SUMMARY_TAG)
        assert compacted["data"]["details"]["source"] == "context-sidecar"
        rpc.prompt("what next?")

    sent = user_texts(pi_requests(agent_world)[-1])
    assert summary.split('"')[1] in sent[0], "the next request opens with the summary the sidecar made"
    assert not any(text.startswith("step 0:") for text in sent) and sent[-1] == "what next?"
    session, entries = session_file(pi)
    [entry] = [e for e in entries if e["type"] == "compaction"]
    assert entry["summary"] == summary and entry["fromHook"] is True
    kept = next(e for e in entries if e["id"] == entry["firstKeptEntryId"])
    assert kept["type"] == "message" and kept["message"]["role"] in ("user", "assistant")
    described = await memory.describe(session, summary.split('"')[1])
    assert described.kind in ("leaf", "condensed") and described.message_count >= 4

    before = await memory.assemble(session)
    [path] = pi.sessions()
    await memory.import_transcript(str(path), session_id=session, format="pi")
    after = await memory.assemble(session)
    summaries = [i.id for i in after.items if i.kind == "summary"]
    assert summaries == [i.id for i in before.items if i.kind == "summary"], \
        "pi's record of the sidecar's own compaction is not taken for an agent's compaction"


async def test_a_memory_tool_call_round_trip(pi: Pi, agent_world: AgentWorld, memory: SidecarClient) -> None:
    configure(pi, window=200_000, reserve=16_384)
    agent_world.provider.responder = reference_policy(tool="memory_grep", arguments={"pattern": "BLUE-HERON"})
    with with_extension(pi) as rpc:
        rpc.prompt("Note for later: the deploy key hint is BLUE-HERON.")
        events = rpc.prompt("USE_TOOL what was the deploy key hint?")
    call, answer = agent_world.provider.model_requests[-2:]
    assert {"memory_grep", "memory_describe", "memory_expand", "memory_query"} <= {t.name for t in call.tools}
    session, entries = session_file(pi)
    first = next(e for e in entries if e["type"] == "message" and e["message"]["role"] == "user")
    result = answer.tool_result or ""
    assert "BLUE-HERON" in result and first["id"] in result, "the match names pi's entry of the first message"
    ended = [e for e in events if e.get("type") == "tool_execution_end"]
    assert ended and ended[0]["toolName"] == "memory_grep" and ended[0]["isError"] is False
    assert json.loads(json.dumps(answer.body))["messages"][-1]["role"] == "tool"
    grep = await memory.grep(session, "BLUE-HERON")
    assert first["id"] in [m.id for m in grep.matches]


async def test_pis_memory_tools_read_every_session_of_the_workspace_as_the_mcp_server_s_do(
        pi: Pi, claude: Claude, agent_world: AgentWorld, memory: SidecarClient) -> None:
    """One scope for every face: what an earlier Claude Code session of the folder was told is found from pi."""
    agent_world.provider.responder = reference_policy()
    earlier = claude.run(f"Remember this for later: {FACT}.").check().output["session_id"]
    configure(pi, window=200_000, reserve=16_384)
    agent_world.provider.responder = reference_policy(tool="memory_grep", arguments={"pattern": "QUOKKA"})
    with with_extension(pi) as rpc:
        rpc.prompt("The cart test is flaky; keep that in mind.")
        events = rpc.prompt("USE_TOOL what was the deploy password hint?")
    ended = [e for e in events if e.get("type") == "tool_execution_end"]
    assert ended and ended[0]["toolName"] == "memory_grep" and ended[0]["isError"] is False
    result = agent_world.provider.model_requests[-1].tool_result or ""
    assert FACT in result, result
    assert f"In session {earlier} (earlier;" in result and "Claude Code 2.1.197" in result
    session, _ = session_file(pi)
    asked = await memory.call_tool(session, "memory_grep", json.dumps({"pattern": "QUOKKA"}),
                                   workspace=str(agent_world.workspace))
    assert asked["content"] == result, "the MCP server's call over the workspace answers the same, word for word"


async def test_pis_session_is_stored_once_under_pis_own_ids(pi: Pi, agent_world: AgentWorld,
                                                            memory: SidecarClient) -> None:
    configure(pi, window=200_000, reserve=16_384)
    agent_world.provider.responder = reference_policy(tool="bash", arguments={"command": "echo kit-$((6*7))"})
    with with_extension(pi) as rpc:
        rpc.prompt("USE_TOOL run it")
        rpc.prompt("and again: USE_TOOL")
        rpc.prompt("thanks")
        session, _ = session_file(pi)
        last = agent_world.provider.model_requests[-1]
        # What the fake counted for the last call: its prompt and its answer, four characters a token.
        counted = prompt_chars("chat", last.body) // 4 + len("Hello from the fake model.") // 4
        usage = await wait_for_usage(memory, session, lambda u: u.reported_tokens == counted)
    assert usage.source == "provider" and usage.reported_tokens == counted, "pi's provider usage was reported"

    session, entries = session_file(pi)
    ids = [e["id"] for e in entries if e["type"] == "message"]
    [path] = pi.sessions()
    imported = await memory.import_transcript(str(path), session_id=session, format="pi")
    assert imported.ids == ids
    assert imported.duplicates == len(ids) - 1, "all but the last answer (sent to no model since) was stored"
    assert not imported.replaced
    listed = await memory.sessions()
    [info] = [s for s in listed.sessions if s.session_id == session]
    assert info.workspace == str(agent_world.workspace.resolve()), "editors on the workspace see pi's session"


async def test_an_editor_watching_the_workspace_leaves_the_session_to_the_extension(
        pi: Pi, agent_world: AgentWorld, memory: SidecarClient) -> None:
    """What pi writes after a /tree rewind must not reach the session of the line it left (it is a branch's)."""
    configure(pi, window=200_000, reserve=16_384)
    pi.run("a session without the extension", env={"CONTEXT_SIDECAR_PI": "off"}).check()
    [plain] = pi.sessions()
    with with_extension(pi) as rpc:
        rpc.prompt("alpha one")
        rpc.prompt("beta two")
    carried = next(path for path in pi.sessions() if path != plain)
    lines = [json.loads(line) for line in carried.read_text(encoding="utf-8").splitlines()]
    session = lines[0]["id"]
    first_answer = next(e for e in lines if e.get("type") == "message" and e["message"]["role"] == "assistant")
    rewound = {"type": "message", "id": "f00dfeed", "parentId": first_answer["id"], "timestamp": "2026-11-26T10:00:00Z",
               "message": {"role": "user", "content": [{"type": "text", "text": "delta REWOUND"}],
                           "timestamp": 1795687200000}}
    with carried.open("a", encoding="utf-8") as file:  # pi's /tree to the first answer, then a new prompt
        file.write(json.dumps(rewound) + "\n")
    before = [item.id for item in (await memory.assemble(session)).items]

    plain_id = json.loads(plain.read_text(encoding="utf-8").splitlines()[0])["id"]
    assert plain_id in {s.session_id for s in (await memory.sessions()).sessions}, \
        "the extension's own watch of the folder imported pi's earlier session, for the memory tools"
    env = {"HOME": str(agent_world.home), "PI_CODING_AGENT_DIR": str(pi.dir)}
    deadline = time.monotonic() + 60
    while True:  # as an editor on the folder does; until the host has looked at the extension's file
        watched = await memory.watch(str(agent_world.workspace), env=env)
        [state] = [t for t in watched.transcripts if t.path == str(carried)]
        if state.state != "queued" or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert state.state == "skipped" and "pi extension" in (state.problem or ""), state
    assert [item.id for item in (await memory.assemble(session)).items] == before, "the rewound branch stays out"


async def wait_for_usage(client: SidecarClient, session: str, accept: Any, timeout: float = 20.0) -> Any:
    """The session's usage once ``accept`` takes it (the extension's report travels on another connection)."""
    deadline = time.monotonic() + timeout
    while True:
        usage = await client.usage(session)
        if accept(usage) or time.monotonic() > deadline:
            return usage
        await asyncio.sleep(0.05)


def test_pi_carries_on_when_the_sidecar_cannot_start(pi: Pi, agent_world: AgentWorld) -> None:
    configure(pi, window=200_000, reserve=16_384)
    missing = str(agent_world.root / "no-such-sidecar")
    with with_extension(pi, env={"CONTEXT_SIDECAR_COMMAND": missing}) as rpc:
        rpc.prompt("hello")
        rpc.prompt("hello again")
    said = notices(rpc)
    assert len(said) == 1 and "not found" in said[0] and "pi keeps its own context and compaction" in said[0]
    first, second = agent_world.provider.model_requests
    for request in (first, second):
        assert not {t.name for t in request.tools} & {"memory_grep", "memory_query"}, "no tool without its server"
    assert [m["role"] for m in second.body["messages"]] == ["system", "user", "assistant", "user"]


async def test_pi_does_not_wait_for_a_sidecar_that_hangs_and_uses_it_once_it_answers(
        pi: Pi, agent_world: AgentWorld, memory: SidecarClient) -> None:
    configure(pi, window=200_000, reserve=16_384)
    gate = agent_world.root / "gate"
    hanging = agent_world.root / "hanging-sidecar"  # answers nothing until the gate opens, then is the server
    hanging.write_text(f'#!/bin/sh\nwhile [ ! -e "{gate}" ]; do sleep 0.05; done\nexec "{agent_world.sidecar}" "$@"\n')
    hanging.chmod(0o755)

    def respond(request: RecordedRequest) -> str:
        gate.touch()  # pi asked its model while the server still hung: it did not wait for it
        return "answered"

    agent_world.provider.responder = respond
    deadline = time.monotonic() + 90
    with with_extension(pi, env={"CONTEXT_SIDECAR_COMMAND": str(hanging)}) as rpc:
        rpc.prompt("<<opening>> hello")
        while not (sessions := (await memory.sessions()).sessions) and time.monotonic() < deadline:
            rpc.prompt("and now?")  # each call finds the server ready or not; once ready, it stores the branch
    said = notices(rpc)
    assert said == [], "the extension never gave up on the server"
    [session] = sessions
    assert (await memory.grep(session.session_id, "<<opening>>", scope="messages")).matches  # what it missed, stored


def test_pi_says_once_why_the_sidecar_cannot_store_its_session(pi: Pi, agent_world: AgentWorld) -> None:
    configure(pi, window=200_000, reserve=16_384)
    blocked = agent_world.root / "a-file"
    blocked.write_text("not a directory")
    with with_extension(pi, env={"CONTEXT_SIDECAR_DB": str(blocked / "memory.duckdb")}) as rpc:
        rpc.prompt("hello")
        rpc.prompt("hello again")
    said = notices(rpc)
    assert len(said) == 1, said
    assert said[0].startswith("context-sidecar: cannot open ") and str(blocked) in said[0]
    assert [m["role"] for m in agent_world.provider.model_requests[-1].body["messages"]] == [
        "system", "user", "assistant", "user"], "pi sent its own context"


def test_pi_carries_on_when_the_sidecar_dies(pi: Pi, agent_world: AgentWorld) -> None:
    configure(pi, window=200_000, reserve=16_384)
    with with_extension(pi) as rpc:
        rpc.prompt("hello")
        assert "memory_grep" in {t.name for t in agent_world.provider.model_requests[-1].tools}
        for child in children(rpc.process.pid):
            os.kill(child, signal.SIGKILL)  # the extension's context-sidecar
        rpc.prompt("still there?")
        rpc.prompt("and now?")
    said = notices(rpc)
    assert len(said) == 1 and "killed by SIGKILL" in said[0], said
    last = agent_world.provider.model_requests[-1]
    assert "memory_grep" not in {t.name for t in last.tools}
    assert [m["role"] for m in last.body["messages"]][1:] == ["user", "assistant", "user", "assistant", "user"]


def children(pid: int) -> list[int]:
    """The direct children of a process (Linux)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text(encoding="ascii").split()
        found += [int(p) for p in text]
    assert found, f"process {pid} has no children"
    return found
