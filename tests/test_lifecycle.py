"""Lifecycle, settings and the initialize contract, through the real server over stdio."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException

from protocol import errors, methods
from sidecar import __version__
from sidecar.config.settings import MIN_MEMORY_LIMIT, read_settings
from tests.conftest import SERVER_COMMAND, call, ingest, running_sidecar, settings_for

WAIT = 60.0
"""Seconds a server process may take to start, answer and exit: a start imports pygls, 2 s of CPU on a busy machine."""


async def test_initialize_result_shape(db_path):
    async with running_sidecar(initialize=False) as client:
        result = await client.initialize_session(lsp.InitializeParams(
            capabilities=lsp.ClientCapabilities(), initialization_options=settings_for(db_path)))
        assert result.server_info.name == "context-sidecar"
        assert result.server_info.version == __version__
        caps = result.capabilities.experimental[methods.EXPERIMENTAL_KEY]
        assert caps["protocolVersion"] == 1
        assert set(caps["methods"]) >= {methods.MEMORY_INGEST, methods.CONTEXT_ASSEMBLE, methods.MEMORY_EXPAND,
                                        methods.MEMORY_GREP, methods.MEMORY_DESCRIBE, methods.MEMORY_SESSIONS,
                                        methods.MEMORY_DELETE_SESSION, methods.CONTEXT_USAGE}
        assert caps["compactionModes"] == ["incremental", "full", "handoff"]
        assert caps["summarizer"] == "deterministic"
        assert caps["storage"] == str(db_path)
        await client.shutdown_session()


async def test_request_before_initialize_is_rejected(db_path):
    async with running_sidecar(initialize=False) as client:
        client.capabilities = lsp.ClientCapabilities()  # lets pytest-lsp send before initialize
        with pytest.raises(JsonRpcException) as caught:
            await call(client, methods.MEMORY_SESSIONS, {})
        assert caught.value.code == errors.SERVER_NOT_INITIALIZED
        await client.initialize_session(lsp.InitializeParams(
            capabilities=lsp.ClientCapabilities(), initialization_options=settings_for(db_path)))
        assert await call(client, methods.MEMORY_SESSIONS, {}) == {"sessions": []}
        await client.shutdown_session()


async def test_request_after_shutdown_is_rejected(db_path):
    async with running_sidecar(settings=settings_for(db_path), initialize=True) as client:
        await client.protocol.send_request_async(lsp.SHUTDOWN, None)
        with pytest.raises(JsonRpcException) as caught:
            await call(client, methods.MEMORY_SESSIONS, {})
        assert caught.value.code == errors.INVALID_REQUEST
        client.protocol.notify(lsp.EXIT, None)
        await asyncio.wait_for(client._server.wait(), 10)
        assert client._server.returncode == 0


def _exchange(payload: bytes, db: str = ":memory:") -> tuple[int, bytes]:
    proc = subprocess.run([*SERVER_COMMAND, "--db", db], input=payload, capture_output=True, timeout=WAIT)
    return proc.returncode, proc.stdout


def _frame(body: str) -> bytes:
    data = body.encode()
    return b"Content-Length: %d\r\n\r\n%s" % (len(data), data)


def test_exit_code_is_0_after_shutdown_and_1_without():
    init = _frame('{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"capabilities":{}}}')
    shutdown = _frame('{"jsonrpc":"2.0","id":2,"method":"shutdown"}')
    exit_ = _frame('{"jsonrpc":"2.0","method":"exit"}')
    code, out = _exchange(init + shutdown + exit_)
    assert code == 0 and b'"id":2' in out.replace(b" ", b"")
    code, _ = _exchange(init + exit_)
    assert code == 1


def test_a_client_gone_right_after_initialize_leaves_the_database_unopened(tmp_path):
    """The store opens just after initialize's reply; an exit read with it (a script's burst) ends that plan."""
    init = _frame('{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"capabilities":{}}}')
    shutdown = _frame('{"jsonrpc":"2.0","id":2,"method":"shutdown"}')
    exit_ = _frame('{"jsonrpc":"2.0","method":"exit"}')
    db = tmp_path / "never.duckdb"
    assert _exchange(init + exit_, str(db))[0] == 1
    assert _exchange(init + shutdown + exit_, str(db))[0] == 0
    assert not db.exists()


def test_version_flag_and_help():
    out = subprocess.run([*SERVER_COMMAND, "--version"], capture_output=True, text=True, timeout=WAIT)
    assert out.stdout.strip() == f"context-sidecar {__version__}"
    helped = subprocess.run([*SERVER_COMMAND, "--help"], capture_output=True, text=True, timeout=WAIT)
    for flag in ("--db", "--log-file", "--stdio", "--clientProcessId", "demo"):
        assert flag in helped.stdout


def test_vscode_flags_are_accepted_and_logs_stay_off_stdout(tmp_path):
    log_file = tmp_path / "sidecar.log"
    init = _frame('{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"capabilities":{}}}')
    proc = subprocess.run(
        [*SERVER_COMMAND, "--stdio", "--clientProcessId=1", "--db", ":memory:", "-vv", "--log-file", str(log_file)],
        input=init + _frame('{"jsonrpc":"2.0","id":2,"method":"shutdown"}')
        + _frame('{"jsonrpc":"2.0","method":"exit"}'),
        capture_output=True, timeout=WAIT)
    assert proc.returncode == 0
    assert proc.stdout.startswith(b"Content-Length: ")
    assert b"initialized with storage" in log_file.read_bytes()
    assert b"DEBUG" not in proc.stdout


async def _shown(client, *fields: str, timeout: float = 10.0) -> str:
    """The text of window/showMessage so far, once it names every field or the timeout passes."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        shown = " ".join(m.message for m in client.messages)
        if all(field in shown for field in fields) or asyncio.get_running_loop().time() > deadline:
            return shown
        await asyncio.sleep(0.02)


