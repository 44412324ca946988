"""memory/watch: the host follows a workspace's agent transcripts for as long as a connection asks.

One follower per file however many connections watch it (each file counts the watches that include it, each watch
the connections that asked); a connection that ends stops its watches, a few seconds later (an agent writes its
last lines as it stops the MCP server that watched). Each file is read in a thread (parsing a
multi-MB transcript takes the interpreter for a while, and the host's other clients wait for nothing but the
interpreter's turns) and stored on the event loop, where every use of the store is (``tails.py``). New files are
found by listing the agents' directories again; changed files are imported newest change first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

import attrs

from protocol.types import WatchedDirectory, WatchedTranscript, WatchParams, WatchResult
from sidecar.agents.discovery import Scanner, sources
from sidecar.agents.locations import ENV_NAMES, agent_env
from sidecar.config.paths import workspace_key
from sidecar.services.errors import SidecarError, invalid_params
from sidecar.services.state import Sidecar
from sidecar.services.tails import Audience, Tail, TailImporter, WatchKey

log = logging.getLogger(__name__)

POLL_SECONDS = 0.2
"""How often followed files are looked at (a stat each)."""
SCAN_SECONDS = 1.0
"""How often the agents' directories are looked at for new files (a stat per directory; listed when changed)."""
TICK_BUDGET = 0.5
"""Seconds of imports per look before the next one: a backlog of earlier sessions does not hold up live ones."""
MAX_DIRECTORIES = 32
"""Directories one watch may name."""
LINGER_SECONDS = 3.0
"""How long a watch goes on after its last connection ended: an agent writes its last lines as it stops the MCP
server that asked for the watch (Claude Code 2.1 about 0.15 s after), and those lines are to be stored now."""


@attrs.define(eq=False)
class Watch:
    """A workspace's transcripts in one set of directories, followed for the connections that asked."""

    key: WatchKey
    scanner: Scanner
    owners: set[object] = attrs.field(factory=set)
    files: dict[Path, str] = attrs.field(factory=dict)
    next_scan: float = 0.0
    ends_at: float | None = None
    """When the last connection left: the time it ends (LINGER_SECONDS later) unless another one asks."""
    scanning: asyncio.Lock = attrs.field(factory=asyncio.Lock)
    """Held while the directories are listed: one look at a time (the scanner's caches are not shared safely)."""


