"""An HTTP(S) proxy for tests that logs and refuses every request, so a test can prove nothing tried to leave.

    with RefusingProxy() as proxy:
        subprocess.run(agent, env={**os.environ, **proxy.env()})
        assert proxy.attempts == []

As a process: ``python -m sidecar.testing.refusing_proxy --log attempts.jsonl`` prints its port.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Self

from sidecar.testing.serving import QuietServer, serve_until_signalled

LOCAL = "127.0.0.1,localhost,::1"


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One request that reached the proxy: a ``CONNECT host:port`` or a plain request for an absolute URL."""

    method: str
    target: str
    """``host:port`` for CONNECT, else the URL asked for."""
    headers: dict[str, str]
    """Header names in lower case."""


class RefusingProxy:
    """Listens on 127.0.0.1 and answers every request 403, recording it; ``env()`` points a process at it."""

    def __init__(self, log: str | Path | None = None) -> None:
        self.log = Path(log) if log is not None else None
        """When set, every attempt is appended to this file as one JSON line."""
        self._lock = threading.Lock()
        self._attempts: list[Attempt] = []
        self._httpd: QuietServer[RefusingProxy] | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Self:
        """Listen and serve in a background thread."""
        self._httpd = QuietServer(("127.0.0.1", 0), _Handler, self)
        self._thread = self._httpd.serve_in_thread("refusing-proxy")
        return self

    def stop(self) -> None:
        """Stop serving."""
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        if self._thread is not None:
            self._thread.join(2)

    @property
    def port(self) -> int:
        """The port listened on."""
        if self._httpd is None:
            raise RuntimeError("the proxy is not running")
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        """The proxy's URL, as ``HTTPS_PROXY`` takes it."""
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """Proxy variables (both cases) for a process: outbound HTTP(S) comes here, 127.0.0.1 and localhost do not."""
        pairs = {"HTTPS_PROXY": self.url, "HTTP_PROXY": self.url, "ALL_PROXY": self.url, "NO_PROXY": LOCAL}
        return {**pairs, **{name.lower(): value for name, value in pairs.items()}}

    @property
    def attempts(self) -> list[Attempt]:
        """Every request refused so far, oldest first."""
        with self._lock:
            return list(self._attempts)

    def take(self) -> list[Attempt]:
        """The attempts refused so far, forgotten: for a test that expects some and has checked them."""
        with self._lock:
            taken, self._attempts = self._attempts, []
        return taken

    def _record(self, attempt: Attempt) -> None:
        with self._lock:
            self._attempts.append(attempt)
            if self.log is not None:
                with self.log.open("a", encoding="utf-8") as file:
                    file.write(json.dumps({"t": time.time(), **dataclasses.asdict(attempt)}) + "\n")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: QuietServer[RefusingProxy]

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing to stderr: the attempts are recorded."""

    def _refuse(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length and self.command != "CONNECT":
            with contextlib.suppress(OSError):
                self.rfile.read(length)
        self.server.owner._record(Attempt(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
        data = b"refused by the test's proxy: nothing may leave this machine\n"
        self.send_response(403)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    do_CONNECT = do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _refuse


def main(argv: list[str] | None = None) -> int:
    """Refuse every request until interrupted, printing the port first."""
    parser = argparse.ArgumentParser(prog="python -m sidecar.testing.refusing_proxy", description=main.__doc__)
    parser.add_argument("--log", help="append every attempt to this file as a JSON line")
    args = parser.parse_args(argv)
    proxy = RefusingProxy(log=args.log).start()
    return serve_until_signalled(str(proxy.port), proxy.stop)


if __name__ == "__main__":
    sys.exit(main())
