"""Pinned context through the real server: system and pinned messages stay, rules and files ride in footers."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pygls.exceptions import JsonRpcException

from protocol import errors, methods
from sidecar.cli.synthetic import coding_session
from sidecar.testing import FakeOpenAIServer, Reply
from tests.conftest import call, ingest, running_sidecar, settings_for
from tests.helpers.openai_checks import assert_valid_openai_sequence

MANUAL = {"auto": False}
SYSTEM = "You are a coding agent. NEVER push to main. Always run pytest before committing."
RULE = "Important: never touch the vendor/ folder."
GENERIC = "Summary: the agent kept working on the task and made progress."


def work(turns: int) -> list[dict[str, Any]]:
    """``turns`` turns of four messages: a request, an edit call (a JSON-escaped newline before a path), its
    output, and an answer."""
    out: list[dict[str, Any]] = []
    for turn in range(turns):
        path = f"src/parser{turn % 3}.ts"
        arguments = json.dumps({"path": path, "content": "import { lex } from './lexer'\nmain.ts\n" + "x;\n" * 60})
        out += [
            {"id": f"u{turn}", "role": "user", "content": f"Go on with step {turn} of the parser fix."},
            {"id": f"a{turn}", "role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{turn}", "type": "function", "function": {"name": "edit", "arguments": arguments}}]},
            {"id": f"t{turn}", "role": "tool", "tool_call_id": f"c{turn}", "content": "line of output\n" * 150},
            {"id": f"r{turn}", "role": "assistant", "content": f"Edited {path} for step {turn}."},
        ]
    return out


def issue_session() -> list[dict[str, Any]]:
    """The issue's scenario: a system message, a user message with a standing rule, then 120 messages."""
    return [{"id": "sys", "role": "system", "content": SYSTEM},
            {"id": "rule", "role": "user", "content": f"{RULE} Fix the parser bug."}, *work(30)]


def text_of(messages: list[dict[str, Any]]) -> str:
    return "\n".join(m["content"] for m in messages if isinstance(m.get("content"), str))


@pytest.fixture
def llm():
    with FakeOpenAIServer() as server:
        server.responder = lambda request: Reply(text=GENERIC)
        yield server


def llm_settings(db_path, server, **compaction):
    return settings_for(db_path, compaction={**MANUAL, **compaction},
                        llm={"baseUrl": server.base_url, "model": "fake-model", "timeoutSeconds": 30})


@pytest.mark.parametrize("mode", ["full", "handoff"])
@pytest.mark.parametrize("summarizer", ["deterministic", "llm"])
async def test_system_message_and_rules_survive_compaction(db_path, llm, mode, summarizer):
    settings = llm_settings(db_path, llm) if summarizer == "llm" else settings_for(db_path, compaction=MANUAL)
    async with running_sidecar(settings=settings) as client:
        await ingest(client, "s", issue_session(), contextWindow=32000)
        result = await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s", "mode": mode})
        assert result["compacted"], result
        assembled = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
        assert assembled["messages"][0] == {"role": "system", "content": SYSTEM}
        assert assembled["items"][0]["id"] == "sys" and assembled["items"][1]["kind"] == "summary"
        ids = [item["id"] for item in assembled["items"]]
        assert "rule" not in ids, "the rule's message was compacted: only a footer can have carried the rule"
        text = text_of(assembled["messages"])
        assert RULE in text and "NEVER push to main" in text
        # Quoted tool calls keep their JSON escapes; a path list must not hold "nmain.ts" from "\\nmain.ts".
        assert "nmain.ts" not in text.replace("\\nmain.ts", ""), "paths come from decoded text"
        summaries = [item["id"] for item in assembled["items"] if item["kind"] == "summary"]
        described = [await call(client, methods.MEMORY_DESCRIBE, {"sessionId": "s", "id": s}) for s in summaries]
        assert RULE in described[0]["rules"] and described[0]["rulesLeftOut"] == []
        assert all("<modified-files>\nsrc/parser0.ts" in d["content"] for d in described)
        assert_valid_openai_sequence(assembled["messages"])
        if summarizer == "llm":
            assert llm.chat_requests and GENERIC in text


