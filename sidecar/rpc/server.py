"""The JSON-RPC server: pygls underneath, with our own framing, lifecycle rules and strict params."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any, BinaryIO, Generic, TypeVar

import attrs
from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer
from pygls.protocol.json_rpc import JsonRPCNotification, JsonRPCRequestMessage

from protocol import errors as codes
from protocol import methods, types
from sidecar import __version__
from sidecar.config.settings import summarizer_name
from sidecar.framing import Frame, FrameReader, watch_input
from sidecar.rpc.pygls_adapter import SidecarProtocol
from sidecar.rpc.startup import sidecar_capabilities
from sidecar.services.compaction.runner import CompactionRunner, PeerRequestFailed
from sidecar.services.errors import SidecarError
from sidecar.services.state import Sidecar
from sidecar.wire import ParamsError, structure, unstructure

if TYPE_CHECKING:
    from sidecar.rpc.startup import EarlyStart

log = logging.getLogger(__name__)

STALL_SECONDS = 0.5
"""How long a partial body may wait for its remaining bytes before it is judged as sent."""
CHECKPOINT_DELAY = 5.0
"""Seconds without requests before the WAL is checkpointed and DuckDB's page cache trimmed."""
SHUTDOWN_SECONDS = 30.0
"""How long the requests running at ``exit`` after ``shutdown`` (``shutdown`` itself) may take before they are
cancelled: one read can hold both, and shutdown's reply and cleanup come before the process ends."""


