"""The memory tools for the model: definitions from context/assemble, calls through memory/callTool."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from pygls.exceptions import JsonRpcException

from protocol import errors, methods
from sidecar.cli.synthetic import coding_session
from sidecar.testing import FakeOpenAIServer, RecordedRequest
from tests.conftest import call, ingest, running_sidecar, settings_for

FACT = "The staging database password rotates every Tuesday; the current hint is BLUE-HERON-42."
MANUAL = {"auto": False, "freshTail": 4}
NAMES = ["memory_grep", "memory_describe", "memory_expand", "memory_query"]


def planted_session() -> list[dict[str, Any]]:
    """A coding session with the fact in an early user message, which compaction will cover."""
    messages = coding_session(120)
    messages[12] = {"id": "fact-1", "role": "user", "content": f"Note for later: {FACT}"}
    return messages


async def tool(client, name: str, arguments: Any, session_id: str = "s", **extra: Any) -> dict[str, Any]:
    """memory/callTool with arguments as the model would write them (a JSON string unless already one)."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    result = await call(client, methods.MEMORY_CALL_TOOL,
                        {"sessionId": session_id, "name": name, "arguments": text, **extra})
    return result["message"]


async def compacted(client) -> dict[str, Any]:
    """Ingest the planted session and compact it in full; returns the compact result."""
    await ingest(client, "s", planted_session())
    result = await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s", "mode": "full"})
    assert result["compacted"], result
    return result


async def state(client) -> Any:
    """All that is observable of the session, to show that a call changed nothing."""
    assembled = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "prune": False})
    return assembled["messages"], assembled["items"], await call(client, methods.MEMORY_SESSIONS, {})


async def test_tool_definitions_are_valid_json_schema_and_byte_stable(db_path):
    async with running_sidecar(settings=settings_for(db_path, compaction=MANUAL)) as client:
        await ingest(client, "s", coding_session(30))
        plain = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
        first = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "tools": True})
        await ingest(client, "s", [{"role": "user", "content": "one more"}])
        second = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "tools": True, "budget": 500})
    assert "tools" not in plain
    assert [t["function"]["name"] for t in first["tools"]] == NAMES
    assert json.dumps(first["tools"]) == json.dumps(second["tools"]), "byte-stable across calls"
    for definition in first["tools"]:
        assert definition["type"] == "function" and definition["function"]["description"]
        schema = definition["function"]["parameters"]
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["type"] == "object" and set(schema["required"]) <= set(schema["properties"])
    async with running_sidecar(settings=settings_for(db_path, compaction=MANUAL)) as client:
        again = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "tools": True})
    assert json.dumps(again["tools"]) == json.dumps(first["tools"]), "byte-stable across server restarts"


async def test_each_tool_finds_a_fact_planted_in_a_compacted_message(db_path):
    async with running_sidecar(settings=settings_for(db_path, compaction=MANUAL)) as client:
        result = await compacted(client)
        top = result["summaryIds"][0]
        assembled = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "tools": True})
        assert all(FACT not in str(m.get("content")) for m in assembled["messages"][1:]), "compacted away"
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in assembled["tools"]}

        grep_args = {"pattern": "blue-heron", "scope": "messages"}
        jsonschema.validate(grep_args, schemas["memory_grep"])
        found = await tool(client, "memory_grep", grep_args, toolCallId="call_1")
        assert found["role"] == "tool" and found["tool_call_id"] == "call_1"
        assert "message fact-1 (user" in found["content"] and "BLUE-HERON-42" in found["content"]
        assert f"compacted into {top} (condensed, depth 1)" in found["content"]
        assert "memory_expand" in found["content"], "says what to do next"

        described = await tool(client, "memory_describe", {"id": top})
        assert "tool_call_id" not in described
        assert described["content"].startswith(f"summary {top}: condensed, depth 1,")
        children = described["content"].split("oldest first (")[1].split("): ")[1].split(".\n")[0].split(", ")

        # Down the DAG with memory_expand until the fact's own message.
        seen = []
        for child in children:
            opened = await tool(client, "memory_expand", {"id": child, "tokenCap": 32000})
            seen.append(opened["content"])
            if "[message fact-1 (user," in opened["content"]:
                break
        assert FACT in seen[-1] and seen[-1].startswith(f"memory_expand summary {child} (leaf, depth 0,")
        message = await tool(client, "memory_expand", {"id": "fact-1"})
        assert message["content"].startswith("message fact-1 (user, ") and FACT in message["content"]

        asked = await tool(client, "memory_query", {"question": "What is the hint for the staging password?"})
        assert "No summarizer model is configured" in asked["content"] and "fact-1" in asked["content"]
        assert FACT in asked["content"]


