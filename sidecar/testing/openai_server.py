"""A real OpenAI-compatible HTTP server for tests, scripted reply by reply; standard library only.

    with FakeOpenAIServer() as server:
        server.script(Reply(status=500), Reply(text="a summary"))
        ...  # point an OpenAI client at server.base_url
        assert server.max_in_flight <= 4
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclasses.dataclass(frozen=True)
class Reply:
    """How the server answers one chat completion request."""

    text: str = "This is a fake summary."
    delay: float = 0.0
    """Seconds to wait before answering."""
    chunk_delay: float = 0.0
    """Streaming only: seconds to wait before each content chunk."""
    chunks: tuple[str, ...] | None = None
    """Streaming only: the content pieces; default splits ``text`` into pieces of a few words."""
    status: int = 200
    """Anything but 200 answers with an OpenAI-style error body."""
    error_message: str = "The server had an error while processing your request."
    empty: bool = False
    """Answer with empty content."""
    malformed: bool = False
    """Answer 200 with a body (or stream event) that is not valid JSON."""
    hang: bool = False
    """Never answer; the connection is dropped when the server stops."""
    headers: tuple[tuple[str, str], ...] = ()
    """Extra response headers, e.g. (("retry-after", "0"),)."""
    finish_reason: str = "stop"
    tool_calls: tuple[tuple[str, str, str], ...] = ()
    """Not streamed: (id, function name, arguments JSON) of tool calls the reply makes; ``text`` may be empty."""
    stream_error: str | None = None
    """Streaming only: after the content, send an error event with this message instead of finishing."""


@dataclasses.dataclass(frozen=True)
class RecordedRequest:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    """Header names in lower case."""
    body: Any
    """The JSON body, or None when there was none or it was not JSON."""
    raw: bytes


Responder = Callable[[RecordedRequest], "Reply | str"]


class FakeOpenAIServer:
    """Serves ``POST /v1/chat/completions`` (JSON or SSE) and ``GET /v1/models`` on 127.0.0.1."""

    def __init__(self, *, models: tuple[str, ...] = ("fake-model",), responder: Responder | None = None,
                 api_key: str | None = None, host: str = "127.0.0.1", port: int = 0,
                 context_window: int | None = None) -> None:
        self.models = models
        self.context_window = context_window
        """When set, a request whose prompt (plus max_tokens) is over it gets OpenAI's 400
        ``context_length_exceeded``, as real servers answer; prompt tokens are UTF-8 bytes / 4."""
        self.rejected: list[int] = []
        """Prompt tokens of every request rejected for the window."""
        self.responder = responder
        """Answers requests when the script is empty; a returned str is the reply text."""
        self.api_key = api_key
        """When set, requests without ``Authorization: Bearer <api_key>`` get 401."""
        self._address = (host, port)
        self._lock = threading.Lock()
        self._script: collections.deque[Reply] = collections.deque()
        self._requests: list[RecordedRequest] = []
        self._in_flight = 0
        self._max_in_flight = 0
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._handlers: set[threading.Thread] = set()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> FakeOpenAIServer:
        """Listen and serve in a background thread."""
        self._stopping.clear()
        self._httpd = _HTTPServer(self._address, _Handler, self)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-openai-server", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """Stop serving: wake delayed and hanging replies, drop open connections, join the threads."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        httpd.server_close()
        with self._lock:
            connections, handlers = list(self._connections), list(self._handlers)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + timeout
        for thread in [*handlers, self._thread]:
            if thread is not None:
                thread.join(max(0.0, deadline - time.monotonic()))

    @property
    def port(self) -> int:
        """The port listened on."""
        if self._httpd is None:
            raise RuntimeError("the server is not running")
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        """What to give an OpenAI client as ``base_url``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *replies: Reply | str) -> None:
        """Queue replies, used in order before the responder; a str is a reply with that text."""
        with self._lock:
            self._script.extend(Reply(text=r) if isinstance(r, str) else r for r in replies)

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        """The chat completion requests received so far."""
        return [r for r in self.requests if r.method == "POST" and r.path.endswith("/chat/completions")]

    @property
    def in_flight(self) -> int:
        """Chat completion requests being answered right now."""
        with self._lock:
            return self._in_flight

    @property
    def max_in_flight(self) -> int:
        """The most chat completion requests ever answered at once."""
        with self._lock:
            return self._max_in_flight

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _next_reply(self, request: RecordedRequest) -> Reply:
        with self._lock:
            if self._script:
                return self._script.popleft()
        reply = self.responder(request) if self.responder else Reply()
        return Reply(text=reply) if isinstance(reply, str) else reply

    def _enter(self) -> None:
        with self._lock:
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _track(self, connection: socket.socket, add: bool) -> None:
        with self._lock:
            if add and self._stopping.is_set():
                connection.shutdown(socket.SHUT_RDWR)
            elif add:
                self._connections.add(connection)
                self._handlers.add(threading.current_thread())
            else:
                self._connections.discard(connection)
                self._handlers.discard(threading.current_thread())


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 fake: FakeOpenAIServer) -> None:
        self.fake = fake
        super().__init__(address, handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Stay quiet: clients that give up mid-reply are part of the tests."""


