"""What the kit's HTTP servers share: a quiet threading server that knows its owner, run in a thread or as a process."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Generic, TypeVar

Owner = TypeVar("Owner")


class QuietServer(ThreadingHTTPServer, Generic[Owner]):
    """A ``ThreadingHTTPServer`` whose handlers reach ``owner``; it says nothing when a client hangs up."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], owner: Owner) -> None:
        self.owner = owner
        super().__init__(address, handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Stay quiet: clients that give up mid-reply, or on a refusal, are part of the tests."""

    def serve_in_thread(self, name: str) -> threading.Thread:
        """Serve in a started daemon thread (``shutdown()`` stops it)."""
        thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, name=name, daemon=True)
        thread.start()
        return thread


def serve_until_signalled(announce: str, stop: Callable[[], None]) -> int:
    """Print ``announce``, wait for SIGINT or SIGTERM, then ``stop()``; a process's ``main`` returns this."""
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    print(announce, flush=True)
    stopping.wait()
    stop()
    return 0
