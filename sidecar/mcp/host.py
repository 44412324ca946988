"""The MCP server's connection to the shared host: a ``SidecarClient`` over a relay, attached in the background.

Nothing here delays ``initialize`` or ``tools/list``: the client is spawned when the server starts, and only a
``tools/call`` waits for it, within a deadline. Whatever goes wrong (no host, a host killed mid-call, a locked
database) becomes a tool result that says why; the agent is never left waiting or broken.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import sys
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from sidecar.client import SidecarClient

log = logging.getLogger(__name__)

CALL_DEADLINE = 45.0
"""Seconds a tools/call may take in all (attaching, one retry, the call): under Codex's 60 s tool timeout."""


@attrs.define
class ToolOutcome:
    """What a tools/call answers: the text the model reads, and whether it reports a failure."""

    text: str
    is_error: bool


class HostLink:
    """One SidecarClient to the database's host, spawned at start and again after it was lost."""

    def __init__(self, command: list[str], db: str | None, settings: dict[str, Any] | None,
                 stderr: str | None) -> None:
        self.command, self.db, self.settings, self.stderr = command, db, settings, stderr
        self._client: SidecarClient | None = None
        self._attaching: asyncio.Task[SidecarClient] | None = None
        self._importing: asyncio.Future[Any] | None = None
        self._workspace: str | None = None
        self._watched: str | None = None
        self._watch_lock = asyncio.Lock()
        self._watching: set[asyncio.Task[None]] = set()
        self._closing: set[asyncio.Task[None]] = set()
        """Background work, referenced here (the loop keeps only weak references): watches cancelled at close,
        lost clients' closes awaited."""

    def start(self) -> None:
        """Begin attaching in the background."""
        if self._attaching is None or self._attaching.done():
            self._attaching = asyncio.get_running_loop().create_task(self._attach())
            self._attaching.add_done_callback(_retrieve)

    async def _client_module(self) -> Any:
        """``sidecar.client`` (and the protocol it imports), imported once, off the loop (~30 ms).

        Every import of them waits for this one: the loop's thread importing ``protocol`` while the worker thread
        is inside it deadlocks on their module locks (Python raises ``_DeadlockError`` in one of them).
        """
        if self._importing is None:
            self._importing = asyncio.ensure_future(asyncio.to_thread(importlib.import_module, "sidecar.client"))
        return await asyncio.shield(self._importing)

    async def _attach(self) -> SidecarClient:
        started = time.monotonic()
        module = await self._client_module()
        client: SidecarClient = await module.SidecarClient.spawn(
            command=self.command, db=self.db, settings=self.settings, stderr=self.stderr, timeout=CALL_DEADLINE)
        self._client = client
        log.info("attached to the host of %s in %.0f ms (pid %s)", client.capabilities.get("storage", "?"),
                 1000 * (time.monotonic() - started), client.process.pid if client.process else "?")
        self._watched = None
        await self._watch()
        return client

    async def _connected(self, deadline: float) -> SidecarClient:
        """The attached client, attaching again if it was lost; TimeoutError past ``deadline``."""
        if self._client is not None and not self._client.closed:
            return self._client
        if self._client is not None:  # the relay is gone: a new one will find or start a host
            log.warning("the connection to context-sidecar was lost; attaching again")
            old, self._client = self._client, None
            _keep(self._closing, _close(old))
        if self._attaching is None or self._attaching.done():
            self.start()
        assert self._attaching is not None
        return await asyncio.wait_for(asyncio.shield(self._attaching), max(0.0, deadline - time.monotonic()))

    def set_workspace(self, workspace: str) -> None:
        """The workspace to watch; sent now if attached, else once attached."""
        self._workspace = workspace
        if self._client is not None:
            _keep(self._watching, self._watch())

    async def _watch(self) -> None:
        """``memory/watch`` the workspace (the agents' directories as this process, the agent's child, sees them),
        if the host offers it and the workspace changed; a failure is only logged."""
        from protocol.methods import MEMORY_WATCH  # loaded by the attach

        async with self._watch_lock:  # one at a time: a tools/call waits for the one under way
            client, workspace = self._client, self._workspace
            if client is None or workspace is None or workspace == self._watched:
                return
            if MEMORY_WATCH not in (client.capabilities.get("methods") or ()):
                log.info("the host has no %s: earlier agent sessions are not imported", MEMORY_WATCH)
                self._watched = workspace
                return
            try:  # _watched changes only once the host answered: a failed or cancelled watch is sent again
                if self._watched is not None:
                    await client.watch(self._watched, watch=False)
                    self._watched = None
                result = await client.watch(workspace)
                self._watched = workspace
                log.info("watching %s: %d transcripts", workspace, len(result.transcripts))
            except Exception as error:  # the tools work without it
                log.warning("%s %s failed: %s", MEMORY_WATCH, workspace, error)

    async def call_tool(self, name: str, arguments: str, workspace: str, session_id: str | None,
                        tool_call_id: str | None) -> ToolOutcome:
        """memory/callTool over the workspace; a host lost mid-call is tried once more, on a new host."""
        await self._client_module()
        from protocol.errors import HOST_CONNECTION_LOST
        from sidecar.client import SidecarConnectionLost, SidecarRequestError

        deadline = time.monotonic() + CALL_DEADLINE
        for attempt in (1, 2):
            try:
                client = await self._connected(deadline)
                await asyncio.wait_for(self._watch(), max(0.0, deadline - time.monotonic()))  # the workspace's
                message = await asyncio.wait_for(
                    client.call_tool(session_id, name, arguments, tool_call_id, workspace=workspace),
                    max(0.0, deadline - time.monotonic()))
                text = str(message.get("content") or "")
                return ToolOutcome(text, text.startswith("Error:"))
            except SidecarConnectionLost as error:
                reason = f"the connection to context-sidecar was lost ({error.message})"
            except SidecarRequestError as error:
                if error.code != HOST_CONNECTION_LOST:
                    return ToolOutcome(f"Error: context-sidecar could not run {name}: {error.message}", True)
                reason = "the host of the memory database exited during the call"
            except TimeoutError:
                return ToolOutcome(f"Error: context-sidecar did not answer {name} within {CALL_DEADLINE:g} s; "
                                   "its log says more.", True)
            except OSError as error:
                return ToolOutcome(f"Error: context-sidecar could not be started ({error}); memory tools are "
                                   "unavailable.", True)
            log.warning("%s: %s (attempt %d)", name, reason, attempt)
        return ToolOutcome(f"Error: context-sidecar could not run {name}: {reason}, twice. Try again later.", True)

    async def close(self) -> None:
        """Shut the client down (its relay exits; the host lingers for its other clients)."""
        if self._attaching is not None and not self._attaching.done():
            self._attaching.cancel()
            with contextlib.suppress(BaseException):
                await self._attaching
        for task in self._watching:
            task.cancel()
        await asyncio.gather(*self._watching, *self._closing, return_exceptions=True)
        if self._client is not None:
            await _close(self._client)
            self._client = None


def _keep(tasks: set[asyncio.Task[None]], work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` as a task held in ``tasks`` until it is done."""
    task = asyncio.get_running_loop().create_task(work)
    tasks.add(task)
    task.add_done_callback(tasks.discard)


async def _close(client: SidecarClient) -> None:
    with contextlib.suppress(Exception):
        await client.close(timeout=2.0)


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Log a failed attach once (a tools/call reports it to the model)."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("could not attach to context-sidecar: %s", task.exception())


def sidecar_command(log_file: str | None, verbose: int) -> list[str]:
    """The ``context-sidecar`` the client spawns: this interpreter, logging where this server logs."""
    command = [sys.executable, "-P", "-m", "sidecar"]
    if log_file:
        command += ["--log-file", log_file]
    if verbose:
        command.append("-" + "v" * min(verbose, 2))
    return command
