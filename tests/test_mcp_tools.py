"""Each memory tool end to end: an MCP client, ``context-sidecar mcp``, the shared host, a real DuckDB file.

The database holds sessions of two workspaces; the MCP server's workspace is its client's first root, else its
working directory, and results never come from the other workspace.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.mcp import mcp_env, mcp_server
from tests.helpers.workspaces import NEW_FACT, OLD_FACT, OTHER_FACT, SHARED_ID, two_workspaces


@pytest.fixture
async def stored(tmp_path: Path) -> dict[str, list[str]]:
    return await two_workspaces(tmp_path / "m.duckdb", tmp_path)


async def test_each_tool_over_the_working_directorys_workspace(tmp_path: Path, runtime: Path,
                                                               store_target: str) -> None:
    """On a file, then on a team database."""
    stored = await two_workspaces(store_target, tmp_path)
    summary = stored["a-old"][0]
    async with mcp_server(store_target, runtime, tmp_path / "ws-a") as mcp:
        await mcp.initialize()
        grep = await mcp.text("memory_grep", {"pattern": "platypus"})
        describe = await mcp.text("memory_describe", {"id": summary})
        expand = await mcp.text("memory_expand", {"id": summary, "tokenCap": 32000})
        query = await mcp.text("memory_query", {"question": "Where is the PLATYPUS handling?"})
    assert "PLATYPUS-7" in grep and "PLATYPUS-8" in grep and OTHER_FACT[:20] not in grep and "PLATYPUS-9" not in grep
    assert 'In session a-new (current; "Fix the parser"; Codex 0.169.0;' in grep  # the latest, with no session named
    assert 'In session a-old (earlier; "Set up the staging database"; Claude Code 2.1.197;' in grep
    assert describe.startswith("From session a-old (earlier;") and f"summary {summary}:" in describe
    assert expand.startswith("From session a-old (earlier;") and OLD_FACT in expand
    assert NEW_FACT in query and "session a-new (current;" in query and "PLATYPUS-9" not in query


async def test_the_agents_session_comes_first_as_claude_code_and_codex_name_it(
        tmp_path: Path, runtime: Path, stored: dict[str, list[str]]) -> None:
    env = mcp_env(runtime, CLAUDE_CODE_SESSION_ID="a-old")  # what Claude Code gives its MCP servers
    async with mcp_server(tmp_path / "m.duckdb", runtime, tmp_path / "ws-a", env=env) as mcp:
        await mcp.initialize()
        claude = await mcp.text("memory_expand", {"id": SHARED_ID}, meta={"claudecode/toolUseId": "toolu_1"})
        codex = await mcp.text("memory_expand", {"id": SHARED_ID}, meta={"sessionId": "a-new", "callId": "call_1"})
        grep = await mcp.text("memory_grep", {"pattern": "platypus"})
    assert "OLD session" in claude and "this is the one in session a-old (the current session)" in claude
    assert "NEW session" in codex and "this is the one in session a-new (the current session)" in codex
    assert grep.index("In session a-old (current;") < grep.index("In session a-new (earlier;")


async def test_the_clients_roots_are_the_workspace_and_without_an_answer_the_working_directory(
        tmp_path: Path, runtime: Path, stored: dict[str, list[str]]) -> None:
    db = tmp_path / "m.duckdb"
    async with mcp_server(db, runtime, tmp_path / "ws-b", roots=[str(tmp_path / "ws-a")]) as rooted:
        await rooted.initialize()
        from_roots = await rooted.text("memory_grep", {"pattern": "platypus"})
    async with mcp_server(db, runtime, tmp_path / "ws-b", roots=[]) as rootless:
        await rootless.initialize()
        empty_roots = await rootless.text("memory_grep", {"pattern": "platypus"})
    async with mcp_server(db, runtime, tmp_path / "ws-b", roots=[str(tmp_path / "ws-a")]) as failing:
        failing.answer_roots = lambda msg_id: {"jsonrpc": "2.0", "id": msg_id,
                                               "error": {"code": -32603, "message": "no roots today"}}
        await failing.initialize()
        refused = await failing.text("memory_grep", {"pattern": "platypus"})
    assert "PLATYPUS-7" in from_roots and "PLATYPUS-9" not in from_roots, from_roots
    for text in (empty_roots, refused):  # the working directory, ws-b
        assert "PLATYPUS-9" in text and "PLATYPUS-7" not in text and "In session b-only (current;" in text


async def test_roots_never_answered_are_waited_for_once_and_a_late_answer_applies(
        tmp_path: Path, runtime: Path, stored: dict[str, list[str]]) -> None:
    log = tmp_path / "mcp.log"
    async with mcp_server(tmp_path / "m.duckdb", runtime, tmp_path / "ws-b", roots=[str(tmp_path / "ws-a")],
                          log=log) as silent:
        silent.answer_roots = lambda msg_id: None
        await silent.initialize()
        first = await silent.text("memory_grep", {"pattern": "platypus"})
        second = await silent.text("memory_grep", {"pattern": "platypus"})
        waited = log.read_text().count("no answer to roots/list within")
        [asked] = silent.server_requests
        silent.write(silent.roots_reply(asked["id"]))
        late = await silent.text("memory_grep", {"pattern": "platypus"})
    assert waited == 1  # the second call did not wait again
    for text in (first, second):  # the working directory, ws-b
        assert "PLATYPUS-9" in text and "PLATYPUS-7" not in text, text
    assert "PLATYPUS-7" in late and "PLATYPUS-9" not in late, late


async def test_the_models_mistakes_are_tool_results_with_is_error(tmp_path: Path, runtime: Path,
                                                                  stored: dict[str, list[str]]) -> None:
    async with mcp_server(tmp_path / "m.duckdb", runtime, tmp_path / "ws-a") as mcp:
        await mcp.initialize()
        results: dict[str, Any] = {}
        for name, arguments in [("memory_grep", {}), ("memory_grep", {"pattern": "(", "regex": True}),
                                ("memory_expand", {"id": "sum_nope"}), ("memory_expand", {"id": "x", "tokenCap": 0}),
                                ("memory_describe", {"id": "b1"}), ("memory_query", {"question": "the?"})]:
            results[f"{name} {arguments}"] = await mcp.call(name, arguments)
        fine = await mcp.call("memory_grep", {"pattern": "PLATYPUS"})
    for key, result in results.items():
        assert result["isError"] is True, key
        assert result["content"][0]["type"] == "text" and result["content"][0]["text"].startswith("Error: "), key
    assert "needs the argument 'pattern'" in results["memory_grep {}"]["content"][0]["text"]
    assert fine["isError"] is False