async def test_wrong_typed_settings_are_reported_and_defaulted(db_path):
    settings = settings_for(db_path, contextWindow="big", compaction={"suggestAt": "soon"})
    async with running_sidecar(settings=settings) as client:
        shown = await _shown(client, "contextWindow", "compaction.suggestAt")
        assert "contextWindow" in shown and "compaction.suggestAt" in shown
        result = await ingest(client, "s", [{"role": "user", "content": "hi"}])
        assert result["usage"]["contextWindow"] == 128000


async def test_out_of_range_settings_are_reported_and_defaulted(db_path):
    settings = settings_for(db_path, compaction={"freshTail": -1, "mode": "bogus", "threshold": 3})
    async with running_sidecar(settings=settings) as client:
        shown = await _shown(client, "compaction.freshTail", "compaction.mode", "compaction.threshold")
        for field in ("compaction.freshTail", "compaction.mode", "compaction.threshold"):
            assert field in shown
        await ingest(client, "s", [{"role": "user", "content": str(i)} for i in range(30)])
        assembled = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})  # default freshTail 20 works
        assert len(assembled["items"]) == 30


def test_a_memory_limit_too_small_for_duckdb_is_reported_and_raised():
    settings, problems = read_settings({"storage": {"memoryLimit": "32MB"}})
    assert settings.storage.memory_limit == MIN_MEMORY_LIMIT
    assert any("storage.memoryLimit" in problem and "'32MB'" in problem for problem in problems)
    settings, problems = read_settings({"storage": {"memoryLimit": "1GB"}})
    assert settings.storage.memory_limit == "1GB" and not problems
    settings, problems = read_settings({"storage": {"memoryLimit": ""}})  # no size at all: left to Storage.open
    assert settings.storage.memory_limit == "" and not problems


async def test_did_change_configuration_applies_and_pushes_usage(db_path):
    async with running_sidecar(settings=settings_for(db_path)) as client:
        await ingest(client, "s", [{"role": "user", "content": "x" * 4000}])
        client.usage_events.clear()
        waiter = client.protocol.wait_for_notification_async(methods.CONTEXT_DID_CHANGE_USAGE)
        client.protocol.notify(lsp.WORKSPACE_DID_CHANGE_CONFIGURATION, lsp.DidChangeConfigurationParams(
            settings={"contextSidecar": {"contextWindow": 2000}}))
        await asyncio.wait_for(waiter, 10)
        usage = client.usage_events[-1]
        assert usage["contextWindow"] == 2000
        assert usage["state"] in ("compact", "overflow", "suggest")


async def test_a_settings_change_pushes_every_session_the_most_recently_updated_last(db_path):
    async with running_sidecar(settings=settings_for(db_path)) as client:
        # Updated in the order z, a, m: not the order of their names.
        for session_id in ("z", "a", "m"):
            await ingest(client, session_id, [{"role": "user", "content": f"in {session_id}"}])
            await asyncio.sleep(0.01)
        await ingest(client, "a", [{"role": "user", "content": "a again"}])
        client.usage_events.clear()
        client.protocol.notify(lsp.WORKSPACE_DID_CHANGE_CONFIGURATION, lsp.DidChangeConfigurationParams(
            settings={"contextSidecar": {"contextWindow": 9000}}))
        for _ in range(500):
            if len(client.usage_events) >= 3:
                break
            await asyncio.sleep(0.01)
        assert [u["sessionId"] for u in client.usage_events] == ["z", "m", "a"]
        assert {u["contextWindow"] for u in client.usage_events} == {9000}


async def test_null_settings_make_the_server_pull_configuration(db_path):
    async with running_sidecar(settings=settings_for(db_path)) as client:
        await ingest(client, "s", [{"role": "user", "content": "hello"}])
        client.set_configuration({"contextWindow": 3000, "storage": {"path": str(db_path)}},
                                 section="contextSidecar")
        waiter = client.protocol.wait_for_notification_async(methods.CONTEXT_DID_CHANGE_USAGE)
        client.protocol.notify(lsp.WORKSPACE_DID_CHANGE_CONFIGURATION,
                               lsp.DidChangeConfigurationParams(settings=None))
        await asyncio.wait_for(waiter, 10)
        assert client.usage_events[-1]["contextWindow"] == 3000


async def test_usage_notifications_can_be_turned_off(db_path):
    async with running_sidecar(settings=settings_for(db_path), capabilities={"usageNotifications": False}) as c:
        await ingest(c, "s", [{"role": "user", "content": "hello"}])
        await call(c, methods.CONTEXT_USAGE, {"sessionId": "s"})
        assert c.usage_events == []


async def test_set_trace_is_accepted(sidecar):
    sidecar.protocol.notify(lsp.SET_TRACE, lsp.SetTraceParams(value=lsp.TraceValue.Verbose))
    assert (await call(sidecar, methods.MEMORY_SESSIONS, {}))["sessions"] == []


def test_python_dash_m_and_console_script_agree():
    module = subprocess.run([sys.executable, "-m", "sidecar", "--version"], capture_output=True, text=True,
                            timeout=WAIT)
    assert module.returncode == 0 and __version__ in module.stdout
