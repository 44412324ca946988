"""memory/callTool with ``workspace``: every session of a workspace, the current one first, each result naming it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pygls.exceptions import JsonRpcException

from protocol import methods
from tests.conftest import call, ingest, running_sidecar, settings_for
from tests.helpers.workspaces import NEW_FACT, OLD_FACT, OTHER_FACT, SHARED_ID, two_workspaces


async def tool(client: Any, name: str, arguments: dict[str, Any], **params: Any) -> str:
    result = await call(client, methods.MEMORY_CALL_TOOL, {"name": name, "arguments": json.dumps(arguments),
                                                          **params})
    return str(result["message"]["content"])


@pytest.fixture
async def stored(tmp_path: Path) -> dict[str, list[str]]:
    return await two_workspaces(tmp_path / "m.duckdb", tmp_path)


async def test_grep_reads_every_session_of_the_workspace_current_first_and_no_other(
        tmp_path: Path, stored: dict[str, list[str]]) -> None:
    ws_a = str(tmp_path / "ws-a")
    async with running_sidecar(settings=settings_for(tmp_path / "m.duckdb")) as client:
        named = await tool(client, "memory_grep", {"pattern": "platypus"}, workspace=ws_a, sessionId="a-old")
        latest = await tool(client, "memory_grep", {"pattern": "platypus"}, workspace=ws_a)
        other = await tool(client, "memory_grep", {"pattern": "wombat"}, workspace=ws_a, sessionId="b-only")
        unstored = await tool(client, "memory_grep", {"pattern": "platypus"}, workspace=ws_a, sessionId="brand-new")
        limited = await tool(client, "memory_grep", {"pattern": "platypus", "limit": 1}, workspace=ws_a)
    old_label = 'session a-old (current; "Set up the staging database"; Claude Code 2.1.197; 2026-01-05T10:00:00.000Z'
    assert f"In {old_label}" in named
    assert named.index("In session a-old") < named.index("In session a-new (earlier; \"Fix the parser\"; Codex 0.169.0")
    assert "PLATYPUS-7" in named and "PLATYPUS-8" in named and "PLATYPUS-9" not in named
    assert "message n3 (assistant, 2026-03-02T10:02:00.000Z), not compacted" in named
    assert "3 matches in 2 of the 2 sessions of this workspace" in named  # a summary and a message in a-old
    # No session named: the most recently active one (by its transcript's times) is taken as current.
    assert latest.index("In session a-new (current;") < latest.index("In session a-old (earlier;")
    # A session of another workspace is never read, even when the client names it.
    assert "no matches in the 2 sessions of this workspace" in other and "WOMBAT" not in other
    assert unstored.startswith("The current session (brand-new) has nothing stored yet")
    assert "1 match in 1 of the 2 sessions" in limited and "more exist" in limited


async def test_ids_resolve_across_the_workspace_and_a_repeated_message_id_prefers_the_current_session(
        tmp_path: Path, stored: dict[str, list[str]]) -> None:
    ws_a = str(tmp_path / "ws-a")
    summary = stored["a-old"][0]
    async with running_sidecar(settings=settings_for(tmp_path / "m.duckdb")) as client:
        described = await tool(client, "memory_describe", {"id": summary}, workspace=ws_a, sessionId="a-new")
        expanded = await tool(client, "memory_expand", {"id": summary, "tokenCap": 32000}, workspace=ws_a)
        from_old = await tool(client, "memory_expand", {"id": SHARED_ID}, workspace=ws_a, sessionId="a-old")
        from_new = await tool(client, "memory_expand", {"id": SHARED_ID}, workspace=ws_a, sessionId="a-new")
        elsewhere = await tool(client, "memory_expand", {"id": "b1"}, workspace=ws_a)
    assert described.startswith("From session a-old (earlier;") and f"summary {summary}:" in described
    assert expanded.startswith("From session a-old (earlier;") and OLD_FACT in expanded
    assert "OLD session" in from_old and "NEW" not in from_old
    assert "is in 2 sessions of this workspace; this is the one in session a-old (the current session)" in from_old
    assert "NEW session" in from_new and "also in a-old" in from_new
    assert elsewhere.startswith("Error: there is no summary or message 'b1' in the sessions of this workspace")


async def test_the_models_own_searches_are_not_found_as_history(tmp_path: Path,
                                                                stored: dict[str, list[str]]) -> None:
    call = {"id": "call_9", "type": "function",
            "function": {"name": "mcp__context-sidecar__memory_grep", "arguments": '{"pattern": "PLATYPUS"}'}}
    searches = [{"id": "s1", "role": "assistant", "content": None, "tool_calls": [call]},
                {"id": "s2", "role": "tool", "tool_call_id": "call_9", "content": "1. PLATYPUS-7 in a-old"},
                {"id": "s3", "role": "assistant", "content": "So PLATYPUS-7 it is."}]
    async with running_sidecar(settings=settings_for(tmp_path / "m.duckdb")) as client:
        await ingest(client, "a-new", searches)
        text = await tool(client, "memory_grep", {"pattern": "platypus"}, workspace=str(tmp_path / "ws-a"))
    assert "message s3 " in text and "message s1 " not in text and "message s2 " not in text
    assert "4 matches in 2 of the 2 sessions" in text


async def test_query_excerpts_name_their_sessions(tmp_path: Path, stored: dict[str, list[str]]) -> None:
    async with running_sidecar(settings=settings_for(tmp_path / "m.duckdb")) as client:
        text = await tool(client, "memory_query", {"question": "What about PLATYPUS?"},
                          workspace=str(tmp_path / "ws-a"))
    assert "No summarizer model is configured" in text
    assert NEW_FACT in text and "session a-new (current;" in text and "session a-old (earlier;" in text
    assert OTHER_FACT not in text


async def test_a_workspace_with_no_sessions_is_an_answer_not_an_error(tmp_path: Path,
                                                                     stored: dict[str, list[str]]) -> None:
    empty = tmp_path / "ws-empty"
    empty.mkdir()
    async with running_sidecar(settings=settings_for(tmp_path / "m.duckdb")) as client:
        grep = await tool(client, "memory_grep", {"pattern": "x"}, workspace=str(empty))
        query = await tool(client, "memory_query", {"question": "anything stored?"}, workspace=str(empty))
        expand = await tool(client, "memory_expand", {"id": "sum_x"}, workspace=str(empty))
    assert grep == f"memory_grep: no session of this workspace ({empty}) is stored yet, so there is nothing to search."
    assert query.startswith("memory_query: no session of this workspace")
    assert expand == "Error: there is no 'sum_x': no session of this workspace is stored yet."


async def test_the_same_argument_checks_as_for_one_session(tmp_path: Path, stored: dict[str, list[str]]) -> None:
    ws_a = str(tmp_path / "ws-a")
    async with running_sidecar(settings=settings_for(tmp_path / "m.duckdb")) as client:
        for arguments in ({"pattern": ""}, {"pattern": "x", "limit": 0}, {"pattern": "(", "regex": True},
                          {"pattern": "x", "colour": "red"}, {}):
            scoped = await tool(client, "memory_grep", arguments, workspace=ws_a)
            one = await tool(client, "memory_grep", arguments, sessionId="a-old")
            assert scoped.startswith("Error:") and scoped == one, arguments


@pytest.mark.parametrize(("params", "field"), [
    ({"workspace": ""}, "workspace"),
    ({"workspace": "/x" * 3000}, "workspace"),
    ({"workspace": 7}, "workspace"),
    ({"workspace": "/tmp", "sessionId": ""}, "sessionId"),
    ({}, "sessionId"),
])
async def test_bad_workspace_params_are_invalid_params(tmp_path: Path, params: dict[str, Any], field: str) -> None:
    async with running_sidecar(settings=settings_for(tmp_path / "m.duckdb")) as client:
        with pytest.raises(JsonRpcException) as raised:
            await call(client, methods.MEMORY_CALL_TOOL, {"name": "memory_grep", "arguments": "{}", **params})
    assert raised.value.code == -32602
    assert field in str(raised.value.data) or field in str(raised.value)
