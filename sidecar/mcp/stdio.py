"""``context-sidecar mcp`` as a process: stdin read in a thread, replies and log notifications on stdout, the host
attached in the background, signals and the end of stdin ending it (exit code 0)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from sidecar.config.database import PasswordMask
from sidecar.mcp.host import HostLink, sidecar_command
from sidecar.mcp.server import MAX_LINE, McpServer

log = logging.getLogger(__name__)


class ClientLogHandler(logging.Handler):
    """Our log records, to the client as notifications/message (from the loop's thread, never recursively)."""

    def __init__(self, server: McpServer, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(logging.DEBUG)
        self.server, self.loop = server, loop
        self.thread = threading.get_ident()  # made on the loop's thread
        self._busy = False

    def emit(self, record: logging.LogRecord) -> None:
        if self.server.log_level is None or self._busy:
            return
        if threading.get_ident() != self.thread:
            self.loop.call_soon_threadsafe(self.emit, record)
            return
        self._busy = True
        try:
            self.server.forward_log(record)
        finally:
            self._busy = False


def run(db: str | None, settings: dict[str, Any] | None, log_file: str | None, verbose: int) -> int:
    """Serve MCP on stdin/stdout until stdin closes (or SIGTERM); logs never go to stdout."""
    stdout = sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must never corrupt the protocol stream
    return asyncio.run(_serve(stdout, db, settings, log_file, verbose))


async def _serve(stdout: Any, db: str | None, settings: dict[str, Any] | None, log_file: str | None,
                 verbose: int) -> int:
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[str] = loop.create_future()

    def finish(why: str) -> None:
        if not finished.done():
            finished.set_result(why)

    def write(data: bytes) -> None:
        try:
            stdout.write(data)
            stdout.flush()
        except (OSError, ValueError):
            finish("stdout closed")

    link = HostLink(sidecar_command(log_file, verbose), db, settings, log_file)
    server = McpServer(write, link, os.getcwd(), os.environ)
    threading.Thread(target=_read_stdin, args=(loop, server, finish), name="mcp-stdin", daemon=True).start()
    link.start()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        with contextlib.suppress(ValueError, NotImplementedError):
            loop.add_signal_handler(signum, finish, signal.Signals(signum).name)
    handler = ClientLogHandler(server, loop)
    handler.addFilter(PasswordMask())
    logging.getLogger("sidecar").addHandler(handler)
    try:
        why = await finished
        log.info("exiting: %s", why)
        await asyncio.wait_for(server.close(), 5.0)
    except TimeoutError:
        log.warning("the host connection did not close within 5 s")
    finally:
        logging.getLogger("sidecar").removeHandler(handler)
    return 0


def _read_stdin(loop: asyncio.AbstractEventLoop, server: McpServer, finish: Callable[[str], None]) -> None:
    """Lines from stdin to the loop (a thread: stdin may be a pipe, a file or a terminal)."""
    stdin = sys.stdin.buffer
    try:
        while True:
            line = stdin.readline(MAX_LINE + 1)
            if not line:
                break
            if len(line) > MAX_LINE and not line.endswith(b"\n"):
                while line and not line.endswith(b"\n"):
                    line = stdin.readline(MAX_LINE)
                loop.call_soon_threadsafe(server.oversized)
                continue
            loop.call_soon_threadsafe(server.receive, line)
    except (OSError, ValueError) as error:
        log.warning("reading stdin failed: %s", error)
    finally:
        with contextlib.suppress(RuntimeError):  # the loop is already closed
            loop.call_soon_threadsafe(finish, "stdin closed")
