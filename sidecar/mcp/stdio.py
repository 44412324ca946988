"""``context-sidecar mcp`` as a process: stdin read in a thread, which answers what needs no event loop
(initialize, tools/list) at once while the main thread imports the rest and starts the loop; replies on stdout;
signals and the end of stdin end it (exit code 0).

An agent in headless mode waits about a second for its MCP servers, on a machine that may be busy: so nothing the
first answers do not need (asyncio, attrs, the host link and its client, the protocol's types) is imported before
the stdin thread can answer them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, BinaryIO

from sidecar.mcp.handoff import SIGNALS, Ending, Inbox
from sidecar.mcp.server import MAX_LINE, McpServer

log = logging.getLogger(__name__)


def run(db: str | None, settings: dict[str, Any] | None, log_file: str | None, verbose: int) -> int:
    """Serve MCP on stdin/stdout until stdin closes (or SIGTERM); logs never go to stdout."""
    stdout = sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must never corrupt the protocol stream
    ending, inbox = Ending(), Inbox()
    server = McpServer(_writer(stdout, ending), os.getcwd(), os.environ)
    for signum in SIGNALS:  # until the loop runs: then its own handlers replace these
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signum, lambda number, frame: ending(signal.Signals(number).name))
    threading.Thread(target=_read_stdin, args=(inbox, server, ending), name="mcp-stdin", daemon=True).start()
    from sidecar.mcp import loop  # asyncio, the host link: loads while the stdin thread answers the first requests

    return loop.serve(server, inbox, ending, db, settings, log_file, verbose)


def _writer(stdout: BinaryIO, ending: Ending) -> Callable[[bytes], None]:
    def write(data: bytes) -> None:
        try:
            stdout.write(data)
            stdout.flush()
        except (OSError, ValueError):
            ending("stdout closed")

    return write


def _read_stdin(inbox: Inbox, server: McpServer, ending: Ending) -> None:
    """Lines from stdin to the session (a thread: stdin may be a pipe, a file or a terminal)."""
    stdin = sys.stdin.buffer
    try:
        while True:
            line = stdin.readline(MAX_LINE + 1)
            if not line:
                break
            if len(line) > MAX_LINE and not line.endswith(b"\n"):
                while line and not line.endswith(b"\n"):
                    line = stdin.readline(MAX_LINE)
                inbox.deliver(server.oversized)
                continue
            inbox.deliver(server.receive, line)
    except (OSError, ValueError) as error:
        log.warning("reading stdin failed: %s", error)
    finally:
        with contextlib.suppress(RuntimeError):  # the loop is already closed
            inbox.deliver(ending, "stdin closed")
