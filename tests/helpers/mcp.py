"""A small MCP client for the tests: ``context-sidecar mcp`` as a subprocess, newline-delimited JSON-RPC on stdio."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

WAIT = 60.0
"""Seconds to wait for any one answer (a cold host opens DuckDB on a busy machine)."""
MCP = [sys.executable, "-P", "-m", "sidecar", "mcp"]
"""As the ``context-sidecar`` script starts it: the working directory (the agent's workspace) is not on sys.path."""


class McpClient:
    """Reads every line the server writes (each must be JSON), answers its roots/list, matches replies to requests."""

    def __init__(self, process: asyncio.subprocess.Process, roots: list[str] | None) -> None:
        self.process = process
        self.roots = roots
        """Directories this client gives as its roots (None: it declares no roots capability)."""
        self.answer_roots: Callable[[Any], dict[str, Any] | None] | None = None
        """Replaces the roots/list answer (given the request id), e.g. with an error; returning None answers nothing."""
        self.received: list[dict[str, Any] | list[Any]] = []
        """Every message the server sent, in order."""
        self.server_requests: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self._replies: dict[Any, asyncio.Future[Any]] = {}
        self._arrived = asyncio.Event()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            message = json.loads(line)  # anything but JSON on stdout fails the test here
            self.received.append(message)
            self._arrived.set()
            self._arrived = asyncio.Event()
            if isinstance(message, dict) and "method" in message and "id" in message:
                self.server_requests.append(message)
                self._answer(message)
            elif isinstance(message, dict) and "id" in message:
                future = self._replies.pop(json.dumps(message["id"]), None)
                if future is not None and not future.done():
                    future.set_result(message)

    def _answer(self, request: dict[str, Any]) -> None:
        if request["method"] == "roots/list":
            if self.answer_roots is not None:
                reply = self.answer_roots(request["id"])
            else:
                reply = self.roots_reply(request["id"])
        else:
            reply = {"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32601, "message": "not here"}}
        if reply is not None:
            self.write(reply)

    def roots_reply(self, msg_id: Any) -> dict[str, Any]:
        """The answer to roots/list: this client's roots."""
        return {"jsonrpc": "2.0", "id": msg_id,
                "result": {"roots": [{"uri": Path(r).as_uri(), "name": Path(r).name} for r in self.roots or ()]}}

    def write(self, message: Any) -> None:
        """One message (or raw bytes, sent as they are) on stdin."""
        assert self.process.stdin is not None
        data = message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n"
        self.process.stdin.write(data)

    async def send(self, method: str, params: Any = None, msg_id: Any = None) -> dict[str, Any]:
        """A request; returns the whole reply (``result`` or ``error``)."""
        msg_id = next(self._ids) if msg_id is None else msg_id
        future = self.expect(msg_id)
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            message["params"] = params
        self.write(message)
        return await asyncio.wait_for(future, WAIT)

    def expect(self, msg_id: Any) -> asyncio.Future[Any]:
        """A future for the reply with this id (armed before the request is written)."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._replies[json.dumps(msg_id)] = future
        return future

    async def result(self, method: str, params: Any = None) -> Any:
        reply = await self.send(method, params)
        assert "result" in reply, reply
        return reply["result"]

    def notify(self, method: str, params: Any = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self.write(message)

    async def initialize(self, version: str = "2025-11-25") -> dict[str, Any]:
        """initialize (declaring roots when this client has them), then notifications/initialized."""
        capabilities: dict[str, Any] = {"roots": {"listChanged": True}} if self.roots is not None else {}
        result = await self.result("initialize", {"protocolVersion": version, "capabilities": capabilities,
                                                  "clientInfo": {"name": "test-client", "version": "1"}})
        self.notify("notifications/initialized")
        return result

    async def call(self, name: str, arguments: Any = None, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """tools/call; returns the result (content, isError)."""
        params: dict[str, Any] = {"name": name, "arguments": arguments if arguments is not None else {}}
        if meta:
            params["_meta"] = meta
        return await self.result("tools/call", params)

    async def text(self, name: str, arguments: Any = None, meta: dict[str, Any] | None = None) -> str:
        """tools/call that must succeed; its text."""
        result = await self.call(name, arguments, meta)
        assert result["isError"] is False, result
        return str(result["content"][0]["text"])

    async def next_message(self, predicate: Callable[[Any], bool]) -> Any:
        """The first message received (so far or from now on) that matches."""
        while True:
            for message in self.received:
                if predicate(message):
                    return message
            await asyncio.wait_for(self._arrived.wait(), WAIT)

    async def close(self) -> int:
        """Close stdin (MCP's shutdown) and wait for the exit code."""
        assert self.process.stdin is not None
        with contextlib.suppress(Exception):
            self.process.stdin.close()
        try:
            code = await asyncio.wait_for(self.process.wait(), WAIT)
        finally:
            if self.process.returncode is None:
                self.process.kill()
                await self.process.wait()
            await self._reader
        return code


def mcp_env(runtime: Path, **extra: str) -> dict[str, str]:
    """The environment of a test's MCP server: its own host socket directory, no agent session id."""
    env = {key: value for key, value in os.environ.items() if key != "CLAUDE_CODE_SESSION_ID"}
    return {**env, "XDG_RUNTIME_DIR": str(runtime), **extra}


@contextlib.asynccontextmanager
async def mcp_server(db: Path | str, runtime: Path, cwd: Path, roots: list[str] | None = None,
                     args: list[str] | None = None, env: dict[str, str] | None = None,
                     log: Path | None = None) -> AsyncIterator[McpClient]:
    """``context-sidecar mcp --db DB`` started in ``cwd``, its log in ``log`` (else stderr)."""
    command = [*MCP, "--db", str(db), *(["--log-file", str(log), "-v"] if log else []), *(args or [])]
    process = await asyncio.create_subprocess_exec(
        *command, cwd=cwd, env=env or mcp_env(runtime), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, limit=1 << 24)
    client = McpClient(process, roots)
    try:
        yield client
    finally:
        if process.returncode is None:
            await client.close()
