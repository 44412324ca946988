"""An asyncio client for context-sidecar, for agents and test harnesses (stdlib plus ``protocol``)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import itertools
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from typing import IO, Any, TypeVar

from protocol import errors as codes
from protocol import methods
from protocol import types as t
from sidecar.framing import Frame, FrameReader, encode
from sidecar.wire import ParamsError, structure, unstructure

log = logging.getLogger(__name__)

T = TypeVar("T")
Callback = Callable[[Any], Awaitable[None] | None]
WillCompactHook = Callable[[t.WillCompactParams], Awaitable[t.WillCompactResult] | t.WillCompactResult]
SummarizeHook = Callable[[t.SummarizeParams], Awaitable[t.SummarizeResult]]
"""Runs a summary call (``context/summarize``) on the client's model; raise SidecarRequestError to refuse it."""

CANCEL_REQUEST = "$/cancelRequest"
PROGRESS = "$/progress"
WORK_DONE_PROGRESS_CREATE = "window/workDoneProgress/create"
WORKSPACE_CONFIGURATION = "workspace/configuration"
DID_CHANGE_CONFIGURATION = "workspace/didChangeConfiguration"
NOTIFICATION_TYPES: dict[str, type] = {
    methods.CONTEXT_DID_CHANGE_USAGE: t.Usage,
    methods.CONTEXT_DID_COMPACT: t.DidCompactParams,
    methods.CONTEXT_DID_PRUNE: t.DidPruneParams,
}
STREAM_LIMIT = 1 << 20
READ_SIZE = 1 << 16


