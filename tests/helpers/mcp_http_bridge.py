"""A Streamable HTTP front for a stdio MCP server, so that HTTP-only MCP test suites can drive it (stdlib only).

    python -m tests.helpers.mcp_http_bridge -- context-sidecar mcp --db /tmp/x.duckdb

Prints ``http://127.0.0.1:PORT/mcp`` once listening. Each ``initialize`` POSTed starts its own server process
(an MCP session, named in the ``Mcp-Session-Id`` header); a request is answered with its reply as
``application/json``, a notification or response with 202; GET (a server-to-client stream) is 405, as the
transport allows; DELETE ends the session's process. Messages the server sends on its own (log notifications,
requests) are dropped: this front serves clients that declare no roots.
"""

from __future__ import annotations

import argparse
import json
import queue
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

WAIT = 60.0


class Session:
    """One stdio server process, and the replies its handlers wait for."""

    def __init__(self, command: list[str]) -> None:
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.lock = threading.Lock()
        self.waiting: dict[str, queue.Queue[Any]] = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            message = json.loads(line)
            for reply in message if isinstance(message, list) else [message]:
                if "method" not in reply:
                    with self.lock:
                        box = self.waiting.pop(json.dumps(reply.get("id")), None)
                    if box is not None:
                        box.put(reply)

    def exchange(self, message: Any) -> Any:
        """Write a message; for requests, wait for the reply (a batch: every reply)."""
        items = message if isinstance(message, list) else [message]
        boxes = []
        with self.lock:
            for item in items:
                if isinstance(item, dict) and "method" in item and "id" in item:
                    box: queue.Queue[Any] = queue.Queue()
                    self.waiting[json.dumps(item["id"])] = box
                    boxes.append(box)
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        self.process.stdin.flush()
        replies = [box.get(timeout=WAIT) for box in boxes]
        if not replies:
            return None
        return replies if isinstance(message, list) else replies[0]

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(WAIT)
        except subprocess.TimeoutExpired:
            self.process.kill()


class Bridge(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, command: list[str]) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.command = command
        self.sessions: dict[str, Session] = {}


class Handler(BaseHTTPRequestHandler):
    server: Bridge
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: Any = None, headers: dict[str, str] | None = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        try:
            message = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        except ValueError as error:
            self._send(400, {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": str(error)}})
            return
        headers: dict[str, str] = {}
        name = self.headers.get("Mcp-Session-Id")
        if isinstance(message, dict) and message.get("method") == "initialize":
            name = uuid.uuid4().hex
            self.server.sessions[name] = Session(self.server.command)
            headers["Mcp-Session-Id"] = name
        session = self.server.sessions.get(name or "")
        if session is None:
            self._send(404, {"jsonrpc": "2.0", "id": None, "error": {"code": -32001, "message": "unknown session"}})
            return
        reply = session.exchange(message)
        self._send(202, None, headers) if reply is None else self._send(200, reply, headers)

    def do_GET(self) -> None:
        self._send(405, None, {"Allow": "POST, DELETE"})

    def do_DELETE(self) -> None:
        session = self.server.sessions.pop(self.headers.get("Mcp-Session-Id") or "", None)
        if session is not None:
            session.close()
        self._send(200 if session is not None else 404)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the stdio MCP server's command")
    command = [part for part in parser.parse_args().command if part != "--"]
    bridge = Bridge(command)
    print(f"http://127.0.0.1:{bridge.server_address[1]}/mcp", flush=True)
    try:
        bridge.serve_forever()
    finally:
        for session in bridge.sessions.values():
            session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