class WatchService:
    """The followers of every watched workspace's transcripts, for one database."""

    def __init__(self, view: Callable[[], Sidecar], audience: Audience,
                 spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]] | None = None) -> None:
        """``view`` makes the watcher's view of the store; ``spawn`` runs its loop as a task its owner stops."""
        self.importer = TailImporter(view, audience)
        self._spawn = spawn or (lambda work: asyncio.get_running_loop().create_task(work))
        self.watches: dict[WatchKey, Watch] = {}
        self.tails: dict[Path, Tail] = {}
        self.by_owner: dict[object, dict[str, WatchKey]] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._looked = asyncio.Event()
        """Set after each look at the followed files (for ``caught_up``)."""

    # Requests

    async def watch(self, owner: object, params: WatchParams, extra: tuple[str, ...] = (),
                    cwd: str | None = None) -> WatchResult:
        """Start (or, with ``watch: false``, stop) ``owner``'s watch of a workspace; what it follows now."""
        if not params.workspace.strip():
            raise invalid_params("workspace must be a directory path", "workspace")
        base = Path(cwd or os.getcwd())
        workspace = workspace_key(str(base / Path(params.workspace).expanduser()))
        if params.watch is False:
            self._release(owner, workspace)
            return WatchResult(workspace=workspace, watching=False, transcripts=[], directories=[])
        env = self._env(params.env)
        directories = [*(params.directories or ()), *extra]
        if len(directories) > MAX_DIRECTORIES:
            raise invalid_params(f"at most {MAX_DIRECTORIES} directories", "directories")
        for index, directory in enumerate(params.directories or ()):
            if not directory.strip():
                raise invalid_params("a directory must be a non-empty path", f"directories[{index}]")
        found = tuple(sources(workspace, env, [str(base / Path(d).expanduser()) for d in directories]))
        key: WatchKey = (workspace, found)
        if self.by_owner.get(owner, {}).get(workspace) != key:
            self._release(owner, workspace)
        watch = self.watches.get(key)
        created = watch is None
        if watch is None:
            watch = self.watches[key] = Watch(key, Scanner(workspace, list(found)))
        asked_before = owner in watch.owners
        watch.owners.add(owner)  # before the scan: a watch is never without the connections it is for
        watch.ends_at = None
        self.by_owner.setdefault(owner, {})[workspace] = key
        # A watch that was going already is looked at again too: the answer names the files there now, not those of
        # the last look (up to SCAN_SECONDS old), whoever asked first.
        try:
            await self._scan(watch)
        except BaseException:  # cancelled (or failed) while listing: the request did not happen
            if not asked_before:
                self._release(owner, workspace)
            self._start()  # which ends the watch once it lingered, unless another connection asked meanwhile
            raise
        if created:
            log.info("watching %s: %d transcripts in %d directories", workspace, len(watch.files), len(found))
        self._start()
        return self.result(watch)

    async def caught_up(self, workspace: str, timeout: float) -> bool:
        """Wait, at most ``timeout`` s, until each transcript watched for the workspace has been read once.

        The memory tools over a workspace wait for this, so that the earlier sessions a watch just found are in
        the answer; whether they all were.
        """
        key = workspace_key(workspace)
        deadline = time.monotonic() + timeout
        while any(tail.workspace == key and not tail.imported and tail.problem is None and not tail.follower.waiting
                  for tail in self.tails.values()):
            left = deadline - time.monotonic()
            if left <= 0 or self._task is None or self._task.done():
                return False
            self._looked.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._looked.wait(), left)
        return True

    def result(self, watch: Watch) -> WatchResult:
        """What a watch follows, as memory/watch answers."""
        states = []
        for path, agent in sorted(watch.files.items(), key=lambda item: str(item[0])):
            tail = self.tails.get(path)
            if tail is None:
                continue
            state = "error" if tail.problem else "skipped" if tail.skipped else "waiting" if tail.follower.waiting \
                else "following" if tail.imported else "queued"
            states.append(WatchedTranscript(path=str(path), agent=agent, state=state, session_id=tail.follower.session,
                                            problem=tail.problem or tail.skipped or tail.follower.waiting))
        directories = [WatchedDirectory(path=str(state.source.path), agent=state.source.agent, exists=state.exists,
                                        problem=state.problem) for state in watch.scanner.states]
        return WatchResult(workspace=watch.key[0], watching=True, transcripts=states, directories=directories,
                           connections=len(watch.owners))

    def drop(self, owner: object) -> None:
        """A connection ended: its watches end with it."""
        for workspace in list(self.by_owner.get(owner, {})):
            self._release(owner, workspace)

    async def close(self) -> None:
        """Stop following everything."""
        self.watches.clear()
        self.tails.clear()
        self.by_owner.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @staticmethod
    def _env(given: Mapping[str, str] | None) -> dict[str, str]:
        """The client's agent variables (only this process's HOME besides); this process's without ``env``."""
        own = agent_env()
        if given is None:
            return own
        for name, value in given.items():
            if not isinstance(value, str):
                raise invalid_params("env values must be strings", f"env.{name}")
        # A client sends the variables it has set: one it left out is unset there, not to be taken from here.
        home = {"HOME": own["HOME"]} if "HOME" in own else {}
        return {**home, **{name: value for name, value in given.items() if name in ENV_NAMES and value}}

    def _release(self, owner: object, workspace: str) -> None:
        key = self.by_owner.get(owner, {}).pop(workspace, None)
        if not self.by_owner.get(owner, True):
            del self.by_owner[owner]
        watch = self.watches.get(key) if key is not None else None
        if watch is None:
            return
        watch.owners.discard(owner)
        if not watch.owners:
            watch.ends_at = time.monotonic() + LINGER_SECONDS

    def _end(self, watch: Watch) -> None:
        del self.watches[watch.key]
        for path in watch.files:
            self._untail(path, watch.key)
        log.info("no longer watching %s", watch.key[0])

    def _untail(self, path: Path, key: WatchKey) -> None:
        tail = self.tails.get(path)
        if tail is None:
            return
        tail.watches.discard(key)
        if not tail.watches:
            del self.tails[path]

    # Following

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = self._spawn(self._run())
        self._wake.set()

    async def _run(self) -> None:
        """Look at the watched directories and files until nothing is watched."""
        while self.watches:
            self._wake.clear()
            now = time.monotonic()
            for watch in list(self.watches.values()):
                if watch.ends_at is not None and now >= watch.ends_at:
                    self._end(watch)
                elif now >= watch.next_scan:
                    await self._scan(watch)
            await self._follow()
            self._looked.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL_SECONDS)

    async def _scan(self, watch: Watch) -> None:
        """List the watch's directories again (in a thread: a first look reads each rollout's first line)."""
        async with watch.scanning:  # a request's look and the loop's share the scanner; the later one's files count
            watch.next_scan = time.monotonic() + SCAN_SECONDS
            files = await asyncio.to_thread(watch.scanner.scan)
        if self.watches.get(watch.key) is not watch:
            return  # released while the directories were listed
        for path in set(watch.files) - set(files):
            log.info("%s is no longer there; not followed any more", path)
            self._untail(path, watch.key)
        for path, agent in files.items():
            tail = self.tails.get(path)
            if tail is None:
                tail = self.tails[path] = self.importer.tail(path, agent, watch.key[0])
            tail.watches.add(watch.key)
        watch.files = files

    async def _follow(self) -> None:
        """Import the files that changed, newest change first, for at most TICK_BUDGET seconds."""
        changed = [tail for tail in self.tails.values() if tail.follower.changed()]
        changed.sort(key=_newest_first)
        deadline = time.monotonic() + TICK_BUDGET
        for tail in changed:
            if self.tails.get(tail.path) is not tail:
                continue  # released meanwhile
            try:
                step = await tail.follower.step()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # a file we cannot store must not stop the others
                message = error.message if isinstance(error, SidecarError) else f"{type(error).__name__}: {error}"
                if tail.problem != message:
                    log.warning("%s not imported: %s", tail.path, message)
                tail.problem = message
                continue
            for note in step.notes:
                log.info("%s", note)
            if time.monotonic() > deadline:
                break


def _newest_first(tail: Tail) -> float:
    try:
        return -os.stat(tail.path).st_mtime
    except OSError:
        return 0.0


