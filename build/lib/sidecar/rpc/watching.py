"""Who owns the watcher of agent transcripts (``memory/watch``): the host for all its connections, or a lone server."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from protocol.types import Usage
from sidecar.services.state import Sidecar
from sidecar.services.watch import WatchService

if TYPE_CHECKING:
    from sidecar.rpc.server import SidecarServer


class Host(Protocol):
    """What the watcher needs of the host (``sidecar.rpc.host.Host``), which owns it."""

    sidecar: Sidecar
    servers: set[Any]

    def watchers(self, origin: Any, session_id: str) -> list[Any]:
        """The connections following the session, but ``origin``."""

    def keep(self, task: asyncio.Task[Any]) -> None:
        """Keep a task until it ends; cancelled when the host closes."""


class HostAudience:
    """The host's connections that follow a session hear what the watcher changed in it."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def push_usage(self, usage: Usage) -> None:
        """context/didChangeUsage to each connection following the session."""
        for server in self.host.watchers(None, usage.session_id):
            server.push_usage(usage)

    def notify_session(self, session_id: str, method: str, params: Any) -> None:
        """A notification to each connection following the session."""
        for server in self.host.watchers(None, session_id):
            server.notify_in_order(method, params)

    def settle_later(self) -> None:
        """A checkpoint when requests pause, as any connection schedules one."""
        server = next(iter(self.host.servers), None)
        if server is not None:
            server.settle_later()


class ServerAudience:
    """A server of its own (``--no-share``): its one client hears of the sessions it follows."""

    def __init__(self, server: SidecarServer) -> None:
        self.server = server

    def _follows(self, session_id: str) -> bool:
        store = self.server.sidecar.open_store
        session = store.session(session_id) if store is not None else None
        return self.server.follows(session_id, session.workspace if session is not None else None)

    def push_usage(self, usage: Usage) -> None:
        """context/didChangeUsage, when the client follows the session."""
        if self._follows(usage.session_id):
            self.server.push_usage(usage)

    def notify_session(self, session_id: str, method: str, params: Any) -> None:
        """A notification, when the client follows the session."""
        if self._follows(session_id):
            self.server.notify_in_order(method, params)

    def settle_later(self) -> None:
        """A checkpoint when requests pause."""
        self.server.settle_later()


def host_watcher(host: Host) -> WatchService:
    """The host's watcher: its loop is one of the host's tasks, stopped with it."""

    def spawn(work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        host.keep(task)
        return task

    return WatchService(host.sidecar.attached, HostAudience(host), spawn)


def watcher(server: SidecarServer) -> WatchService:
    """The watcher serving this connection: its host's, or (without a host) the server's own, made on first use."""
    if server.hub is not None:
        return server.hub.transcripts
    if server.transcripts is None:
        def spawn(work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
            task = asyncio.get_running_loop().create_task(work)
            server.background_tasks.add(task)  # cancelled at shutdown, as the server's other work
            task.add_done_callback(server.background_tasks.discard)
            return task

        def view() -> Any:
            server.sidecar.store()
            return server.sidecar.attached()

        server.transcripts = WatchService(view, ServerAudience(server), spawn)
    return server.transcripts
