"""The MCP server's event loop, started once the stdin thread may already have answered initialize and
tools/list: the host link attaching in the background, signals, log records to the client, until the end."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from typing import Any

from sidecar.config.database import PasswordMask
from sidecar.mcp.handoff import SIGNALS, Ending, Inbox
from sidecar.mcp.host import HostLink, sidecar_command
from sidecar.mcp.server import McpServer

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


def serve(server: McpServer, inbox: Inbox, ending: Ending, db: str | None, settings: dict[str, Any] | None,
          log_file: str | None, verbose: int) -> int:
    """Run the session on an event loop until ``ending`` has a reason; exit code 0."""
    return asyncio.run(_serve(server, inbox, ending, db, settings, log_file, verbose))


async def _serve(server: McpServer, inbox: Inbox, ending: Ending, db: str | None, settings: dict[str, Any] | None,
                 log_file: str | None, verbose: int) -> int:
    loop = asyncio.get_running_loop()
    link = HostLink(sidecar_command(log_file, verbose), db, settings, log_file)
    link.start()
    for signum in SIGNALS:
        with contextlib.suppress(ValueError, NotImplementedError):
            loop.add_signal_handler(signum, ending, signal.Signals(signum).name)
    handler = ClientLogHandler(server, loop)
    handler.addFilter(PasswordMask())
    logging.getLogger("sidecar").addHandler(handler)
    inbox.start(server, loop, link)
    try:
        why = await ending.wait(loop)
        log.info("exiting: %s", why)
        await asyncio.wait_for(server.close(), 5.0)
    except TimeoutError:
        log.warning("the host connection did not close within 5 s")
    finally:
        logging.getLogger("sidecar").removeHandler(handler)
    return 0
