"""What the stdin thread and the event loop share: the lines read (handled in that thread until the loop runs, then
on the loop) and why the server ends. Nothing here imports asyncio: the stdin thread answers before it loads."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

    from sidecar.mcp.host import HostLink
    from sidecar.mcp.server import McpServer

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""Each ends the server with exit code 0, as closing stdin does."""


class Ending:
    """Why the server ends (stdin closed, a signal, stdout closed): set from any thread or a signal handler,
    before the event loop runs or while it does; awaited on the loop."""

    def __init__(self) -> None:
        self.why: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._woken: asyncio.Future[None] | None = None

    def __call__(self, why: str) -> None:
        if self.why is None:
            self.why = why
        loop = self._loop  # read after why is set: wait() reads why after setting it
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        if self._woken is not None and not self._woken.done():
            self._woken.set_result(None)

    async def wait(self, loop: asyncio.AbstractEventLoop) -> str:
        """The reason, once there is one."""
        self._woken = loop.create_future()
        self._loop = loop
        if self.why is None:
            await self._woken
        assert self.why is not None
        return self.why


class Inbox:
    """What the stdin thread read, handed to the session: in that thread at once until the event loop runs (the
    session defers what needs the loop), then on the loop, in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def deliver(self, handle: Callable[..., None], *args: Any) -> None:
        """``handle(*args)``, here and now or on the loop."""
        with self._lock:
            if self._loop is None:
                handle(*args)
                return
        self._loop.call_soon_threadsafe(handle, *args)

    def start(self, server: McpServer, loop: asyncio.AbstractEventLoop, link: HostLink) -> None:
        """From the loop's thread: the session starts what waited, and from now on is handed lines on the loop."""
        with self._lock:
            server.start(loop, link)
            self._loop = loop