class _Dropped(Exception):
    """The server is stopping or the client went away: abandon the reply."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.fake._track(self.connection, add=True)

    def finish(self) -> None:
        self.server.fake._track(self.connection, add=False)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing: request lines and headers may carry secrets."""

    def do_GET(self) -> None:
        self._receive()
        if self.path.rstrip("/").endswith("/models"):
            models = self.server.fake.models
            data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in models]
            self._json(200, {"object": "list", "data": data})
        else:
            self._error(404, f"Unknown path {self.path}", "invalid_request_error")

    def do_POST(self) -> None:
        request = self._receive()
        fake = self.server.fake
        if not self.path.rstrip("/").endswith("/chat/completions"):
            return self._error(404, f"Unknown path {self.path}", "invalid_request_error")
        if fake.api_key is not None and request.headers.get("authorization") != f"Bearer {fake.api_key}":
            return self._error(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
        if not isinstance(request.body, dict):
            return self._error(400, "The request body is not valid JSON.", "invalid_request_error")
        window = fake.context_window
        if window is not None:
            prompt = prompt_tokens(request.body)
            wanted = prompt + int(request.body.get("max_tokens") or request.body.get("max_completion_tokens") or 0)
            if wanted > window:
                with fake._lock:
                    fake.rejected.append(prompt)
                return self._error(400, f"This model's maximum context length is {window} tokens. However, your "
                                   f"messages resulted in {prompt} tokens. Please reduce the length of the "
                                   "messages.", "invalid_request_error", "context_length_exceeded")
        fake._enter()
        try:
            self._answer(request.body, fake._next_reply(request))
        except (_Dropped, OSError):
            self.close_connection = True
        finally:
            fake._leave()

    def _receive(self) -> RecordedRequest:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        request = RecordedRequest(self.command, self.path, {k.lower(): v for k, v in self.headers.items()},
                                  body, raw)
        self.server.fake._record(request)
        return request

    def _wait(self, seconds: float) -> None:
        if seconds > 0 and self.server.fake._stopping.wait(seconds):
            raise _Dropped

    def _answer(self, body: dict[str, Any], reply: Reply) -> None:
        if reply.hang:
            self.server.fake._stopping.wait()
            raise _Dropped
        self._wait(reply.delay)
        if reply.status != 200:
            kind = "server_error" if reply.status >= 500 else "invalid_request_error"
            return self._error(reply.status, reply.error_message, kind, headers=reply.headers)
        if body.get("stream"):
            return self._stream(body, reply)
        if reply.malformed:
            return self._send(200, b'{"id": "chatcmpl-broken", "choices": [', "application/json",
                              reply.headers)
        text = "" if reply.empty else reply.text
        message: dict[str, Any] = {"role": "assistant", "content": text or None if reply.tool_calls else text,
                                   "refusal": None}
        if reply.tool_calls:
            message["tool_calls"] = [{"id": call_id, "type": "function",
                                      "function": {"name": name, "arguments": arguments}}
                                     for call_id, name, arguments in reply.tool_calls]
        self._json(200, {
            **_envelope(body, "chat.completion"),
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if reply.tool_calls else reply.finish_reason}],
            "usage": _usage(body, text),
        }, reply.headers)

    def _stream(self, body: dict[str, Any], reply: Reply) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        for name, value in reply.headers:
            self.send_header(name, value)
        self.end_headers()
        envelope = _envelope(body, "chat.completion.chunk")

        def event(choices: list[dict[str, Any]], **extra: Any) -> None:
            self._chunk(f"data: {json.dumps({**envelope, 'choices': choices, **extra})}\n\n")

        def delta(content: dict[str, Any], finish: str | None = None) -> list[dict[str, Any]]:
            return [{"index": 0, "delta": content, "logprobs": None, "finish_reason": finish}]

        event(delta({"role": "assistant", "content": "", "refusal": None}))
        text = "" if reply.empty else reply.text
        for piece in ([] if reply.empty else reply.chunks or list(_pieces(text))):
            self._wait(reply.chunk_delay)
            event(delta({"content": piece}))
        if reply.stream_error is not None:
            error = {"message": reply.stream_error, "type": "invalid_request_error", "code": "stream_error"}
            self._chunk(f"data: {json.dumps({'error': error})}\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            return
        if reply.malformed:
            self._chunk("data: {\"id\": \"chatcmpl-broken\", \"choices\": [\n\n")
        event(delta({}, reply.finish_reason))
        if (body.get("stream_options") or {}).get("include_usage"):
            event([], usage=_usage(body, text))
        self._chunk("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _chunk(self, text: str) -> None:
        data = text.encode("utf-8")
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _json(self, status: int, payload: Any, headers: tuple[tuple[str, str], ...] = ()) -> None:
        self._send(status, json.dumps(payload).encode("utf-8"), "application/json", headers)

    def _error(self, status: int, message: str, kind: str, code: str | None = None,
               headers: tuple[tuple[str, str], ...] = ()) -> None:
        error = {"message": message, "type": kind, "param": None, "code": code}
        self._json(status, {"error": error}, headers)

    def _send(self, status: int, data: bytes, content_type: str,
              headers: tuple[tuple[str, str], ...]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()


_ids = itertools.count(1)


def _envelope(body: dict[str, Any], kind: str) -> dict[str, Any]:
    return {"id": f"chatcmpl-fake{next(_ids)}", "object": kind, "created": int(time.time()),
            "model": str(body.get("model") or "fake-model"), "system_fingerprint": None}


def prompt_tokens(body: Any) -> int:
    """The prompt's tokens as this server counts them: UTF-8 bytes of every message's content over four,
    rounded up, plus four per message."""
    messages = body.get("messages") if isinstance(body, dict) else None
    total = 0
    for message in messages or ():
        content = message.get("content") if isinstance(message, dict) else None
        size = len(json.dumps(content, ensure_ascii=False).encode("utf-8")) if isinstance(content, list) else \
            len(str(content or "").encode("utf-8"))
        total += -(-size // 4) + 4
    return total


def _usage(body: dict[str, Any], text: str) -> dict[str, int]:
    prompt = sum(len(str(m.get("content") or "")) for m in body.get("messages") or () if isinstance(m, dict))
    completion = len(text)
    return {"prompt_tokens": prompt // 4, "completion_tokens": completion // 4,
            "total_tokens": prompt // 4 + completion // 4}


def _pieces(text: str, size: int = 24) -> Iterator[str]:
    """``text`` in pieces of about ``size`` characters, split after spaces where possible."""
    start = 0
    while start < len(text):
        end = min(len(text), start + size)
        space = text.rfind(" ", start, end)
        if end < len(text) and space > start:
            end = space + 1
        yield text[start:end]
        start = end