def answer_from_excerpts(request: RecordedRequest) -> str:
    """A fake model: for a memory_query, the excerpt lines that hold the hint, with their id cited."""
    prompt = request.body["messages"][-1]["content"]
    if "<excerpts>" not in prompt:
        return "Summary: the agent worked on the login endpoint."
    cited = [part.split('"')[1] for part in prompt.split("<excerpt id=")[1:] if "BLUE-HERON-42" in part]
    return f"The hint is BLUE-HERON-42 [{cited[0]}]." if cited else "The excerpts do not say."


async def test_memory_query_answers_with_the_summarizer_model_citing_ids(db_path):
    with FakeOpenAIServer(responder=answer_from_excerpts) as llm:
        settings = settings_for(db_path, compaction=MANUAL, llm={"baseUrl": llm.base_url, "model": "fake-model"})
        async with running_sidecar(settings=settings) as client:
            await compacted(client)
            seen = len(llm.chat_requests)
            asked = await tool(client, "memory_query", {"question": "What is the staging password hint?"},
                               toolCallId="q1")
            query_requests = llm.chat_requests[seen:]
    assert len(query_requests) == 1
    prompt = query_requests[0].body["messages"]
    assert "Cite the id" in prompt[0]["content"]
    assert "Question: What is the staging password hint?" in prompt[1]["content"]
    assert FACT in prompt[1]["content"], "the compacted message was opened for the model"
    assert asked["tool_call_id"] == "q1" and asked["content"].startswith("memory_query answer, from ")
    assert "The hint is BLUE-HERON-42 [" in asked["content"]


BAD_CALLS = [
    ("memory_grep", "{pattern: 'x'}", "are not valid JSON"),
    ("memory_grep", "[1, 2]", "must be a JSON object"),
    ("memory_grep", "{}", "needs the argument 'pattern'"),
    ("memory_grep", {"pattern": ""}, "'pattern' must be a non-empty string"),
    ("memory_grep", {"pattern": 42}, "'pattern' must be a non-empty string"),
    ("memory_grep", {"pattern": "x", "scope": "all"}, "'scope' must be one of messages, summaries, both"),
    ("memory_grep", {"pattern": "x", "limit": 0}, "'limit' must be from 1 to 50"),
    ("memory_grep", {"pattern": "x", "limit": "5"}, "'limit' must be an integer"),
    ("memory_grep", {"pattern": "(", "regex": True}, "invalid regular expression"),
    ("memory_grep", {"pattern": "x", "color": "red"}, "has no argument 'color'"),
    ("memory_describe", {"id": "sum_nope"}, "no message or summary 'sum_nope' in this conversation"),
    ("memory_expand", {"id": "sum_nope"}, "no message or summary 'sum_nope' in this conversation"),
    ("memory_expand", {"id": "TOP", "tokenCap": 0}, "'tokenCap' must be from 1 to 32000"),
    ("memory_expand", {"id": "TOP", "tokenCap": 10**9}, "'tokenCap' must be from 1 to 32000"),
    ("memory_expand", {"id": "TOP", "tokenCap": True}, "'tokenCap' must be an integer"),
    ("memory_query", {"question": "what was it?"}, "no words to search for"),
    ("memory_remember", {"text": "x"}, "there is no tool 'memory_remember'"),
]


