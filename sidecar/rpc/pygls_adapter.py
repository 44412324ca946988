"""Every use of pygls' private members, in one place: pyproject pins pygls to 2.1.x, and
tests/test_pygls_adapter.py fails when the members used here change shape.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException
from pygls.protocol import LanguageServerProtocol, lsp_method

from protocol import errors as codes
from protocol import methods
from sidecar.framing import frame_body
from sidecar.rows import StorageFailure, StorageUnavailable
from sidecar.services.errors import SidecarError
from sidecar.services.state import Sidecar
from sidecar.wire import RawJSON, dumps, utf8

log = logging.getLogger(__name__)


class ServerView(Protocol):
    """What the protocol reads of its server (sidecar.rpc.server.SidecarServer)."""

    sidecar: Sidecar
    initialized: bool

    def capabilities(self) -> dict[str, Any]: ...


def _error_reply(error: BaseException) -> lsp.ResponseError:
    """How an unexpected exception in a handler is answered: storage failures as -32021, the rest -32603."""
    if isinstance(error, StorageFailure) or type(error).__module__.startswith(("duckdb", "_duckdb")):
        return lsp.ResponseError(code=codes.STORAGE_ERROR, message=f"storage error: {error}")
    return lsp.ResponseError(code=codes.INTERNAL_ERROR, message=f"internal error: {type(error).__name__}: {error}")


class SidecarProtocol(LanguageServerProtocol):
    """LSP protocol with integer ids for server-to-client requests (Vim refuses string ids)."""

    _server: ServerView  # type: ignore[assignment]

    def __init__(self, server: Any, converter: Any) -> None:
        super().__init__(server, converter)
        self._next_id = 1
        self.answered_early: dict[Any, Any] = {}
        """Requests answered before the server existed (initialize), by id: the result that was sent."""

    def send_request(self, method: str, params: Any | None = None, callback: Any = None,
                     msg_id: Any = None) -> Any:
        if msg_id is None:
            msg_id, self._next_id = self._next_id, self._next_id + 1
        return super().send_request(method, params, callback, msg_id)

    def _send_handler_result(self, future: Any, *, msg_id: Any) -> None:
        error = None if future.cancelled() else future.exception()
        if error is not None:
            self._server.sidecar.noticed(error)
        if msg_id in self.answered_early:
            self._request_futures.pop(msg_id, None)
            sent = self.answered_early.pop(msg_id)
            result = None if error or future.cancelled() else self._converter.unstructure(future.result())
            if result != sent:
                log.error("initialize was answered early with %s, but the server's result is %s", sent,
                          result if error is None else repr(error))
            # The client holds a success reply: serve on, on whatever settings were applied.
            self._server.initialized = True
            return
        if error is None and not future.cancelled() and isinstance(future.result(), (dict, RawJSON)):
            # Our handlers return plain JSON data or text: written directly, without pygls walking it with cattrs.
            self._request_futures.pop(msg_id, None)
            result = future.result()
            body = result if isinstance(result, RawJSON) else utf8(dumps(result))
            self.send_bytes(b"".join((b'{"jsonrpc":"2.0","id":', utf8(dumps(msg_id)), b',"result":', body, b"}")))
            return
        if isinstance(error, SidecarError):
            self._request_futures.pop(msg_id, None)
            self._send_response(msg_id, error=lsp.ResponseError(code=error.code, message=error.message,
                                                                data=error.data))
            return
        if error is None or isinstance(error, JsonRpcException):
            super()._send_handler_result(future, msg_id=msg_id)
            return
        # pygls would answer -32603 with the traceback in data; we map storage errors and keep tracebacks in logs.
        self._request_futures.pop(msg_id, None)
        if isinstance(error, StorageUnavailable):  # said once when the server went away (storage's log)
            log.info("request %s: %s", msg_id, error)
        else:
            log.error("request %s failed", msg_id, exc_info=error)
        self._send_response(msg_id, error=_error_reply(error))

    def send_bytes(self, body: bytes) -> None:
        """Write one message, already UTF-8 JSON, with its header."""
        assert self.writer is not None, "set_writer comes before any message"
        try:
            self.writer.write(frame_body(body))
        except Exception:
            log.exception("failed to send a message")

    @lsp_method(lsp.INITIALIZE)
    def lsp_initialize(self, params: lsp.InitializeParams) -> Any:
        result = yield from super().lsp_initialize(params)
        result.capabilities.text_document_sync = None
        result.capabilities.experimental = {methods.EXPERIMENTAL_KEY: self._server.capabilities()}
        return result

    def serves(self, method: str) -> bool:
        """Whether a handler is registered for ``method``."""
        return method in self.fm.features

    def send_data(self, data: dict[str, Any]) -> None:
        """Send one JSON-RPC message as it is (an error reply pygls would not send itself)."""
        self._send_data(data)

    def handle_response(self, msg_id: Any, result: Any = None, error: lsp.ResponseError | None = None) -> None:
        """Resolve the server's request ``msg_id`` with the client's answer."""
        self._handle_response(msg_id, result, error)

    def handling(self) -> list[asyncio.Future[Any]]:
        """The client's requests still being handled (by coroutine handlers, as all of ours are)."""
        futures: dict[Any, Any] = self._request_futures  # pygls types them all as concurrent futures
        return [future for msg_id, future in futures.items()
                if asyncio.isfuture(future) and not future.done() and msg_id not in self._result_types]

    def abandon_outgoing(self, reason: str) -> int:
        """Answer the server's own requests still waiting on the client with an error; how many there were."""
        waiting = [msg_id for msg_id, future in self._request_futures.items()
                   if not asyncio.isfuture(future) and msg_id in self._result_types]
        for msg_id in waiting:
            self._result_types.pop(msg_id, None)
            self._handle_response(msg_id, None, lsp.ResponseError(code=codes.INTERNAL_ERROR, message=reason))
        return len(waiting)
