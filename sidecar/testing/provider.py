"""A scripted fake LLM provider on 127.0.0.1: Anthropic Messages, OpenAI Responses and Chat Completions.

    with FakeProvider(responder=reference_policy(tool="Bash", arguments={"command": "echo hi"})) as fake:
        fake.script(Reply(text="first answer"), Reply(status=529))  # used first, in order
        ...  # ANTHROPIC_BASE_URL=fake.url, or an OpenAI client's base_url=fake.base_url
        assert fake.model_requests[-1].tool_result == "hi\\n"

As a process: ``python -m sidecar.testing.provider --port 0 --log requests.jsonl`` prints its port and
answers with ``reference_policy`` (see ``--help``). Standard library only.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Self

import sidecar.testing.anthropic_wire as anthropic_wire
import sidecar.testing.openai_wire as openai_wire
from sidecar.testing.conversation import Api, OfferedTool, RecordedRequest, api_of, chat_prompt_tokens, prompt_chars
from sidecar.testing.policy import Responder, reference_policy
from sidecar.testing.replies import Event, Reply, ToolCall, Usage, estimate, new_id, resolved_usage
from sidecar.testing.serving import QuietServer, serve_until_signalled

MODEL_APIS: tuple[Api, ...] = ("anthropic", "responses", "chat")


class FakeProvider:
    """Serves the three model APIs on 127.0.0.1 from a script of replies and a responder, recording every request."""

    def __init__(self, *, responder: Responder | None = None, models: tuple[str, ...] = ("fake-model",),
                 api_key: str | None = None, context_window: int | None = None, log: str | Path | None = None,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        self.responder = responder
        """Answers model requests when the script is empty; a returned str is the reply's text."""
        self.models = models
        self.api_key = api_key
        """When set, model requests without it (``x-api-key`` or ``Authorization: Bearer``) get 401."""
        self.context_window = context_window
        """When set, a prompt (plus max tokens) over it gets the API's 400 for a too long prompt."""
        self.rejected: list[int] = []
        """Prompt tokens of every request rejected for the window."""
        self.log = Path(log) if log is not None else None
        """When set, every request is appended to this file as one JSON line."""
        self._address = (host, port)
        self._lock = threading.Condition()
        self._script: collections.deque[Reply] = collections.deque()
        self._requests: list[RecordedRequest] = []
        self._in_flight = 0
        self._max_in_flight = 0
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._handlers: set[threading.Thread] = set()
        self._httpd: QuietServer[FakeProvider] | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Self:
        """Listen and serve in a background thread."""
        self._stopping.clear()
        self._httpd = QuietServer(self._address, _Handler, self)
        self._thread = self._httpd.serve_in_thread("fake-provider")
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
    def url(self) -> str:
        """The server's origin, e.g. for ``ANTHROPIC_BASE_URL`` (the client adds ``/v1/messages``)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The ``…/v1`` base URL OpenAI clients take."""
        return f"{self.url}/v1"

    def script(self, *replies: Reply | str) -> None:
        """Queue replies, used in order before the responder; a str is a reply with that text."""
        with self._lock:
            self._script.extend(Reply(text=r) if isinstance(r, str) else r for r in replies)

    @property
    def pending(self) -> int:
        """Scripted replies not used yet."""
        with self._lock:
            return len(self._script)

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    @property
    def model_requests(self) -> list[RecordedRequest]:
        """The requests for a model answer (any of the three APIs), oldest first."""
        return [r for r in self.requests if r.method == "POST" and r.api in MODEL_APIS]

    def wait_for(self, predicate: Callable[[RecordedRequest], bool] = lambda r: r.api in MODEL_APIS,
                 count: int = 1, timeout: float = 30.0) -> list[RecordedRequest]:
        """Wait until ``count`` received requests satisfy ``predicate`` (model requests by default); return them."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                found = [r for r in self._requests if predicate(r)]
                if len(found) >= count:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(found)} of {count} awaited requests came in {timeout} s")
                self._lock.wait(left)

    @property
    def in_flight(self) -> int:
        """Model requests being answered right now."""
        with self._lock:
            return self._in_flight

    @property
    def max_in_flight(self) -> int:
        """The most model requests ever answered at once."""
        with self._lock:
            return self._max_in_flight

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)
            self._lock.notify_all()
            if self.log is not None:
                entry = {"t": time.time(), "method": request.method, "path": request.path, "query": request.query,
                         "headers": request.headers, "body": request.body}
                if request.body is None and request.raw:
                    entry["raw"] = request.raw.decode("utf-8", "replace")
                with self.log.open("a", encoding="utf-8") as file:
                    file.write(json.dumps(entry) + "\n")

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


class _Dropped(Exception):
    """The server is stopping, the reply cuts the connection, or the client went away: abandon the reply."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: QuietServer[FakeProvider]

    def setup(self) -> None:
        super().setup()
        self.server.owner._track(self.connection, add=True)

    def finish(self) -> None:
        self.server.owner._track(self.connection, add=False)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing: request lines and headers may carry secrets."""

    def do_HEAD(self) -> None:
        self._receive()
        self._send(200, b"", "application/json", ())

    def do_GET(self) -> None:
        request = self._receive()
        names = self.server.owner.models
        if request.path.rstrip("/").endswith("/models"):
            self._json(200, anthropic_wire.models(names) if self._anthropic(request) else openai_wire.models(names))
        else:
            self._not_found(request)

    def do_POST(self) -> None:
        request = self._receive()
        fake = self.server.owner
        if request.api is None:
            return self._not_found(request)
        if fake.api_key is not None and fake.api_key not in (
                request.headers.get("x-api-key"), request.headers.get("authorization", "").removeprefix("Bearer ")):
            return self._error(request, 401, "Incorrect API key provided.", code="invalid_api_key")
        if not isinstance(request.body, dict):
            return self._error(request, 400, "The request body is not valid JSON.")
        prompt = estimate(prompt_chars(request.api, request.body)) if request.api != "chat" \
            else chat_prompt_tokens(request.body)
        if request.api == "count_tokens":
            return self._json(200, anthropic_wire.count_tokens(prompt))
        if fake.context_window is not None and self._over_window(request, prompt, fake.context_window):
            return None
        fake._enter()
        try:
            self._answer(request, fake._next_reply(request))
        except (_Dropped, OSError):
            self.close_connection = True
        finally:
            fake._leave()

    def do_CONNECT(self) -> None:
        self._receive()
        self._send(405, b"", "text/plain", ())
        self.close_connection = True

    do_PUT = do_PATCH = do_DELETE = do_GET

    def _receive(self) -> RecordedRequest:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        parts = urllib.parse.urlsplit(self.path)
        path = self.path if self.command == "CONNECT" else parts.path
        request = RecordedRequest(self.command, path, {k.lower(): v for k, v in self.headers.items()}, body, raw,
                                  urllib.parse.parse_qs(parts.query, keep_blank_values=True), api_of(path),
                                  time.monotonic())
        self.server.owner._record(request)
        return request

    def _over_window(self, request: RecordedRequest, prompt: int, window: int) -> bool:
        body = request.body
        wanted = prompt + int(body.get("max_tokens") or body.get("max_completion_tokens")
                              or body.get("max_output_tokens") or 0)
        if wanted <= window:
            return False
        with self.server.owner._lock:
            self.server.owner.rejected.append(prompt)
        if request.api == "anthropic":
            message = f"prompt is too long: {prompt} tokens > {window} maximum"
        elif request.api == "responses":
            message = "Your input exceeds the context window of this model. Please adjust your input and try again."
        else:
            message = (f"This model's maximum context length is {window} tokens. However, your messages resulted "
                       f"in {prompt} tokens. Please reduce the length of the messages.")
        self._error(request, 400, message, code="context_length_exceeded")
        return True

    def _wait(self, seconds: float) -> None:
        if seconds > 0 and self.server.owner._stopping.wait(seconds):
            raise _Dropped

    def _drop(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)
        raise _Dropped

    def _answer(self, request: RecordedRequest, reply: Reply) -> None:
        if reply.hang:
            self.server.owner._stopping.wait()
            raise _Dropped
        self._wait(reply.delay)
        if reply.status != 200:
            return self._error(request, reply.status, reply.error_message, reply.error_type, headers=reply.headers)
        body = request.body
        usage = resolved_usage(reply, prompt_chars(request.api, body))
        if body.get("stream"):
            render = {"anthropic": anthropic_wire.events, "responses": openai_wire.response_events,
                      "chat": openai_wire.completion_events}[str(request.api)]
            return self._stream(render(reply, body, usage), reply)
        if reply.drop_after is not None:
            self._drop()
        if reply.malformed:
            return self._send(200, b'{"id": "broken", "content": [', "application/json", reply.headers)
        build = {"anthropic": anthropic_wire.message, "responses": openai_wire.response,
                 "chat": openai_wire.completion}[str(request.api)]
        self._json(200, build(reply, body, usage), reply.headers)

    def _stream(self, events: Sequence[Event], reply: Reply) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("request-id", new_id("req_"))
        for name, value in reply.headers:
            self.send_header(name, value)
        self.end_headers()
        for index, event in enumerate(events):
            if index == reply.drop_after:
                self._drop()
            if event.delta:
                self._wait(reply.chunk_delay)
            data = event.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _anthropic(self, request: RecordedRequest) -> bool:
        return request.api in ("anthropic", "count_tokens") or "anthropic-version" in request.headers

    def _not_found(self, request: RecordedRequest) -> None:
        self._error(request, 404, f"Unknown path {request.path}")

    def _error(self, request: RecordedRequest, status: int, message: str, kind: str | None = None,
               code: str | None = None, headers: tuple[tuple[str, str], ...] = ()) -> None:
        if self._anthropic(request):
            self._json(status, anthropic_wire.error_body(status, message, kind), headers)
        else:
            self._json(status, openai_wire.error_body(status, message, kind, code), headers)

    def _json(self, status: int, payload: Any, headers: tuple[tuple[str, str], ...] = ()) -> None:
        self._send(status, json.dumps(payload).encode("utf-8"), "application/json", headers)

    def _send(self, status: int, data: bytes, content_type: str, headers: tuple[tuple[str, str], ...]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()


def main(argv: list[str] | None = None) -> int:
    """Serve until interrupted, printing the port first; replies come from ``reference_policy``."""
    parser = argparse.ArgumentParser(prog="python -m sidecar.testing.provider", description=main.__doc__)
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free one)")
    parser.add_argument("--log", help="append every request to this file as a JSON line")
    parser.add_argument("--trigger", default="USE_TOOL", help="user text that makes the model call the tool")
    parser.add_argument("--tool", default="memory_grep", help="the tool to call (exact name, else a substring)")
    parser.add_argument("--tool-args", default='{"pattern": "secret"}', help="the call's arguments, JSON")
    parser.add_argument("--text", default="Hello from the fake model.", help="the answer otherwise")
    args = parser.parse_args(argv)
    policy = reference_policy(trigger=args.trigger, tool=args.tool, arguments=json.loads(args.tool_args),
                              text=args.text)
    fake = FakeProvider(responder=policy, log=args.log, port=args.port).start()
    return serve_until_signalled(str(fake.port), fake.stop)


__all__ = ["FakeProvider", "OfferedTool", "RecordedRequest", "Reply", "Responder", "ToolCall", "Usage",
           "reference_policy"]

if __name__ == "__main__":
    sys.exit(main())