async def test_bad_arguments_give_a_corrective_tool_result_and_change_nothing(db_path):
    async with running_sidecar(settings=settings_for(db_path, compaction=MANUAL)) as client:
        top = (await compacted(client))["summaryIds"][0]
        await ingest(client, "other", [{"role": "user", "content": f"other session {i}"} for i in range(30)])
        other = await call(client, methods.CONTEXT_COMPACT, {"sessionId": "other"})
        before = await state(client)
        for name, arguments, expected in BAD_CALLS:
            if isinstance(arguments, dict) and arguments.get("id") == "TOP":
                arguments = {**arguments, "id": top}
            message = await tool(client, name, arguments, toolCallId="c9")
            assert message["role"] == "tool" and message["tool_call_id"] == "c9"
            assert message["content"].startswith("Error: ") and expected in message["content"], (name, message)
        foreign = await tool(client, "memory_expand", {"id": other["summaryIds"][0]})
        assert foreign["content"].startswith("Error: no message or summary"), "another session's id is not found"
        assert "other session" not in foreign["content"]
        assert await state(client) == before


@pytest.mark.parametrize("params, code", [
    ({"name": "memory_grep", "arguments": "{}"}, errors.INVALID_PARAMS),
    ({"sessionId": "s", "name": 7, "arguments": "{}"}, errors.INVALID_PARAMS),
    ({"sessionId": "s", "name": "memory_grep"}, errors.INVALID_PARAMS),
    ({"sessionId": "s", "name": "memory_grep", "arguments": {"pattern": "x"}}, errors.INVALID_PARAMS),
    ({"sessionId": "s", "name": "memory_grep", "arguments": "{}", "toolCallId": 5}, errors.INVALID_PARAMS),
    ({"sessionId": "", "name": "memory_grep", "arguments": "{}"}, errors.INVALID_PARAMS),
    ({"sessionId": "nobody", "name": "memory_grep", "arguments": '{"pattern": "x"}'}, errors.UNKNOWN_SESSION),
])
async def test_protocol_level_mistakes_are_errors(db_path, params, code):
    async with running_sidecar(settings=settings_for(db_path, compaction=MANUAL)) as client:
        await ingest(client, "s", coding_session(20))
        before = await state(client)
        with pytest.raises(JsonRpcException) as raised:
            await call(client, methods.MEMORY_CALL_TOOL, params)
        assert raised.value.code == code
        assert await state(client) == before


async def test_result_is_bounded_by_the_token_cap(db_path):
    async with running_sidecar(settings=settings_for(db_path, compaction=MANUAL)) as client:
        top = (await compacted(client))["summaryIds"][0]
        small = await tool(client, "memory_expand", {"id": top, "tokenCap": 50})
        large = await tool(client, "memory_expand", {"id": top, "tokenCap": 32000})
        grep = await tool(client, "memory_grep", {"pattern": "src", "limit": 50})
    assert len(small["content"]) <= (50 + 200) * 4 < len(large["content"])
    assert "tokenCap 50 reached" in small["content"] and "more not shown" in small["content"]
    assert len(grep["content"]) <= 4000 * 4


async def test_summaries_say_in_one_stable_line_how_to_open_them(db_path):
    async with running_sidecar(settings=settings_for(db_path, compaction=MANUAL)) as client:
        await compacted(client)
        assembled = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
    first = next(i for i, item in enumerate(assembled["items"]) if item["kind"] == "summary")  # after system
    summary = assembled["messages"][first]["content"]
    summary_id = assembled["items"][first]["id"]
    assert summary.endswith(
        "\nThis summarizes earlier messages. Their full detail is kept: open them with memory_expand (memory/expand) "
        f'id "{summary_id}", or search them with memory_grep or memory_query.')

