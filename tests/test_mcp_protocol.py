"""``context-sidecar mcp`` as a subprocess over stdio: lifecycle, versions, tools/list, and input it must survive."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.mcp.server import MAX_LINE
from sidecar.services.model_tools.definitions import DEFINITIONS
from tests.helpers.mcp import mcp_server

VERSIONS = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"]


@pytest.mark.parametrize("version", VERSIONS)
async def test_initialize_echoes_each_known_version_and_lists_the_definitions(
        tmp_path: Path, runtime: Path, version: str) -> None:
    async with mcp_server(tmp_path / "m.duckdb", runtime, tmp_path) as mcp:
        result = await mcp.initialize(version)
        listed = await mcp.result("tools/list")
    assert result["protocolVersion"] == version
    assert result["serverInfo"]["name"] == "context-sidecar"
    assert result["capabilities"]["tools"] == {"listChanged": False}
    assert [tool["name"] for tool in listed["tools"]] == [d["function"]["name"] for d in DEFINITIONS]
    for tool, definition in zip(listed["tools"], DEFINITIONS, strict=True):
        assert tool["description"] == definition["function"]["description"]
        assert tool["inputSchema"] == definition["function"]["parameters"]
        if version == "2024-11-05":
            assert "annotations" not in tool  # that version has none
        else:
            assert tool["annotations"]["readOnlyHint"] is True  # Codex runs only annotated tools unasked


async def test_an_unknown_version_gets_the_newest_and_bad_initializes_are_errors(tmp_path: Path,
                                                                                 runtime: Path) -> None:
    async with mcp_server(tmp_path / "m.duckdb", runtime, tmp_path) as mcp:
        missing = await mcp.send("initialize", {"capabilities": {}, "clientInfo": {"name": "x", "version": "1"}})
        assert missing["error"]["code"] == -32602 and "protocolVersion" in missing["error"]["message"]
        result = await mcp.initialize("2099-01-01")
        again = await mcp.send("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}})
        assert await mcp.result("ping") == {}
        code = await mcp.close()
    assert result["protocolVersion"] == "2025-11-25"
    assert again["error"]["code"] == -32600
    assert code == 0, "stdin closed is MCP's shutdown: a clean exit"


async def test_malformed_lines_unknown_methods_and_bad_messages_are_answered_and_the_server_serves_on(
        tmp_path: Path, runtime: Path) -> None:
    async with mcp_server(tmp_path / "m.duckdb", runtime, tmp_path) as mcp:
        await mcp.initialize()
        cases: list[tuple[bytes, int]] = [
            (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"\n', -32700),  # cut short
            (b"\xff\xfe not utf-8\n", -32700),
            (b"[" * 100_000 + b"\n", -32700),  # deeper than the parser goes
            (b"[]\n", -32600),
            (b"42\n", -32600),
            (b'{"jsonrpc": "2.0", "id": null, "method": "ping"}\n', -32600),
            (b'{"jsonrpc": "2.0", "id": true, "method": "ping"}\n', -32600),
            (b"x" * (MAX_LINE + 10) + b"\n", -32600),
        ]
        for line, code in cases:
            mcp.write(line)
            reply = await mcp.next_message(lambda m: isinstance(m, dict) and m.get("id") is None and "error" in m)
            mcp.received.remove(reply)
            assert reply["error"]["code"] == code, (line[:60], reply)
        unknown = await mcp.send("resources/list")
        no_version = await mcp.send("ping", msg_id="a")
        mcp.write(b'{"id": 8, "method": "ping"}\n')  # no "jsonrpc"
        mcp.write(b'{"jsonrpc": "2.0", "id": 7}\n')  # neither a request nor a reply
        bad_params = await mcp.send("tools/list", ["not", "an", "object"])
        cursor = await mcp.send("tools/list", {"cursor": "page-2"})
        level = await mcp.send("logging/setLevel", {"level": "loud"})
        assert await mcp.result("logging/setLevel", {"level": "error"}) == {}
        no_jsonrpc = await mcp.next_message(lambda m: isinstance(m, dict) and m.get("id") == 8)
        neither = await mcp.next_message(lambda m: isinstance(m, dict) and m.get("id") == 7)
        assert await mcp.result("ping") == {}
    assert unknown["error"]["code"] == -32601
    assert no_version["result"] == {} and no_version["id"] == "a"
    assert no_jsonrpc["error"]["code"] == -32600 and neither["error"]["code"] == -32600
    assert bad_params["error"]["code"] == -32602
    assert cursor["error"]["code"] == -32602
    assert level["error"]["code"] == -32602


async def test_notifications_are_never_answered(tmp_path: Path, runtime: Path) -> None:
    async with mcp_server(tmp_path / "m.duckdb", runtime, tmp_path) as mcp:
        await mcp.initialize()
        for line in [{"jsonrpc": "2.0", "method": "notifications/whatever"},
                     {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 999}},
                     {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": "nonsense"},
                     {"jsonrpc": "2.0", "method": 17},
                     {"method": "notifications/progress", "params": {"progressToken": 1, "progress": 1}},
                     {"jsonrpc": "2.0", "id": 99, "result": {}},  # a reply to nothing we asked
                     {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}]:  # no roots declared
            mcp.write(line)
        await mcp.result("ping")
        received = list(mcp.received)
    assert [m.get("id") for m in received] == [1, 2], received  # initialize's reply, the ping's: nothing else


async def test_a_batch_is_answered_in_one_array(tmp_path: Path, runtime: Path) -> None:
    async with mcp_server(tmp_path / "m.duckdb", runtime, tmp_path) as mcp:
        await mcp.initialize("2025-03-26")
        mcp.write([{"jsonrpc": "2.0", "id": "p", "method": "ping"},
                   {"jsonrpc": "2.0", "method": "notifications/whatever"},
                   {"jsonrpc": "2.0", "id": "u", "method": "nope"},
                   {"jsonrpc": "2.0", "id": "c", "method": "tools/call", "params": {"name": "memory_nothing"}}])
        batch = await mcp.next_message(lambda m: isinstance(m, list))
    assert {reply["id"]: reply.get("result", reply.get("error", {}).get("code")) for reply in batch} == {
        "p": {}, "u": -32601, "c": -32602}


async def test_roots_are_asked_of_a_client_that_has_them_and_only_then(tmp_path: Path, runtime: Path) -> None:
    async with mcp_server(tmp_path / "m.duckdb", runtime, tmp_path, roots=[str(tmp_path)]) as mcp:
        await mcp.initialize()
        await mcp.result("ping")
        asked = [r["method"] for r in mcp.server_requests]
        mcp.notify("notifications/roots/list_changed")
        await mcp.result("ping")
        asked_again = [r["method"] for r in mcp.server_requests]
    async with mcp_server(tmp_path / "m.duckdb", runtime, tmp_path) as plain:
        await plain.initialize()
        await plain.result("ping")
    assert asked == ["roots/list"]  # after notifications/initialized, before the ping that followed it
    assert asked_again == ["roots/list", "roots/list"]
    assert plain.server_requests == []
    assert all(isinstance(r["id"], int) for r in mcp.server_requests)


async def test_tool_calls_that_are_not_the_models_mistakes_are_protocol_errors(tmp_path: Path,
                                                                              runtime: Path) -> None:
    async with mcp_server(tmp_path / "m.duckdb", runtime, tmp_path) as mcp:
        await mcp.initialize()
        unknown = await mcp.send("tools/call", {"name": "rm_rf", "arguments": {}})
        nameless = await mcp.send("tools/call", {"arguments": {}})
        not_object = await mcp.send("tools/call", {"name": "memory_grep", "arguments": "pattern=x"})
    assert unknown["error"] == {"code": -32602, "message": "Unknown tool: rm_rf"}
    assert nameless["error"]["code"] == -32602
    assert not_object["error"]["code"] == -32602


async def test_stdout_carries_only_protocol_lines_and_logs_go_to_the_log_file(tmp_path: Path,
                                                                              runtime: Path) -> None:
    log = tmp_path / "mcp.log"
    async with mcp_server(tmp_path / "m.duckdb", runtime, tmp_path, log=log) as mcp:
        await mcp.initialize()
        await mcp.text("memory_grep", {"pattern": "anything"})  # attaches to the host, which logs too
        code = await mcp.close()
    assert code == 0
    assert all(isinstance(m, (dict, list)) for m in mcp.received)  # every line parsed as JSON (McpClient checks)
    text = log.read_text()
    assert "initialize from test-client 1" in text and "attached to the host" in text
    assert json.dumps(mcp.received[0])  # and something was answered at all
