"""initialize answered while the server loads: the same reply the server computes, and nothing lost after it."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from protocol import errors, methods
from sidecar.config.paths import default_storage_path
from sidecar.framing import FrameReader, encode
from tests.conftest import SERVER_COMMAND


def _exchange(args: list[str], messages: list[dict[str, Any]], log: Path, env: dict[str, str] | None = None,
              timeout: float = 30) -> list[dict[str, Any]]:
    """Send every message at once, then read replies until the process exits; returns what it wrote."""
    data = b"".join(_frame(m) for m in messages)
    proc = subprocess.run([*SERVER_COMMAND, *args, "-v", "--log-file", str(log)], input=data,
                          capture_output=True, timeout=timeout, env={**os.environ, **(env or {})})
    reader = FrameReader()
    reader.feed(proc.stdout)
    return [frame.message for frame in reader.frames(stalled=True)]


def _frame(message: dict[str, Any]) -> bytes:
    """A framed message with non-ASCII escaped, as clients that send lone surrogates do."""
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def _session(initialize_params: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": initialize_params},
        {"jsonrpc": "2.0", "method": "initialized", "params": {}},
        {"jsonrpc": "2.0", "id": 2, "method": methods.MEMORY_SESSIONS, "params": {}},
        {"jsonrpc": "2.0", "id": 3, "method": "shutdown"},
        {"jsonrpc": "2.0", "method": "exit"},
    ]


def _replies(messages: list[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    return {m["id"]: m for m in messages if "id" in m and "method" not in m}


@pytest.mark.parametrize("params", [
    {"capabilities": {}},
    {"processId": os.getpid(), "capabilities": {"general": {"positionEncodings": ["utf-32", "utf-8"]}},
     "clientInfo": {"name": "test"}, "trace": "off", "locale": "en"},
    {"processId": None, "rootUri": "file:///tmp/some%20project", "capabilities": {"workspace": {}},
     "initializationOptions": {"llm": {"model": "m", "baseUrl": "http://127.0.0.1:9/v1"}}},
    {"capabilities": {}, "rootUri": "file:///tmp/a",
     "workspaceFolders": [{"uri": "file:///tmp/b", "name": "b"}],
     "initializationOptions": {"contextWindow": "big"}},
])
def test_the_early_reply_is_the_one_the_server_computes(params, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    log = tmp_path / "server.log"
    replies = _replies(_exchange([], _session(params), log))
    result = replies[1]["result"]
    sidecar = result["capabilities"]["experimental"][methods.EXPERIMENTAL_KEY]
    assert sidecar["methods"] == list(methods.REQUESTS)
    assert sidecar["summarizer"] == ("openai" if "llm" in params.get("initializationOptions", {}) else "deterministic")
    folders = params.get("workspaceFolders")
    root = folders[0]["uri"] if folders else params.get("rootUri")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    expected = default_storage_path(root.removeprefix("file://").replace("%20", " ") if root else None)
    assert sidecar["storage"] == expected
    # The server adopted the early-answered request: it compares its own result and logs any difference.
    text = log.read_text()
    assert "answered early" not in text, text
    assert "initialized with storage" in text
    assert replies[2]["result"] == {"sessions": []}
    assert replies[3]["result"] is None


def test_unusual_initialize_params_are_left_to_the_server(tmp_path):
    log = tmp_path / "server.log"
    messages = _session({"capabilities": {"workspace": 5}})
    replies = _replies(_exchange(["--db", ":memory:"], messages, log))
    assert replies[1]["error"]["code"] == errors.INVALID_PARAMS
    assert replies[2]["error"]["code"] == errors.SERVER_NOT_INITIALIZED


@pytest.mark.parametrize("params", [
    {"capabilities": {}, "rootPath": "/tmp/bad \udc80 path"},
    {"capabilities": {}, "rootUri": "file://[x/y"},
])
def test_initialize_the_early_path_cannot_answer_is_answered_by_the_server(params, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    replies = _replies(_exchange([], _session(params), tmp_path / "server.log"))
    assert set(replies) == {1, 2, 3}  # every request answered, whatever the answer to initialize
    assert "result" in replies[1] or replies[1]["error"]["code"] < 0


def test_an_early_answered_initialize_that_lsp_types_reject_keeps_the_sidecar_capabilities(tmp_path):
    """The server adopts it with what it reads of capabilities, so turning usage notifications off holds."""
    params = {"capabilities": {"textDocument": {"synchronization": 5},
                               "experimental": {methods.EXPERIMENTAL_KEY: {"usageNotifications": False}}}}
    messages = _session(params)
    messages.insert(2, {"jsonrpc": "2.0", "id": 9, "method": methods.MEMORY_INGEST,
                        "params": {"sessionId": "s", "messages": [{"role": "user", "content": "hi"}]}})
    seen = _exchange(["--db", ":memory:"], messages, tmp_path / "server.log")
    replies = _replies(seen)
    assert "capabilities" in replies[1]["result"]
    assert replies[9]["result"]["ids"]
    assert not [m for m in seen if m.get("method") == methods.CONTEXT_DID_CHANGE_USAGE]


def test_an_initialize_split_across_writes_is_read_whole_and_nothing_after_it_is_lost(tmp_path):
    proc = subprocess.Popen([*SERVER_COMMAND, "--db", ":memory:"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        data = b"".join(encode(m) for m in _session({"capabilities": {}})[:3])
        for piece in (data[:30], data[30:90], data[90:]):
            proc.stdin.write(piece)
            proc.stdin.flush()
            time.sleep(0.1)
        reader, seen = FrameReader(), []
        while len(_replies(seen)) < 2:
            reader.feed(os.read(proc.stdout.fileno(), 1 << 16))
            seen += [frame.message for frame in reader.frames()]
        replies = _replies(seen)
        assert replies[1]["result"]["serverInfo"]["name"] == methods.SERVER_NAME
        assert replies[2]["result"] == {"sessions": []}
    finally:
        proc.kill()
        proc.wait()