async def test_condensed_summaries_keep_their_sources_rules(db_path):
    async with running_sidecar(settings=settings_for(db_path, compaction=MANUAL)) as client:
        session = coding_session(200)
        await ingest(client, "s", session)
        result = await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s", "mode": "incremental"})
        top = await call(client, methods.MEMORY_DESCRIBE, {"sessionId": "s", "id": result["summaryIds"][0]})
        assert top["kind"] == "condensed"
        stated = {rule for m in session[1:150] if m["role"] == "user" for rule in
                  ("Never commit secrets; the API key lives in the OPENAI_API_KEY environment variable.",
                   "Always run `pytest -q` before saying a change is done.") if rule in m["content"]}
        assert stated and stated <= set(top["rules"])
        assert "<rules>" in top["content"] and "<modified-files>" in top["content"]
        assert len(top["rules"]) == len(set(top["rules"])), "deduplicated"


async def test_a_pinned_note_survives_full_compaction_in_its_place(db_path):
    note = {"id": "note", "role": "user", "content": "Note for later: the parser lives in src/parser.ts.",
            "pinned": True}
    messages = issue_session()
    messages.insert(40, note)
    async with running_sidecar(settings=settings_for(db_path, compaction=MANUAL)) as client:
        await ingest(client, "s", messages, contextWindow=32000)
        assert (await call(client, methods.MEMORY_DESCRIBE, {"sessionId": "s", "id": "note"}))["pinned"] is True
        assert (await call(client, methods.MEMORY_DESCRIBE, {"sessionId": "s", "id": "u5"}))["pinned"] is False
        result = await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s", "mode": "full"})
        assert result["compacted"]
        assembled = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
        ids = [item["id"] for item in assembled["items"]]
        kinds = [item["kind"] for item in assembled["items"]]
        at = ids.index("note")
        assert kinds[at - 1] == "summary" and kinds[at + 1] == "summary", "kept in its place, between summaries"
        assert assembled["messages"][at] == {"role": "user", "content": note["content"]}
        # However small the budget: the system message, the pinned note and the summaries are sent, and overBudget
        # says so.
        tight = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "budget": 10, "freshTail": 0})
        assert [item["id"] for item in tight["items"] if item["kind"] == "message"] == ["sys", "note"]
        assert [i["id"] for i in tight["items"] if i["kind"] == "summary"] == \
            [i["id"] for i in assembled["items"] if i["kind"] == "summary"] and tight["overBudget"] is True


async def test_a_pinned_tool_output_keeps_its_call_and_is_never_pruned(db_path):
    session = coding_session(120, tool_output_bytes=6000)
    output = next(m for m in session[:40] if m["role"] == "tool")
    call_of = next(m for m in session if output["tool_call_id"] in [c["id"] for c in m.get("tool_calls") or ()])
    settings = settings_for(db_path, compaction=MANUAL, prune={"protectTokens": 2000, "minimumTokens": 100})
    async with running_sidecar(settings=settings) as client:
        await ingest(client, "s", session)
        pinned = await call(client, methods.MEMORY_PIN, {"sessionId": "s", "ids": [output["id"]], "pinned": True})
        assert pinned["ids"] == [output["id"]] and pinned["usage"]["sessionId"] == "s"
        assembled = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "budget": 5000})
        by_id = {item["id"]: (item, message) for item, message in zip(assembled["items"], assembled["messages"],
                                                                      strict=True)}
        assert any(item.get("pruned") for item, _ in by_id.values()), "pruning is on and prunes other outputs"
        assert by_id[output["id"]][1]["content"] == output["content"] and call_of["id"] in by_id
        result = await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s", "mode": "full"})
        assert result["compacted"]
        assembled = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
        ids = [item["id"] for item in assembled["items"]]
        assert ids.index(call_of["id"]) + 1 == ids.index(output["id"])
        assert_valid_openai_sequence(assembled["messages"])