def _check_unicode(params: Any) -> None:
    """ParamsError for strings DuckDB cannot store: lone surrogates, legal in JSON but not in UTF-8."""
    try:
        json.dumps(params, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as error:
        raise ParamsError(f"contains invalid Unicode (a lone surrogate at {error.start})") from None
    except (RecursionError, ValueError):
        raise ParamsError("params nested too deeply") from None


def _essential_capabilities(capabilities: Any) -> dict[str, Any]:
    """What the sidecar reads of a client's capabilities: ``experimental`` and ``workspace.configuration``."""
    if not isinstance(capabilities, dict):
        return {}
    kept: dict[str, Any] = {}
    if "experimental" in capabilities:
        kept["experimental"] = capabilities["experimental"]
    workspace = capabilities.get("workspace")
    if isinstance(workspace, dict) and isinstance(workspace.get("configuration"), bool):
        kept["workspace"] = {"configuration": workspace["configuration"]}
    return kept


P = TypeVar("P")


@attrs.frozen
class Method(Generic[P]):
    """A protocol method the server answers: its name, the type its params must fit, and its handler."""

    name: str
    params: type[P]
    handler: Callable[[SidecarServer, P], Awaitable[Any]]
    """Called with the server and the params as ``params``; returns the result (JSON data or RawJSON)."""
    notification: bool = False
    """Sent by the client as a notification, never as a request."""


class _QuietExpectedErrors(logging.Filter):
    """pygls logs a traceback for every error reply; ours are expected outcomes, not crashes."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, SidecarError)


class SidecarServer(LanguageServer):
    """The context-sidecar language server."""

    protocol: SidecarProtocol

    def __init__(self, sidecar: Sidecar) -> None:
        super().__init__(name=methods.SERVER_NAME, version=__version__, protocol_cls=SidecarProtocol,
                         text_document_sync_kind=lsp.TextDocumentSyncKind.None_)
        self.sidecar = sidecar
        self.initialized = False
        self.shutdown_requested = False
        self.touched_sessions: set[str] = set()
        self.following_sessions: set[str] = set()
        """Sessions this connection asked to follow (context/follow); it also follows every one it touched."""
        self.following_workspaces: set[str] = set()
        self.driven: set[str] = set()
        """Sessions this connection stored messages in while it declared ``summaries``: it runs their summary calls
        (in a host, until another such connection stores messages in them)."""
        self.background_tasks: set[asyncio.Task[Any]] = set()
        self.change_listeners: list[Callable[[str, types.Usage], None]] = []
        self.compactions: CompactionRunner | None = None
        self.methods: dict[str, Method[Any]] = {}
        """The protocol's methods this server answers besides LSP's own, by name (see ``serve_methods``)."""
        self._exit_code: int | None = None
        self.ended = False
        """The connection ended (``exit``, or its input closed): nothing is started for it any more."""
        self.hub: Any = None
        """The host serving this connection among others (sidecar.rpc.host.Host), or None in a process of its own."""
        self.peer_cwd: str | None = None
        """The working directory of the relay on the other end, for a host's connection."""
        self.transcripts: Any = None
        """Without a host: the server's own watcher of agent transcripts (``sidecar.rpc.watching``), once asked."""
        self._checkpoint: asyncio.TimerHandle | None = None
        json_rpc_log = logging.getLogger("pygls.protocol.json_rpc")
        if not any(isinstance(f, _QuietExpectedErrors) for f in json_rpc_log.filters):  # a host has many servers
            json_rpc_log.addFilter(_QuietExpectedErrors())

    def capabilities(self) -> dict[str, Any]:
        """``capabilities.experimental.contextSidecar`` of the initialize result."""
        return sidecar_capabilities([m for m in methods.REQUESTS if self.protocol.serves(m)],
                                    summarizer_name(self.sidecar.settings), self.sidecar.storage_path or "")

    def serve_methods(self, table: Iterable[Method[Any]]) -> None:
        """Answer each method of ``table``: its params checked against its type, then its handler called."""
        for method in table:
            self.methods[method.name] = method
            self.feature(method.name)(method.handler)

    # Outgoing

    def reply_error(self, msg_id: Any, code: int, message: str, data: Any = None) -> None:
        """Send an error response (``msg_id`` None for errors about unreadable messages)."""
        error = {"code": code, "message": message}
        if data is not None:
            error["data"] = data
        self.protocol.send_data({"jsonrpc": "2.0", "id": msg_id, "error": error})

    def notify_in_order(self, method: str, params: Any) -> None:
        """Send a notification after the replies and notifications already queued on this loop tick."""
        # pygls sends replies from done-callbacks, a loop tick late; queueing notifications the same way keeps a
        # reply computed before a change from arriving after it, and notifications in the order they were made.
        asyncio.get_running_loop().call_soon(self.protocol.notify, method, params)

    async def ask(self, method: str, params: Any, timeout: float) -> Any:
        """A request to the client; TimeoutError, or PeerRequestFailed when it answers an error."""
        try:
            return await asyncio.wait_for(self.protocol.send_request_async(method, params), timeout)
        except JsonRpcException as error:
            raise PeerRequestFailed(str(error)) from error

    def begin_progress(self, token: Any, title: str, message: str, on_cancel: Callable[[], None]) -> None:
        """Start $/progress on the client's token; ``on_cancel`` runs if the client cancels it."""
        self.work_done_progress.begin(token, lsp.WorkDoneProgressBegin(title=title, message=message, percentage=0,
                                                                       cancellable=True))
        future = self.work_done_progress.tokens.get(token)
        if future is not None:
            future.add_done_callback(lambda f: on_cancel() if f.cancelled() else None)

    def report_progress(self, token: Any, message: str, percentage: int) -> None:
        """Report $/progress."""
        self.work_done_progress.report(token, lsp.WorkDoneProgressReport(message=message, percentage=percentage,
                                                                         cancellable=True))

    def end_progress(self, token: Any, message: str) -> None:
        """End $/progress."""
        self.work_done_progress.end(token, lsp.WorkDoneProgressEnd(message=message))
        future = self.work_done_progress.tokens.pop(token, None)
        if future is not None and not future.done():
            future.set_result(None)

    def run_in_background(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``work`` as a task the server keeps until it ends."""
        task = asyncio.get_running_loop().create_task(work)
        self.background_tasks.add(task)
        task.add_done_callback(self.background_tasks.discard)
        return task

    def push_usage(self, usage: types.Usage) -> None:
        """Send context/didChangeUsage, unless the client turned it off."""
        if self.sidecar.usage_notifications:
            self.notify_in_order(methods.CONTEXT_DID_CHANGE_USAGE, unstructure(usage))

    def push_session_usage(self, usage: types.Usage) -> None:
        """Send a session's usage here and to every other connection of the host following the session."""
        self.push_usage(usage)
        if self.hub is not None:
            for other in self.hub.watchers(self, usage.session_id):
                other.push_usage(usage)

    def session_changed(self, session_id: str, usage: types.Usage) -> None:
        """A session's figures changed: tell the client, and let listeners (auto-compaction) look."""
        self.touched_sessions.add(session_id)
        self.push_session_usage(usage)
        for listener in self.change_listeners:
            listener(session_id, usage)

    def follows(self, session_id: str, workspace: str | None) -> bool:
        """Whether this connection is told about changes of the session (of the workspace)."""
        return session_id in self.touched_sessions or session_id in self.following_sessions or (
            workspace is not None and workspace in self.following_workspaces)

    def drives(self, session_id: str) -> None:
        """This connection stored messages in the session: if it runs summary calls, it runs the session's."""
        if not self.sidecar.client_summaries:
            return
        self.driven.add(session_id)
        if self.hub is not None:
            self.hub.drivers[session_id] = self

    def summary_asker(self, session_id: str) -> Callable[[Any, float], Awaitable[Any]] | None:
        """How to ask the client that drives the session for a summary call (``context/summarize``); None when no
        connected client that declared ``summaries`` drives it."""
        if self.hub is not None:
            driver = self.hub.drivers.get(session_id)
            if driver is None or driver in self.hub.leaving:
                return None
        else:
            driver = self if session_id in self.driven else None
        if driver is None or driver.shutdown_requested:
            return None
        return lambda params, timeout: driver.ask(methods.CONTEXT_SUMMARIZE, params, timeout)

    def notify_session(self, session_id: str, method: str, params: Any) -> None:
        """Send a notification about a session here and to every other connection of the host following it."""
        self.notify_in_order(method, params)
        if self.hub is not None:
            for other in self.hub.watchers(self, session_id):
                other.notify_in_order(method, params)

    def show_message(self, message: str, kind: lsp.MessageType = lsp.MessageType.Warning) -> None:
        """window/showMessage."""
        self.protocol.notify(lsp.WINDOW_SHOW_MESSAGE, lsp.ShowMessageParams(type=kind, message=message))

    def settle_later(self) -> None:
        """Schedule a checkpoint and a trim of DuckDB's page cache for when requests pause."""
        if self._checkpoint is not None:
            self._checkpoint.cancel()
        self._checkpoint = asyncio.get_running_loop().call_later(CHECKPOINT_DELAY, self._idle_checkpoint)

    def _idle_checkpoint(self) -> None:
        store = self.sidecar.open_store
        if store is None or self.sidecar.runtime.compacting():
            return
        # On the loop, not in a thread: DuckDB serialises it with every other statement anyway, and a
        # checkpoint still running in a thread would collide with shutdown closing the connection.
        try:
            store.checkpoint()
        except Exception as error:
            log.warning("idle checkpoint failed, retried after the next write: %s", error)

    # Incoming

    async def serve(self, stdin: BinaryIO, stdout: BinaryIO, early: EarlyStart | None = None) -> int:
        """Read and dispatch messages until ``exit`` or end of input; returns the exit code.

        ``early`` carries what was read (and perhaps answered) before the server existed.
        """
        code = await self.serve_fd(stdin.fileno(), StdoutWriter(stdout), early)
        if self.shutdown_requested:
            await self.finish_requests(SHUTDOWN_SECONDS)
        self.sidecar.close()
        return code

    async def finish_requests(self, timeout: float) -> None:
        """Let the client's requests still running end and their replies go out; those left after ``timeout``
        seconds are cancelled."""
        running = self.protocol.handling()
        if running:
            _, late = await asyncio.wait(running, timeout=timeout)
            for future in late:
                future.cancel()
            if late:
                log.warning("cancelled %d requests of a client that is gone after %.0f s", len(late), timeout)
                await asyncio.wait(late)
        for _ in range(2):
            await asyncio.sleep(0)  # replies go out from the futures' done-callbacks

    async def serve_fd(self, fd: int, writer: Any, early: EarlyStart | None = None) -> int:
        """``serve`` on a readable descriptor (stdin, or a host's connection) and a pygls writer."""
        self.protocol.set_writer(writer)
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[bytes] = asyncio.Queue()
        watching = watch_input(fd, loop, chunks)
        reader = FrameReader() if early is None else early.reader
        if early is not None:
            if early.answered is not None:
                self.protocol.answered_early[early.frames[0].message["id"]] = early.answered
            for frame in early.frames:
                self._frame(reader, frame)
        while self._exit_code is None:
            try:
                data = await asyncio.wait_for(chunks.get(), STALL_SECONDS if reader.buffer else None)
                stalled = False
            except TimeoutError:
                data, stalled = None, True
            if data == b"":
                log.info("input closed")
                break
            if data:
                reader.feed(data)
            for frame in reader.frames(stalled=stalled):
                self._frame(reader, frame)
                if self._exit_code is not None:
                    break
            await asyncio.sleep(0)
        if watching:
            loop.remove_reader(fd)
        self.ended = True
        return self._exit_code if self._exit_code is not None else (0 if self.shutdown_requested else 1)

    def _frame(self, reader: FrameReader, frame: Frame) -> None:
        """Answer an unreadable frame, or dispatch its message."""
        if self._exit_code is not None:
            return
        if reader.discarded:
            log.warning("skipped %d bytes that were not a message header", reader.discarded)
            reader.discarded = 0
        if frame.too_deep_id is not None:
            self.reply_error(frame.too_deep_id, codes.INVALID_PARAMS, "invalid params: nested too deeply")
            return
        if frame.error is not None:
            log.warning("unreadable message: %s", frame.error)
            self.reply_error(None, codes.PARSE_ERROR, f"Parse error: {frame.error}")
            return
        try:
            self.dispatch(frame.message)
        except Exception:
            log.exception("failed to dispatch a message")

    def dispatch(self, message: Any) -> None:
        """Check one JSON-RPC message against the protocol's rules and hand it to its handler."""
        if not isinstance(message, dict):
            self.reply_error(None, codes.INVALID_REQUEST, "a message must be a JSON object (batches are not supported)")
            return
        has_id = "id" in message
        msg_id = message.get("id")
        if has_id and (isinstance(msg_id, bool) or not isinstance(msg_id, (str, int, type(None)))):
            self.reply_error(None, codes.INVALID_REQUEST, "id must be a string or an integer")
            return
        if message.get("jsonrpc") != "2.0":
            if has_id:
                self.reply_error(msg_id, codes.INVALID_REQUEST, 'jsonrpc must be "2.0"')
            return
        method = message.get("method")
        if method is None:
            if has_id and ("result" in message or "error" in message):
                self._response(msg_id, message)
            elif has_id:
                self.reply_error(msg_id, codes.INVALID_REQUEST, "a request needs a method")
            return
        if not isinstance(method, str):
            if has_id:
                self.reply_error(msg_id, codes.INVALID_REQUEST, "method must be a string")
            return
        self._method(method, msg_id if has_id else None, has_id, message.get("params"))

    def _method(self, method: str, msg_id: Any, is_request: bool, params: Any) -> None:
        if method == lsp.EXIT:
            self._exit_code = 0 if self.shutdown_requested else 1
            return
        if self.shutdown_requested:
            if is_request:
                self.reply_error(msg_id, codes.INVALID_REQUEST, "the server is shutting down")
            return
        if not self.initialized and method != lsp.INITIALIZE:
            if is_request:
                self.reply_error(msg_id, codes.SERVER_NOT_INITIALIZED, "the server is not initialized yet")
            return
        if method == lsp.INITIALIZE and self.initialized:
            self.reply_error(msg_id, codes.INVALID_REQUEST, "initialize was already received")
            return
        if method in self.methods:
            self._custom(self.methods[method], msg_id, is_request, params)
            return
        envelope: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if is_request:
            envelope["id"] = msg_id
        if params is not None:
            envelope["params"] = params
        try:
            structured = self.protocol.structure_message(envelope)
        except Exception as error:
            if is_request and msg_id in self.protocol.answered_early and isinstance(params, dict):
                # Already answered: initialize on the settings, workspace and sidecar capabilities it was built from.
                log.error("initialize was answered early but its params do not fit LSP's types: %s", error)
                keep = ("initializationOptions", "rootUri", "rootPath", "workspaceFolders")
                envelope["params"] = {"capabilities": _essential_capabilities(params.get("capabilities")),
                                      **{key: params[key] for key in keep if key in params}}
                self.protocol.handle_message(self.protocol.structure_message(envelope))
            elif is_request:
                self.reply_error(msg_id, codes.INVALID_PARAMS, f"invalid params for {method}: {error}")
            else:
                log.warning("ignoring %s with invalid params: %s", method, error)
            return
        if method == lsp.SHUTDOWN:
            self.shutdown_requested = True
        self.protocol.handle_message(structured)

    def _custom(self, method: Method[Any], msg_id: Any, is_request: bool, params: Any) -> None:
        name = method.name
        if is_request == method.notification:
            if is_request:
                self.reply_error(msg_id, codes.INVALID_REQUEST, f"{name} is a notification, not a request")
            else:
                log.warning("%s is a request; sent as a notification it is ignored", name)
            return
        try:
            # Ingest checks its messages as it serialises them (memory.ingest); the rest of its params here.
            _check_unicode({k: v for k, v in params.items() if k != "messages"}
                           if name == methods.MEMORY_INGEST and isinstance(params, dict) else params)
            value = structure(params, method.params)
        except ParamsError as error:
            field = error.field
            text = f"invalid params: {field + ' ' if field else ''}{error}"
            if is_request:
                self.reply_error(msg_id, codes.INVALID_PARAMS, text, {"field": field} if field else None)
            else:
                log.warning("ignoring %s: %s", name, text)
            return
        if is_request:
            self.protocol.handle_message(JsonRPCRequestMessage(id=msg_id, method=name, jsonrpc="2.0", params=value))
        else:
            self.protocol.handle_message(JsonRPCNotification(method=name, jsonrpc="2.0", params=value))

    def _response(self, msg_id: Any, message: dict[str, Any]) -> None:
        error = message.get("error")
        if isinstance(error, dict):
            self.protocol.handle_response(
                msg_id, None, lsp.ResponseError(code=error.get("code", codes.INTERNAL_ERROR),
                                                message=str(error.get("message", "")), data=error.get("data")))
        else:
            self.protocol.handle_response(msg_id, message.get("result"))