class SidecarRequestError(Exception):
    """A request failed; ``code`` is the JSON-RPC error code (see ``protocol.errors``)."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


class SidecarConnectionLost(SidecarRequestError, ConnectionError):
    """The server went away (exited, crashed, or closed its output) before answering."""

    def __init__(self, message: str = "connection to context-sidecar lost") -> None:
        super().__init__(codes.INTERNAL_ERROR, message)


class SidecarClient:
    """A JSON-RPC connection to one context-sidecar server."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 process: asyncio.subprocess.Process | None = None, settings: dict[str, Any] | None = None,
                 will_compact: WillCompactHook | None = None, summarize: SummarizeHook | None = None) -> None:
        self.settings = settings
        self.will_compact = will_compact
        self.summarize = summarize
        """Declared as ``summaries`` at initialize: the server sends the summary calls of the sessions this client
        stores messages in."""
        self.process = process
        self.initialize_result: dict[str, Any] = {}
        self.returncode: int | None = None
        self.trace: Callable[[str, Any], None] | None = None
        """Called with ("send" | "recv", message) for every message; for debugging and tests."""
        self._reader = reader
        self._frames = FrameReader()
        self._decoded: collections.deque[Frame] = collections.deque()
        self._writer = writer
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._callbacks: dict[str, list[Callback]] = {}
        self._waiters: list[tuple[str, Callable[[Any], bool] | None, asyncio.Future[Any]]] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._kept: dict[str, t.AssembleResult] = {}
        """Per session: the prompt as last assembled by ``assemble_kept``."""
        self._closed: SidecarConnectionLost | None = None
        self._tools: list[dict[str, Any]] | None = None
        self._reader_task = asyncio.get_running_loop().create_task(self._read_loop())

    # Starting and stopping

    @classmethod
    async def spawn(cls, command: list[str] | None = None, db: str | None = None,
                    settings: dict[str, Any] | None = None, env: dict[str, str] | None = None,
                    capabilities: dict[str, Any] | None = None, will_compact: WillCompactHook | None = None,
                    stderr: int | str | os.PathLike[str] | IO[Any] | None = None,
                    timeout: float = 30.0, new_session: bool = False,
                    summarize: SummarizeHook | None = None) -> SidecarClient:
        """Start ``context-sidecar`` (it shares its database through a host) and initialize it; ``stderr``: a path;
        ``new_session``: in a session of its own, out of the terminal's reach (Ctrl-C does not stop it)."""
        argv = list(command or [sys.executable, "-P", "-m", "sidecar"])
        if db is not None:
            argv += ["--db", db]
        log_file = open(stderr, "ab") if isinstance(stderr, (str, os.PathLike)) else None  # noqa: SIM115
        try:
            process = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=log_file or stderr, env=env, limit=STREAM_LIMIT,  # type: ignore[arg-type]
                start_new_session=new_session)
        finally:
            if log_file is not None:
                log_file.close()  # the child holds its own descriptor
        assert process.stdout is not None and process.stdin is not None
        client = cls(process.stdout, process.stdin, process, settings, will_compact, summarize)
        try:
            await asyncio.wait_for(client.initialize(capabilities), timeout)
        except BaseException:
            await client._stop_process(0)
            raise
        return client

    @classmethod
    async def connect(cls, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      settings: dict[str, Any] | None = None, capabilities: dict[str, Any] | None = None,
                      will_compact: WillCompactHook | None = None, initialize: bool = True,
                      summarize: SummarizeHook | None = None) -> SidecarClient:
        """A client over already-open streams; initializes the server unless ``initialize`` is false."""
        client = cls(reader, writer, None, settings, will_compact, summarize)
        if initialize:
            await client.initialize(capabilities)
        return client

    async def initialize(self, capabilities: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send ``initialize`` and ``initialized``; keeps and returns the result."""
        sidecar = dict(capabilities or {})
        if self.will_compact is not None:
            sidecar.setdefault("compactionHooks", True)
        if self.summarize is not None:
            sidecar.setdefault("summaries", True)
        params = {
            "processId": os.getpid(),
            "clientInfo": {"name": "context-sidecar-client"},
            "rootUri": None,
            "capabilities": {
                "workspace": {"configuration": True, "didChangeConfiguration": {}},
                "window": {"workDoneProgress": True},
                "experimental": {methods.EXPERIMENTAL_KEY: sidecar},
            },
            "initializationOptions": self.settings,
        }
        self.initialize_result = await self.request("initialize", params)
        await self.notify("initialized", {})
        return self.initialize_result

    async def close(self, timeout: float = 5.0) -> int | None:
        """``shutdown`` then ``exit``; waits for the process (killing it after ``timeout``)."""
        if self._closed is None:
            with contextlib.suppress(SidecarRequestError, TimeoutError):
                await asyncio.wait_for(self.request("shutdown"), timeout)
            with contextlib.suppress(SidecarRequestError, ConnectionError):
                await self.notify("exit")
        with contextlib.suppress(Exception):
            self._writer.close()
        if self.process is not None:
            await self._stop_process(timeout)
        self._lose("client closed")
        self._reader_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader_task
        return self.returncode

    async def _stop_process(self, timeout: float) -> None:
        assert self.process is not None
        try:
            self.returncode = await asyncio.wait_for(self.process.wait(), timeout)
        except TimeoutError:
            log.warning("context-sidecar (pid %d) did not exit; killing it", self.process.pid)
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            self.returncode = await self.process.wait()

    async def __aenter__(self) -> SidecarClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        """Whether the connection is gone (closed, or the server exited): every request now fails at once."""
        return self._closed is not None

    @property
    def capabilities(self) -> dict[str, Any]:
        """``capabilities.experimental.contextSidecar`` of the initialize result."""
        experimental = self.initialize_result.get("capabilities", {}).get("experimental") or {}
        return experimental.get(methods.EXPERIMENTAL_KEY) or {}

    # Raw messages

    async def request(self, method: str, params: Any = None) -> Any:
        """Send a request and return its result; cancelling the awaiting task sends ``$/cancelRequest``."""
        msg_id, future = self._start(method, params)
        try:
            await self._drain()
            return await future
        except BaseException as error:
            self._stop(msg_id, future, error)
            raise

    async def send(self, method: str, params: Any = None, drain: bool = True) -> asyncio.Future[Any]:
        """Send a request and return the future of its result without waiting for it.

        Requests reach the server in the order they are sent, and it handles ``memory/ingest`` and
        ``context/assemble`` in that order: a client may send an assemble right behind an ingest (one round trip).
        ``drain=False`` does not wait for the server to read what is written (a later send that drains does).
        """
        msg_id, future = self._start(method, params)
        if not drain:
            return future
        try:
            await self._drain()
        except BaseException as error:
            self._stop(msg_id, future, error)
            raise
        return future

    def _start(self, method: str, params: Any) -> tuple[int, asyncio.Future[Any]]:
        """Write a request; its id and the future of its result."""
        if self._closed is not None:
            raise SidecarConnectionLost(self._closed.message)
        msg_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._write({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
        self._pending[msg_id] = future
        future.add_done_callback(lambda _: self._pending.pop(msg_id, None))
        return msg_id, future

    def _stop(self, msg_id: int, future: asyncio.Future[Any], error: BaseException) -> None:
        """A request no longer awaited: cancelled (the server is told), or its connection lost."""
        # Awaiting the future cancels it too; a reply would have set a result instead.
        if isinstance(error, asyncio.CancelledError) and (future.cancelled() or not future.done()) \
                and self._closed is None:
            with contextlib.suppress(Exception):
                self._write({"jsonrpc": "2.0", "method": CANCEL_REQUEST, "params": {"id": msg_id}})
        if future.done() and not future.cancelled():
            future.exception()  # retrieved: what is raised is the caller's error
        future.cancel()

    async def notify(self, method: str, params: Any = None, drain: bool = True) -> None:
        """Send a notification (``drain=False``: without waiting for the server to read it)."""
        if self._closed is not None:
            raise SidecarConnectionLost(self._closed.message)
        self._write({"jsonrpc": "2.0", "method": method, "params": params})
        if drain:
            await self._drain()

    def _write(self, message: dict[str, Any]) -> None:
        if message.get("params", ...) is None:
            del message["params"]
        if self.trace is not None:
            self.trace("send", message)
        self._writer.write(encode(message))

    async def _drain(self) -> None:
        try:
            await self._writer.drain()
        except (ConnectionError, RuntimeError) as error:
            self._lose(f"connection to context-sidecar lost: {error}")
            raise SidecarConnectionLost(f"connection to context-sidecar lost: {error}") from error

    # Typed requests

    async def _call(self, method: str, params: Any, result: type[T]) -> T:
        data = await self.request(method, unstructure(params))
        try:
            return structure(data, result)
        except ParamsError as error:
            raise SidecarRequestError(codes.INTERNAL_ERROR, f"unexpected {method} result: {error}",
                                      {"field": error.field, "result": data}) from None

    async def ingest(self, session_id: str, messages: list[t.Message],
                     session: t.SessionInfo | dict[str, Any] | None = None,
                     after: str | None = None) -> t.IngestResult:
        """memory/ingest: store messages in order, all or none; ``after``: the session's newest message id that
        they follow ("" for none), else error -32012 (*extension*)."""
        info = structure(session, t.SessionInfo) if isinstance(session, dict) else session
        params = t.IngestParams(session_id, messages, info, after)
        return await self._call(methods.MEMORY_INGEST, params, t.IngestResult)

    async def assemble(self, session_id: str, budget: int | None = None, fresh_tail: int | None = None,
                       prune: bool | None = None, reasoning: bool | None = None,
                       tools: bool | None = None, since: str | None = None, overhead_tokens: int | None = None,
                       scale: float | None = None, reply_tokens: int | None = None) -> t.AssembleResult:
        """context/assemble: the messages for the next LLM call (and, with ``tools``, the memory tools; with
        ``since``, perhaps only what to append); without ``budget``, within the budget the sidecar works out from
        the model's window and what the request sends beside them (``overhead_tokens``, ``scale``,
        ``reply_tokens``)."""
        params = t.AssembleParams(session_id, budget, fresh_tail, prune, reasoning=reasoning, tools=tools, since=since,
                                  overhead_tokens=overhead_tokens, scale=scale, reply_tokens=reply_tokens)
        result = await self._call(methods.CONTEXT_ASSEMBLE, params, t.AssembleResult)
        if result.tools is not None:
            self._tools = result.tools
        return result

    async def tools(self, session_id: str) -> list[dict[str, Any]]:
        """The memory tools' definitions for the model; asked once, then kept (they are constant)."""
        if self._tools is None:
            await self.assemble(session_id, budget=0, tools=True)
        return list(self._tools or ())

    async def call_tool(self, session_id: str | None, name: str, arguments: str, tool_call_id: str | None = None,
                        workspace: str | None = None) -> dict[str, Any]:
        """memory/callTool: run a memory tool call of the model; returns the ``tool`` message to append.

        With ``workspace`` the call reads every session of that directory, ``session_id`` (the current one, if
        known) first.
        """
        params = t.CallToolParams(name, arguments, session_id=session_id, tool_call_id=tool_call_id,
                                  workspace=workspace)
        return (await self._call(methods.MEMORY_CALL_TOOL, params, t.CallToolResult)).message

    async def assemble_kept(self, session_id: str, budget: int | None = None, fresh_tail: int | None = None,
                            prune: bool | None = None) -> t.AssembleResult:
        """context/assemble that keeps the previous prompt and asks for a delta: the whole prompt, sent in part.

        The result's ``messages`` and ``items`` are always the whole prompt; ``delta``/``keep`` say what travelled.
        """
        kept = self._kept.get(session_id)
        result = await self.assemble(session_id, budget, fresh_tail, prune, since=kept.revision if kept else None)
        if result.delta and kept is not None:
            keep = result.keep or 0
            result.messages = kept.messages[:keep] + result.messages
            result.items = kept.items[:keep] + result.items
        if result.revision is not None:
            self._kept[session_id] = t.AssembleResult(result.messages, result.items, result.tokens, result.dropped,
                                                      result.over_budget, result.usage,
                                                      revision=result.revision)
        return result

    async def compact(self, session_id: str, mode: t.CompactionMode | None = None, focus: str | None = None,
                      work_done_token: int | str | None = None) -> t.CompactResult:
        """context/compact: summarize older context."""
        params = t.CompactParams(session_id, mode, focus, work_done_token)
        return await self._call(methods.CONTEXT_COMPACT, params, t.CompactResult)

    async def expand(self, session_id: str, id: str, token_cap: int | None = None) -> t.ExpandResult:
        """memory/expand: a summary's sources, or a pruned message's original."""
        params = t.ExpandParams(session_id, id, token_cap)
        return await self._call(methods.MEMORY_EXPAND, params, t.ExpandResult)

    async def grep(self, session_id: str, pattern: str, regex: bool | None = None,
                   case_sensitive: bool | None = None, scope: t.GrepScope | None = None,
                   limit: int | None = None) -> t.GrepResult:
        """memory/grep: search the whole stored history."""
        params = t.GrepParams(session_id, pattern, regex, case_sensitive, scope, limit)
        return await self._call(methods.MEMORY_GREP, params, t.GrepResult)

    async def pin(self, session_id: str, ids: list[str], pinned: bool = True) -> t.PinResult:
        """memory/pin (*extension*): pin or unpin messages by id."""
        return await self._call(methods.MEMORY_PIN, t.PinParams(session_id, ids, pinned), t.PinResult)

    async def describe(self, session_id: str, id: str) -> t.DescribeResult:
        """memory/describe: one message or summary and its place in the DAG."""
        return await self._call(methods.MEMORY_DESCRIBE, t.DescribeParams(session_id, id), t.DescribeResult)

    async def rules(self, session_id: str) -> t.RulesResult:
        """memory/rules (*extension*): the session's standing rules and the files it read and modified."""
        return await self._call(methods.MEMORY_RULES, t.RulesParams(session_id), t.RulesResult)

    async def sessions(self) -> t.SessionsResult:
        """memory/sessions: every stored session."""
        return await self._call(methods.MEMORY_SESSIONS, t.SessionsParams(), t.SessionsResult)

    async def delete_session(self, session_id: str) -> t.DeleteSessionResult:
        """memory/deleteSession: remove every row of a session."""
        return await self._call(methods.MEMORY_DELETE_SESSION, t.DeleteSessionParams(session_id),
                                t.DeleteSessionResult)

    async def usage(self, session_id: str) -> t.Usage:
        """context/usage: how full the session's context is."""
        return await self._call(methods.CONTEXT_USAGE, t.UsageParams(session_id), t.Usage)

    async def import_transcript(self, path: str, session_id: str | None = None,
                                format: str | None = None, follow: bool | None = None) -> t.ImportResult:
        """memory/import: ingest a transcript file that the server can read."""
        params = t.ImportParams(path, session_id, format, follow)
        return await self._call(methods.MEMORY_IMPORT, params, t.ImportResult)

    async def record_compaction(self, session_id: str, summary: str, source: str,
                                trigger: t.CompactionTrigger | None = None,
                                id: str | None = None) -> t.RecordCompactionResult:
        """memory/recordCompaction: store a compaction the agent made itself (its summary) with the session."""
        params = t.RecordCompactionParams(session_id, summary, source, trigger, id)
        return await self._call(methods.MEMORY_RECORD_COMPACTION, params, t.RecordCompactionResult)

    async def watch(self, workspace: str, env: dict[str, str] | None = None, directories: list[str] | None = None,
                    watch: bool = True) -> t.WatchResult:
        """memory/watch: have the host follow the workspace's agent transcripts while this client is connected.

        ``env`` defaults to this process's agent variables (HOME, CLAUDE_CONFIG_DIR, CODEX_HOME, …).
        """
        from sidecar.agents.locations import agent_env

        params = t.WatchParams(workspace, watch, agent_env() if env is None else env, directories)
        return await self._call(methods.MEMORY_WATCH, params, t.WatchResult)

    async def follow(self, session_id: str | None = None, workspace: str | None = None,
                     follow: bool = True) -> t.FollowResult:
        """context/follow: receive a session's (or a workspace's sessions') usage and compactions."""
        params = t.FollowParams(follow, session_id, workspace)
        return await self._call(methods.CONTEXT_FOLLOW, params, t.FollowResult)

    async def report_usage(self, session_id: str, input_tokens: int, output_tokens: int,
                           cache_read_tokens: int | None = None,
                           cache_write_tokens: int | None = None, drain: bool = True) -> None:
        """context/reportUsage: what the provider counted for the last call (a notification)."""
        params = t.ReportUsageParams(session_id, input_tokens, output_tokens, cache_read_tokens,
                                     cache_write_tokens)
        await self.notify(methods.CONTEXT_REPORT_USAGE, unstructure(params), drain=drain)

    async def change_settings(self, settings: dict[str, Any] | None, push: bool = True) -> None:
        """Replace the settings; ``push`` sends them, otherwise the server is told to pull them."""
        self.settings = settings
        section = settings if push else None
        await self.notify(DID_CHANGE_CONFIGURATION, {"settings": {methods.SETTINGS_SECTION: section}})

    # Notifications from the server

    def on_notification(self, method: str, callback: Callback) -> None:
        """Call ``callback(params)`` (raw JSON) for every notification ``method``; may be async."""
        self._callbacks.setdefault(method, []).append(callback)

    def on_usage(self, callback: Callable[[t.Usage], Awaitable[None] | None]) -> None:
        """Call ``callback(Usage)`` on every context/didChangeUsage."""
        self.on_notification(methods.CONTEXT_DID_CHANGE_USAGE,
                             lambda params: callback(structure(params, t.Usage)))

    def on_compact(self, callback: Callable[[t.DidCompactParams], Awaitable[None] | None]) -> None:
        """Call ``callback(DidCompactParams)`` on every context/didCompact."""
        self.on_notification(methods.CONTEXT_DID_COMPACT,
                             lambda params: callback(structure(params, t.DidCompactParams)))

    def on_prune(self, callback: Callable[[t.DidPruneParams], Awaitable[None] | None]) -> None:
        """Call ``callback(DidPruneParams)`` on every context/didPrune (*extension*)."""
        self.on_notification(methods.CONTEXT_DID_PRUNE,
                             lambda params: callback(structure(params, t.DidPruneParams)))

    def on_progress(self, callback: Callback) -> None:
        """Call ``callback({token, value})`` on every ``$/progress``."""
        self.on_notification(PROGRESS, callback)

    def wait_for_notification(self, method: str, predicate: Callable[[Any], bool] | None = None,
                              timeout: float | None = 10.0) -> asyncio.Future[Any]:
        """The next ``method`` notification that matches, armed now; typed for usage and didCompact."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if self._closed is not None:
            future.set_exception(SidecarConnectionLost(self._closed.message))
            return future
        entry = (method, predicate, future)
        self._waiters.append(entry)

        def forget(_: asyncio.Future[Any]) -> None:
            with contextlib.suppress(ValueError):
                self._waiters.remove(entry)

        future.add_done_callback(forget)
        if timeout is None:
            return future
        return asyncio.ensure_future(asyncio.wait_for(future, timeout))

    # Reading

    async def _read_loop(self) -> None:
        try:
            while True:
                message = await self._read_message()
                if message is None:
                    break
                if self.trace is not None:
                    self.trace("recv", message)
                try:
                    self._dispatch(message)
                except Exception:
                    log.exception("failed to handle a message from context-sidecar")
        except (ConnectionError, asyncio.IncompleteReadError) as error:
            log.debug("context-sidecar stream ended: %s", error)
        finally:
            self._lose("context-sidecar closed its output")

    async def _read_message(self) -> Any:
        """The next decoded message; None at end of stream. Junk and bad bodies are logged and skipped."""
        while True:
            while self._decoded:
                decoded = self._decoded.popleft()
                if decoded.error is None:
                    return decoded.message
                log.warning("skipped a message from context-sidecar: %s", decoded.error)
            data = await self._reader.read(READ_SIZE)
            if not data:
                if self._frames.buffer.strip():
                    log.warning("context-sidecar output ended inside a message")
                return None
            self._frames.feed(data)
            self._decoded.extend(self._frames.frames())
            if self._frames.discarded:
                log.warning("skipped %d bytes without a message header", self._frames.discarded)
                self._frames.discarded = 0

    def _dispatch(self, message: Any) -> None:
        if not isinstance(message, dict):
            log.warning("ignored a message that is not an object: %r", message)
            return
        method = message.get("method")
        if method is None:
            future = self._pending.get(message.get("id"))  # type: ignore[arg-type]
            if future is None or future.done():
                return  # the reply to a cancelled request
            error = message.get("error")
            if isinstance(error, dict):
                code = error.get("code", codes.INTERNAL_ERROR)
                text = str(error.get("message", ""))
                future.set_exception(SidecarRequestError(code, text, error.get("data")))
            else:
                future.set_result(message.get("result"))
        elif "id" in message:
            self._spawn(self._answer(message["id"], method, message.get("params")))
        else:
            self._notification(method, message.get("params"))

    def _notification(self, method: str, params: Any) -> None:
        for callback in list(self._callbacks.get(method, ())):
            try:
                outcome = callback(params)
                if inspect.isawaitable(outcome):
                    self._spawn(outcome)
            except Exception:
                log.exception("%s callback failed", method)
        waiters = [w for w in self._waiters if w[0] == method and not w[2].done()]
        if not waiters:
            return
        cls = NOTIFICATION_TYPES.get(method)
        try:
            value = structure(params, cls) if cls else params
        except ParamsError as error:
            log.warning("ignored %s with unexpected params: %s", method, error)
            return
        for _, predicate, future in waiters:
            try:
                if predicate is None or predicate(value):
                    future.set_result(value)
            except Exception as error:
                future.set_exception(error)

    async def _answer(self, msg_id: Any, method: str, params: Any) -> None:
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id}
        try:
            reply["result"] = await self._serve(method, params)
        except SidecarRequestError as error:
            reply["error"] = {"code": error.code, "message": error.message}
        except Exception as error:
            log.exception("answering %s failed", method)
            reply["error"] = {"code": codes.INTERNAL_ERROR, "message": f"{type(error).__name__}: {error}"}
        if self._closed is None:
            self._write(reply)
            with contextlib.suppress(SidecarRequestError):
                await self._drain()

    async def _serve(self, method: str, params: Any) -> Any:
        """The result of a request the server sent us."""
        if method == methods.CONTEXT_WILL_COMPACT:
            if self.will_compact is None:
                return {"action": "proceed"}
            outcome = self.will_compact(structure(params, t.WillCompactParams))
            if inspect.isawaitable(outcome):
                outcome = await outcome
            return unstructure(outcome)
        if method == methods.CONTEXT_SUMMARIZE:
            if self.summarize is None:
                raise SidecarRequestError(codes.METHOD_NOT_FOUND, "this client runs no summary calls")
            return unstructure(await self.summarize(structure(params, t.SummarizeParams)))
        if method == WORK_DONE_PROGRESS_CREATE:
            return None
        if method == WORKSPACE_CONFIGURATION:
            items = (params or {}).get("items") or []
            return [self._section(item.get("section")) for item in items]
        raise SidecarRequestError(codes.METHOD_NOT_FOUND, f"the client does not handle {method}")

    def _section(self, section: str | None) -> Any:
        if not section:
            return {methods.SETTINGS_SECTION: self.settings}
        return self.settings if section == methods.SETTINGS_SECTION else None

    def _spawn(self, awaitable: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(awaitable)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _lose(self, reason: str) -> None:
        """Mark the connection dead; every pending request and waiter fails instead of hanging."""
        if self._closed is not None:
            return
        self._closed = SidecarConnectionLost(reason)
        for future in list(self._pending.values()):
            if not future.done():
                future.set_exception(SidecarConnectionLost(reason))
        for _, _, future in list(self._waiters):
            if not future.done():
                future.set_exception(SidecarConnectionLost(reason))
