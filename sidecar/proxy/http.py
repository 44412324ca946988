"""A small HTTP/1.1 server on asyncio and h11: requests in whole, responses streamed, a client's leaving noticed.

h11 (already installed with httpx) does the protocol; this module does the sockets. Enough for agents on the same
machine: keep-alive, chunked or sized bodies both ways, no TLS, no HTTP/2.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import attrs
import h11

log = logging.getLogger(__name__)

READ_SIZE = 1 << 20
MAX_BODY = 256 * 1024 * 1024
Headers = list[tuple[str, str]] | list[tuple[bytes, bytes]]
"""Response headers: text, or the upstream's bytes as they came (a value need not be ASCII)."""


@attrs.define
class HttpRequest:
    """A request, its body read in full."""

    method: str
    target: str
    headers: list[tuple[str, str]]
    """Names in lower case, in order."""
    body: bytes

    def header(self, name: str) -> str | None:
        """The first value of a header, by its lower-case name."""
        return next((value for key, value in self.headers if key == name), None)

    @property
    def path(self) -> str:
        """The target without its query."""
        return self.target.partition("?")[0]


class ClientGone(ConnectionError):
    """The agent closed its connection before the response was complete."""


class Responder:
    """Writes one response: ``start``, any number of ``send``, ``end``."""

    def __init__(self, connection: h11.Connection, writer: asyncio.StreamWriter, gone: asyncio.Event) -> None:
        self._connection = connection
        self._writer = writer
        self.gone = gone
        """Set when the client closed its side."""
        self.started = False
        self.head = False
        """The request was HEAD: no body goes back."""

    async def start(self, status: int, headers: Headers) -> None:
        """Send the status line and headers."""
        await self._write(h11.Response(status_code=status, headers=headers))
        self.started = True

    async def send(self, data: bytes) -> None:
        """Send part of the body; raises ClientGone when the client left."""
        if data:
            await self._write(h11.Data(data=data))

    async def end(self) -> None:
        """Finish the body."""
        await self._write(h11.EndOfMessage())

    async def whole(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        """A complete response with a Content-Length (and, to a HEAD, without the body)."""
        await self.start(status, [*headers, ("content-length", str(len(body)))])
        if self.head:
            body = b""
        await self.send(body)
        await self.end()

    async def _write(self, event: h11.Event) -> None:
        if self.gone.is_set():
            raise ClientGone("the client closed the connection")
        try:
            data = self._connection.send(event)
            if data:
                self._writer.write(data)
                await self._writer.drain()
        except (ConnectionError, h11.LocalProtocolError) as error:
            self.gone.set()
            raise ClientGone(str(error)) from error


Handler = Callable[[HttpRequest, Responder], Awaitable[None]]
Failure = Callable[[HttpRequest, str], tuple[list[tuple[str, str]], bytes]]
"""The headers and body of the 502 that answers a request whose handler failed unexpectedly."""


def plain_failure(request: HttpRequest, message: str) -> tuple[list[tuple[str, str]], bytes]:
    """A 502 in plain text."""
    return [("content-type", "text/plain; charset=utf-8")], message.encode()


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler,
                failure: Failure = plain_failure) -> None:
    """Serve one connection until the client closes it; a handler's unexpected error is answered 502 (``failure``)
    when nothing of the response went yet, else the connection is dropped (all that tells the client then)."""
    connection = h11.Connection(h11.SERVER)
    try:
        while True:
            request = await _read_request(connection, reader)
            if request is None:
                break
            gone = asyncio.Event()
            watch = asyncio.ensure_future(_watch(reader, connection, gone))
            responder = Responder(connection, writer, gone)
            responder.head = request.method == "HEAD"
            try:
                await handler(request, responder)
            except ClientGone:
                log.info("%s %s: the client left before the response was complete", request.method, request.target)
            except Exception as error:
                log.exception("%s %s: unexpected error", request.method, request.target)
                if not responder.started:
                    headers, body = failure(request, f"context-sidecar proxy: unexpected error ({type(error).__name__}"
                                                     f": {error}); see the proxy's log")
                    with contextlib.suppress(ClientGone):
                        await responder.whole(502, headers, body)
            finally:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
            if gone.is_set() or connection.our_state is not h11.DONE or connection.their_state is not h11.DONE:
                break
            connection.start_next_cycle()
    except h11.RemoteProtocolError as error:
        with contextlib.suppress(Exception):
            status = error.error_status_hint
            writer.write(connection.send(h11.Response(status_code=status, headers=[("content-length", "0"),
                                                                                   ("connection", "close")])))
            writer.write(connection.send(h11.EndOfMessage()))
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()
            await writer.wait_closed()


async def _read_request(connection: h11.Connection, reader: asyncio.StreamReader) -> HttpRequest | None:
    """The next request with its body, None when the client closed the connection between requests."""
    head: h11.Request | None = None
    body = bytearray()
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            data = await reader.read(READ_SIZE)
            connection.receive_data(data)
            if not data and head is None and connection.their_state is h11.IDLE:
                return None
            continue
        if isinstance(event, h11.ConnectionClosed):
            return None
        if isinstance(event, h11.Request):
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_BODY:
                raise h11.RemoteProtocolError("request body too large", error_status_hint=413)
        elif isinstance(event, h11.EndOfMessage) and head is not None:
            headers = [(name.decode("latin-1").lower(), value.decode("latin-1")) for name, value in head.headers]
            return HttpRequest(head.method.decode("latin-1"), head.target.decode("latin-1"), headers, bytes(body))


async def _watch(reader: asyncio.StreamReader, connection: h11.Connection, gone: asyncio.Event) -> None:
    """While a response is written, notice the client closing its side (whatever it sends is kept for later)."""
    while True:
        data = await reader.read(READ_SIZE)
        if not data:
            gone.set()
            return
        connection.receive_data(data)


async def start_server(handler: Handler, host: str, port: int, failure: Failure = plain_failure) -> asyncio.Server:
    """Listen on host:port (0: any free port)."""
    return await asyncio.start_server(lambda r, w: serve(r, w, handler, failure), host, port, limit=READ_SIZE)