async def test_pin_and_unpin_by_id(db_path):
    settings = settings_for(db_path, compaction={**MANUAL, "freshTail": 4, "keepRecentTokens": 0})
    async with running_sidecar(settings=settings) as client:
        await ingest(client, "s", issue_session())
        usage_seen = client.protocol.wait_for_notification_async(methods.CONTEXT_DID_CHANGE_USAGE)
        first = await call(client, methods.MEMORY_PIN, {"sessionId": "s", "ids": ["u3", "u4"], "pinned": True})
        assert first["ids"] == ["u3", "u4"] and (await usage_seen)["sessionId"] == "s"
        again = await call(client, methods.MEMORY_PIN, {"sessionId": "s", "ids": ["u4", "u5"], "pinned": True})
        assert again["ids"] == ["u5"], "only the changed ones"
        unpinned = await call(client, methods.MEMORY_PIN, {"sessionId": "s", "ids": ["u5"], "pinned": False})
        assert unpinned["ids"] == ["u5"]
        flags = {i: (await call(client, methods.MEMORY_DESCRIBE, {"sessionId": "s", "id": i}))["pinned"]
                 for i in ("u3", "u4", "u5")}
        assert flags == {"u3": True, "u4": True, "u5": False}
        assert (await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s", "mode": "full"}))["compacted"]
        ids = [i["id"] for i in (await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"}))["items"]]
        assert "u3" in ids and "u4" in ids and "u5" not in ids
        await call(client, methods.MEMORY_PIN, {"sessionId": "s", "ids": ["u3"], "pinned": False})
        await ingest(client, "s", work(40)[120:])  # more history: the next compaction has u3 to take
        result = await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s", "mode": "handoff"})
        assert result["compacted"], result
        ids = [i["id"] for i in (await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"}))["items"]]
        assert "u3" not in ids and "u4" in ids


async def test_pin_during_a_running_compaction_takes_effect(db_path, llm):
    llm.responder = lambda request: Reply(text=GENERIC, delay=1.0)
    async with running_sidecar(settings=llm_settings(db_path, llm, freshTail=4)) as client:
        session = issue_session()
        await ingest(client, "s", session)
        compaction = asyncio.ensure_future(call(client, methods.CONTEXT_COMPACT, {"sessionId": "s",
                                                                                  "mode": "full"}))
        while not llm.chat_requests:
            await asyncio.sleep(0.05)
        pinned = await call(client, methods.MEMORY_PIN, {"sessionId": "s", "ids": ["u0", "r6"], "pinned": True})
        assert pinned["ids"] == ["u0", "r6"]
        result = await compaction
        assert result["compacted"], result
        assembled = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "prune": False})
        ids = [item["id"] for item in assembled["items"]]
        assert ids[0] == "sys" and "u0" in ids and "r6" in ids and ids.index("u0") < ids.index("r6")
        by_id = dict(zip(ids, assembled["messages"], strict=True))
        assert by_id["r6"]["content"] == "Edited src/parser0.ts for step 6."
        assert_valid_openai_sequence(assembled["messages"])
        usage = await call(client, methods.CONTEXT_USAGE, {"sessionId": "s"})
        assert usage["tokens"] == assembled["tokens"]


async def test_bad_pins_change_nothing(db_path):
    async with running_sidecar(settings=settings_for(db_path, compaction=MANUAL)) as client:
        await ingest(client, "s", issue_session()[:10])
        await ingest(client, "other", [{"id": "theirs", "role": "user", "content": "hello"}])
        before = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
        for ids in (["nope"], ["u0", "nope"], ["theirs"]):
            with pytest.raises(JsonRpcException) as caught:
                await call(client, methods.MEMORY_PIN, {"sessionId": "s", "ids": ids, "pinned": True})
            assert caught.value.code == errors.ID_NOT_FOUND
        for params, field in (({"ids": ["u0"], "pinned": "yes"}, "pinned"), ({"ids": ["u0"], "pinned": 1}, "pinned"),
                              ({"ids": "u0", "pinned": True}, "ids"), ({"ids": ["u0"]}, "pinned")):
            with pytest.raises(JsonRpcException) as caught:
                await call(client, methods.MEMORY_PIN, {"sessionId": "s", **params})
            assert caught.value.code == errors.INVALID_PARAMS and caught.value.data["field"] == field
        with pytest.raises(JsonRpcException) as caught:
            await call(client, methods.MEMORY_PIN, {"sessionId": "ghost", "ids": ["u0"], "pinned": True})
        assert caught.value.code == errors.UNKNOWN_SESSION
        for value in ("yes", None, 1):
            with pytest.raises(JsonRpcException) as caught:
                await ingest(client, "s", [{"id": "bad", "role": "user", "content": "x", "pinned": value}])
            assert caught.value.code == errors.INVALID_PARAMS
            assert caught.value.data["field"] == "messages[0].pinned"
        assert (await call(client, methods.MEMORY_DESCRIBE, {"sessionId": "s", "id": "u0"}))["pinned"] is False
        assert (await call(client, methods.MEMORY_DESCRIBE, {"sessionId": "other", "id": "theirs"}))["pinned"] is False
        after = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
        # Each assemble names a new revision; the prompt itself is unchanged, byte for byte.
        assert after["stablePrefix"] == len(after["messages"])
        for reply in (before, after):
            for key in ("revision", "stablePrefix", "cacheBreakpoints"):
                del reply[key]
        assert after == before


async def test_the_python_client_pins_and_passes_pinned_through(db_path):
    from sidecar.client import SidecarClient

    async with await SidecarClient.spawn(db=str(db_path)) as client:
        await client.ingest("s", [{"id": "n", "role": "user", "content": "Always be brief.", "pinned": True},
                                  {"id": "m", "role": "user", "content": "hi"}])
        assert (await client.describe("s", "n")).pinned is True
        result = await client.pin("s", ["m"])
        assert result.ids == ["m"] and (await client.describe("s", "m")).pinned is True
        assert (await client.pin("s", ["m"], pinned=False)).ids == ["m"]


async def test_system_messages_lead_in_ingest_order_wherever_they_were_ingested(db_path):
    messages = [{"id": f"m{i}", "role": "user" if i % 2 else "assistant", "content": f"message {i}"} for i in range(8)]
    messages.insert(3, {"id": "s1", "role": "system", "content": "First system message."})
    messages.append({"id": "s2", "role": "system", "content": "Second system message."})
    messages.append({"id": "last", "role": "user", "content": "go on"})
    async with running_sidecar(settings=settings_for(db_path, compaction=MANUAL)) as client:
        await ingest(client, "s", messages)
        assembled = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
        ids = [item["id"] for item in assembled["items"]]
        assert ids[:2] == ["s1", "s2"] and ids[2:] == [m["id"] for m in messages if m["role"] != "system"]
        assert assembled["messages"][1] == {"role": "system", "content": "Second system message."}


async def test_the_rules_cap_lists_what_it_left_out(db_path):
    rules = [f"Never change module{i}.py without asking." for i in range(45)]
    filler = "Some background on the task follows here. " * 60
    messages = [{"id": f"u{i}", "role": "user",
                 "content": f"{rule} Is that a must?\n```\nmust not be read\n```\n{filler}"}
                for i, rule in enumerate(rules)]
    messages += [{"id": f"a{i}", "role": "assistant", "content": f"ok {i}"} for i in range(10)]
    messages.insert(3, {"id": "dup", "role": "user", "content": f"- {rules[0]}"})
    settings = settings_for(db_path, compaction={**MANUAL, "freshTail": 2, "keepRecentTokens": 0})
    async with running_sidecar(settings=settings) as client:
        await ingest(client, "s", messages)
        result = await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s", "mode": "handoff"})
        assert result["compacted"], result
        described = await call(client, methods.MEMORY_DESCRIBE, {"sessionId": "s", "id": result["summaryIds"][0]})
        assert described["rules"] == rules[:40], "the earliest first, deduplicated, questions and code left out"
        assert described["rulesLeftOut"] == rules[40:]
        assert "must not be read" not in "\n".join(described["rules"] + described["rulesLeftOut"])
