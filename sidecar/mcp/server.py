"""``context-sidecar mcp``: the MCP stdio subset (newline-delimited JSON-RPC 2.0) offering the memory tools.

Answered: ``initialize`` (versions 2024-11-05 to 2025-11-25), ``ping``, ``tools/list``, ``tools/call``,
``logging/setLevel``; notifications ``initialized``, ``cancelled``, ``roots/list_changed``. The server asks a
client that declares roots for them (``roots/list``): the first ``file://`` root is the workspace, else the
working directory. Unknown methods get -32601, unparseable lines -32700; notifications are never answered.

A session answers what needs no event loop (initialize, tools/list, ping, asking for roots, …) as soon as it exists,
before asyncio and the host link are even imported: an agent in headless mode waits about a second for its MCP
servers. What needs the loop (a tools/call, a batch) waits for ``start``.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from sidecar import __version__
from sidecar.mcp import tools

if TYPE_CHECKING:
    import asyncio

    from sidecar.mcp.host import HostLink

log = logging.getLogger(__name__)

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = -32700, -32600, -32601, -32602, -32603
MAX_LINE = 8 << 20
"""Bytes of one message; a longer line is skipped and answered -32600 (the tools' requests are small)."""
ROOTS_WAIT = 5.0
"""Seconds a tools/call waits for the client's answer to roots/list before it takes the working directory."""
SESSION_ENV = "CLAUDE_CODE_SESSION_ID"
"""Set by Claude Code in its MCP servers' environment: the session that spawned the server."""
ID_MAX_CHARS = 512
LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
"""MCP (syslog) log levels, least severe first."""
INSTRUCTIONS = ("Memory of this workspace's coding-agent sessions, kept by context-sidecar: the current session and "
                "the earlier ones, including everything compacted away. memory_grep finds text (each result names "
                "its session), memory_expand and memory_describe open a summary or message by id, memory_query "
                "answers a question from the history.")


Work = Callable[[], Coroutine[Any, Any, Any]]
"""What makes a request's coroutine, made once the loop runs it (one made before would warn, never awaited)."""


class RequestError(Exception):
    """A request answered with a JSON-RPC error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def error_reply(msg_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}


def valid_id(value: Any) -> bool:
    """MCP request ids are strings or integers (never null)."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def root_paths(result: Any) -> list[str]:
    """The local directories of a roots/list result, in order; roots that are not ``file://`` URIs are skipped."""
    roots = result.get("roots") if isinstance(result, dict) else None
    paths = []
    for root in roots if isinstance(roots, list) else ():
        uri = root.get("uri") if isinstance(root, dict) else None
        if isinstance(uri, str):
            parsed = urlparse(uri)
            if parsed.scheme == "file" and parsed.path:
                paths.append(unquote(parsed.path))
    return paths


def short_id(value: Any) -> str | None:
    """A non-empty string of at most ID_MAX_CHARS, else None."""
    return value if isinstance(value, str) and 0 < len(value) <= ID_MAX_CHARS and value.strip() else None


class RootsRequest:
    """A roots/list sent to the client (the event loop may not run yet): settled once answered, or once a tools/call
    stopped waiting for it."""

    def __init__(self) -> None:
        self.settled = False
        self.waiter: asyncio.Future[None] | None = None
        """What tools/calls await, made on the loop by the first."""

    def settle(self) -> None:
        self.settled = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class McpServer:
    """One MCP session over stdio: lifecycle, dispatch, cancellation, roots."""

    def __init__(self, write: Callable[[bytes], None], cwd: str, env: Mapping[str, str]) -> None:
        self.write, self.cwd = write, cwd
        self.link: HostLink | None = None
        """The host connection, from ``start`` on."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: list[tuple[Work, str | None]] = []
        """Work received before ``start``, with its request's key: started in order once the loop is there."""
        self.workspace_dir: str | None = None
        """The workspace as far as the session knows it (told to the link at ``start``)."""
        self.env_session = short_id(env.get(SESSION_ENV))
        self.version: str | None = None
        self.client_capabilities: dict[str, Any] = {}
        self.client_info: dict[str, Any] = {}
        self.roots: list[str] | None = None
        """The client's root directories once it answered roots/list; None before (or without roots)."""
        self.log_level: str | None = None
        self._roots_request: RootsRequest | None = None
        """The latest roots/list."""
        self._ids = itertools.count(1)  # integer ids: some clients refuse string ids
        self._outgoing: dict[int, Callable[[Any, RequestError | None], None]] = {}
        self._running: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        """Every request under way, batches included (the loop keeps only weak references)."""

    def start(self, loop: asyncio.AbstractEventLoop, link: HostLink) -> None:
        """The event loop and the host link are there: run what waited for them (from the loop's thread)."""
        self._loop, self.link = loop, link
        if self.workspace_dir is not None:
            link.set_workspace(self.workspace_dir)
        waiting, self._waiting = self._waiting, []
        for work, key in waiting:
            self._spawn(work, key)

    # Output

    def send(self, message: dict[str, Any] | list[dict[str, Any]]) -> None:
        """One message on its own line (JSON escapes every newline inside strings)."""
        text = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
        self.write(text.encode("utf-8", "backslashreplace") + b"\n")  # a lone surrogate stays a valid \u escape

    # Input

    def receive(self, line: bytes) -> None:
        """One line from stdin: a message, a batch, or something to answer -32700."""
        if not line.strip():
            return
        try:
            message = json.loads(line)
        except (ValueError, RecursionError) as error:
            self.send(error_reply(None, PARSE_ERROR, f"Parse error: {error}"))
            return
        try:
            if isinstance(message, list):
                if not message:
                    self.send(error_reply(None, INVALID_REQUEST, "Invalid Request: an empty batch"))
                else:
                    self._spawn(lambda: self._batch(message))
                return
            reply = self._handle(message)
            if isinstance(reply, dict):
                self.send(reply)
        except Exception:  # survive anything; the id, if any, still gets an answer
            log.exception("failed to handle a message")
            msg_id = message.get("id") if isinstance(message, dict) else None
            if "method" in (message if isinstance(message, dict) else {}) and valid_id(msg_id):
                self.send(error_reply(msg_id, INTERNAL_ERROR, "Internal error (see the server's log)"))

    def oversized(self) -> None:
        """A line longer than MAX_LINE was skipped."""
        self.send(error_reply(None, INVALID_REQUEST, f"Invalid Request: a message longer than {MAX_LINE} bytes"))

    def _handle(self, message: Any, batch: bool = False) -> dict[str, Any] | Coroutine[Any, Any, Any] | None:
        """A reply now, a coroutine that makes one (a tools/call in a batch), or None (notifications, responses)."""
        if not isinstance(message, dict):
            return error_reply(None, INVALID_REQUEST, "Invalid Request: a message must be a JSON object")
        msg_id = message.get("id")
        if "method" not in message:
            if "id" in message and ("result" in message or "error" in message):
                self._response(message)
                return None
            return error_reply(msg_id if valid_id(msg_id) else None, INVALID_REQUEST,
                               "Invalid Request: neither a method nor a result")
        method, params = message["method"], message.get("params")
        if "id" not in message:  # a notification: never answered, whatever is wrong with it
            if isinstance(method, str) and (params is None or isinstance(params, dict)):
                self._notification(method, params or {})
            return None
        if not valid_id(msg_id):
            return error_reply(None, INVALID_REQUEST, "Invalid Request: id must be a string or an integer")
        if message.get("jsonrpc") != "2.0":
            return error_reply(msg_id, INVALID_REQUEST, 'Invalid Request: jsonrpc must be "2.0"')
        if not isinstance(method, str):
            return error_reply(msg_id, INVALID_REQUEST, "Invalid Request: method must be a string")
        if params is not None and not isinstance(params, dict):
            return error_reply(msg_id, INVALID_PARAMS, "Invalid params: params must be an object")
        params = params or {}
        if method == "tools/call":
            if batch:
                return self._answer(msg_id, self._call(params), send=False)
            self._spawn(lambda: self._answer(msg_id, self._call(params)), key=json.dumps(msg_id))
            return None
        handler = self._handlers().get(method)
        if handler is None:
            return error_reply(msg_id, METHOD_NOT_FOUND, f"Method not found: {method}")
        try:
            return {"jsonrpc": "2.0", "id": msg_id, "result": handler(params)}
        except RequestError as error:
            return error_reply(msg_id, error.code, error.message)

    def _handlers(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        return {"initialize": self._initialize, "ping": lambda params: {}, "tools/list": self._tools,
                "logging/setLevel": self._set_level}

    async def _batch(self, messages: list[Any]) -> None:
        """A JSON-RPC batch (MCP 2025-03-26): every request answered, in one array."""
        replies = []
        for message in messages:
            reply = self._handle(message, batch=True)
            if isinstance(reply, Coroutine):
                reply = await reply
            if isinstance(reply, dict):
                replies.append(reply)
        if replies:
            self.send(replies)

    def _spawn(self, work: Work, key: str | None = None) -> None:
        """Run ``work`` as a task held until done (under ``key``, a request's, to cancel it); before ``start``, then."""
        if self._loop is None:
            self._waiting.append((work, key))
            return
        task = self._loop.create_task(work())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if key is not None:
            self._running[key] = task
            task.add_done_callback(lambda _: self._running.pop(key, None))

    async def _answer(self, msg_id: Any, work: Coroutine[Any, Any, dict[str, Any]],
                      send: bool = True) -> dict[str, Any] | None:
        """Run a request; send (or, in a batch, return) its reply. A cancelled request is not answered."""
        import asyncio  # loaded before start() ran this

        try:
            reply = {"jsonrpc": "2.0", "id": msg_id, "result": await work}
        except RequestError as error:
            reply = error_reply(msg_id, error.code, error.message)
        except asyncio.CancelledError:
            log.info("request %s cancelled", msg_id)
            return None
        except Exception:
            log.exception("request %s failed", msg_id)
            reply = error_reply(msg_id, INTERNAL_ERROR, "Internal error (see the server's log)")
        if not send:  # in a batch: the batch sends it
            return reply
        self.send(reply)
        return None

    # Lifecycle

    def _initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        if self.version is not None:
            raise RequestError(INVALID_REQUEST, "initialize was already answered")
        requested = params.get("protocolVersion")
        if not isinstance(requested, str):
            raise RequestError(INVALID_PARAMS, f"params.protocolVersion must be a string, e.g. {tools.LATEST!r}")
        capabilities = params.get("capabilities")
        self.client_capabilities = capabilities if isinstance(capabilities, dict) else {}
        info = params.get("clientInfo")
        self.client_info = info if isinstance(info, dict) else {}
        self.version = tools.negotiate(requested)
        log.info("initialize from %s %s: protocol %s (asked %s), roots %s", self.client_info.get("name", "?"),
                 self.client_info.get("version", "?"), self.version, requested, self._has_roots())
        if not self._has_roots():
            self._set_workspace(self.cwd)
        server_info = {"name": "context-sidecar", "version": __version__}
        if self.version >= "2025-06-18":
            server_info["title"] = "context-sidecar memory"
        return {"protocolVersion": self.version, "capabilities": {"tools": {"listChanged": False}, "logging": {}},
                "serverInfo": server_info, "instructions": INSTRUCTIONS}

    def _has_roots(self) -> bool:
        return isinstance(self.client_capabilities.get("roots"), dict)

    def _notification(self, method: str, params: dict[str, Any]) -> None:
        if method == "notifications/initialized":
            self._ask_roots()
        elif method == "notifications/cancelled":
            key = json.dumps(params.get("requestId"))
            task = self._running.get(key)
            if task is not None:
                log.info("cancelling request %s: %s", key, params.get("reason") or "no reason given")
                task.cancel()
            if any(waiting_key == key for _, waiting_key in self._waiting):
                log.info("cancelling request %s before it started", key)
                self._waiting = [(work, waiting_key) for work, waiting_key in self._waiting if waiting_key != key]
        elif method == "notifications/roots/list_changed":
            self._ask_roots()
        else:
            log.debug("ignored notification %s", method)

    # Roots

    def _ask_roots(self) -> None:
        """roots/list to a client that has roots; its answer sets the workspace."""
        if not self._has_roots():
            return
        msg_id = next(self._ids)
        request = RootsRequest()
        self._roots_request = request
        self._outgoing[msg_id] = lambda result, error: self._roots_answered(request, result, error)
        self.send({"jsonrpc": "2.0", "id": msg_id, "method": "roots/list"})

    def _response(self, message: dict[str, Any]) -> None:
        """A reply to a request of ours, handed to its handler at once (before any other message is read)."""
        msg_id = message.get("id")
        handler = self._outgoing.pop(msg_id, None) if isinstance(msg_id, int) else None
        if handler is None:
            log.info("ignored a response to no request of ours (id %r)", msg_id)
            return
        error = message.get("error")
        if isinstance(error, dict):
            handler(None, RequestError(error.get("code", INTERNAL_ERROR), str(error.get("message", ""))))
        else:
            handler(message.get("result"), None)

    def _roots_answered(self, request: RootsRequest, result: Any, error: RequestError | None) -> None:
        if error is not None:
            log.warning("roots/list failed (%s); the workspace is the working directory %s", error, self.cwd)
            paths: list[str] = []
        else:
            paths = root_paths(result)
            if not paths:
                log.warning("the client has no file:// root; the workspace is the working directory %s", self.cwd)
        if request is self._roots_request:  # not overtaken by a later roots/list
            self.roots = paths
            self._set_workspace(paths[0] if paths else self.cwd)
        request.settle()

    def _set_workspace(self, path: str) -> None:
        self.workspace_dir = path
        if self.link is not None:
            self.link.set_workspace(path)

    async def workspace(self) -> str:
        """The client's first root; the working directory without roots or an answer within ROOTS_WAIT (waited once)."""
        import asyncio  # loaded before start() ran this

        if self.roots is None and self._roots_request is None and self._has_roots():
            self._ask_roots()  # a client that never said initialized
        if self._roots_request is not None and not self._roots_request.settled:
            request = self._roots_request
            if request.waiter is None:
                request.waiter = asyncio.get_running_loop().create_future()
            await asyncio.wait({request.waiter}, timeout=ROOTS_WAIT)
            if not request.settled:  # settled: later calls do not wait again; a late answer still applies
                log.warning("no answer to roots/list within %g s; the workspace is the working directory", ROOTS_WAIT)
                if request is self._roots_request:
                    self.roots = []
                    self._set_workspace(self.cwd)
                request.settle()
        return self.roots[0] if self.roots else self.cwd

    # Tools

    def _tools(self, params: dict[str, Any]) -> dict[str, Any]:
        if params.get("cursor") is not None:
            raise RequestError(INVALID_PARAMS, "Invalid params: unknown cursor (the tools fit on one page)")
        return {"tools": tools.mcp_tools(self.version or tools.LATEST)}

    async def _call(self, params: dict[str, Any]) -> dict[str, Any]:
        name = params.get("name")
        if not isinstance(name, str):
            raise RequestError(INVALID_PARAMS, "Invalid params: name must be a string, one of the tools/list names")
        if name not in tools.NAMES:
            raise RequestError(INVALID_PARAMS, f"Unknown tool: {name}")
        arguments = params.get("arguments")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise RequestError(INVALID_PARAMS, "Invalid params: arguments must be an object")
        meta: dict[str, Any] = params["_meta"] if isinstance(params.get("_meta"), dict) else {}
        workspace = await self.workspace()
        assert self.link is not None, "calls run from start() on"
        outcome = await self.link.call_tool(name, json.dumps(arguments, ensure_ascii=False), workspace,
                                            self.session_of(meta), short_id(meta.get("claudecode/toolUseId"))
                                            or short_id(meta.get("callId")))
        return {"content": [{"type": "text", "text": outcome.text}], "isError": outcome.is_error}

    def session_of(self, meta: dict[str, Any]) -> str | None:
        """The agent's current session: Codex names it in each call's _meta, Claude Code in our environment."""
        turn = meta.get("x-codex-turn-metadata")
        return (short_id(meta.get("sessionId")) or short_id(meta.get("threadId"))
                or short_id(turn.get("session_id") if isinstance(turn, dict) else None) or self.env_session)

    # Logging to the client

    def _set_level(self, params: dict[str, Any]) -> dict[str, Any]:
        level = params.get("level")
        if level not in LEVELS:
            raise RequestError(INVALID_PARAMS, f"Invalid params: level must be one of {', '.join(LEVELS)}")
        self.log_level = level
        return {}

    def forward_log(self, record: logging.LogRecord) -> None:
        """A log record as notifications/message, when the client asked for its level."""
        level = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warning", logging.ERROR: "error",
                 logging.CRITICAL: "critical"}.get(record.levelno, "info")
        if self.log_level is not None and LEVELS.index(level) >= LEVELS.index(self.log_level):
            self.send({"jsonrpc": "2.0", "method": "notifications/message",
                       "params": {"level": level, "logger": record.name, "data": record.getMessage()}})

    async def close(self) -> None:
        """Cancel what runs, and let go of the host."""
        import asyncio  # loaded before start() ran this

        self._waiting.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.link is not None:
            await self.link.close()
