"""memory/watch: the host follows a workspace's agent transcripts for as long as a connection asks.

One follower per file however many connections watch it (each file counts the watches that include it, each watch
the connections that asked); a connection that ends stops its watches. Each file is read in a thread (parsing a
multi-MB transcript takes the interpreter for a while, and the host's other clients wait for nothing but the
interpreter's turns) and stored on the event loop, where every use of the store is; only the messages whose
conversion changed since the last read are looked up and written. New files are found by listing the agents'
directories again, newest changes first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from protocol.types import (
    ImportParams,
    ImportResult,
    ReportUsageParams,
    Usage,
    WatchedDirectory,
    WatchedTranscript,
    WatchParams,
    WatchResult,
)
from sidecar.agents.discovery import Scanner, Source, sources
from sidecar.agents.follow import Follower, NothingYet, nothing_yet
from sidecar.agents.locations import ENV_NAMES, agent_env
from sidecar.config.paths import workspace_key
from sidecar.services import context, transcripts
from sidecar.services.errors import SidecarError, invalid_params
from sidecar.services.state import Sidecar

if TYPE_CHECKING:
    from sidecar.storage import Storage

log = logging.getLogger(__name__)

POLL_SECONDS = 0.2
"""How often followed files are looked at (a stat each)."""
SCAN_SECONDS = 1.0
"""How often the agents' directories are looked at for new files (a stat per directory; listed when changed)."""
TICK_BUDGET = 0.5
"""Seconds of imports per look before the next one: a backlog of earlier sessions does not hold up live ones."""
WHOLE_READ_SECONDS = 30.0
"""A growing file is read from where its last turn started, and whole again at most this often: what the window
reads converges on what a whole read stores, and the whole read settles anything it could not see."""
MAX_DIRECTORIES = 32
"""Directories one watch may name."""


class Audience(Protocol):
    """The connections to tell about the sessions the watcher changes: the host's, or a lone server's client."""

    def push_usage(self, usage: Usage) -> None:
        """context/didChangeUsage to every connection following the session."""

    def notify_session(self, session_id: str, method: str, params: Any) -> None:
        """A notification about the session to every connection following it."""

    def settle_later(self) -> None:
        """Checkpoint when requests pause."""


WatchKey = tuple[str, tuple[Source, ...]]


@attrs.define(eq=False)
class Tail:
    """One transcript file, followed once for every watch that includes it."""

    path: Path
    agent: str
    workspace: str
    follower: Follower
    watches: set[WatchKey] = attrs.field(factory=set)
    known: dict[str, str] | None = None
    """Fingerprints of the messages the last read stored (see ``transcripts.store``)."""
    reported: tuple[str, str] | None = None
    """The message whose provider usage was last reported, with that usage."""
    problem: str | None = None
    imported: bool = False
    skipped: str | None = None
    """Why the file is not imported although it reads well (its session is another client's)."""
    resume: transcripts.Resume | None = None
    """Where the next read may start; None: read the whole file."""
    whole_read_at: float = 0.0
    pending: list[transcripts.Found] = attrs.field(factory=list)
    """Compactions found but not recorded yet (a compaction of the session was running): tried again."""


@attrs.define(eq=False)
class Watch:
    """A workspace's transcripts in one set of directories, followed for the connections that asked."""

    key: WatchKey
    scanner: Scanner
    owners: set[object] = attrs.field(factory=set)
    files: dict[Path, str] = attrs.field(factory=dict)
    next_scan: float = 0.0


class WatchService:
    """The followers of every watched workspace's transcripts, for one database."""

    def __init__(self, view: Callable[[], Sidecar], audience: Audience,
                 spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]] | None = None) -> None:
        """``view`` makes the watcher's view of the store; ``spawn`` runs its loop as a task its owner stops."""
        self._view = view
        self._sidecar: Sidecar | None = None
        self.audience = audience
        self._spawn = spawn or (lambda work: asyncio.get_running_loop().create_task(work))
        self.watches: dict[WatchKey, Watch] = {}
        self.tails: dict[Path, Tail] = {}
        self.by_owner: dict[object, dict[str, WatchKey]] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._looked = asyncio.Event()
        """Set after each look at the followed files (for ``caught_up``)."""
        self._runner: Any = None

    @property
    def sidecar(self) -> Sidecar:
        """The watcher's own view of the store (its own settings; sessions and their runtime state shared)."""
        if self._sidecar is None:
            self._sidecar = self._view()
        return self._sidecar

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
        if watch is None:
            watch = self.watches[key] = Watch(key, Scanner(workspace, list(found)))
            await self._scan(watch)
            log.info("watching %s: %d transcripts in %d directories", workspace, len(watch.files), len(found))
        watch.owners.add(owner)
        self.by_owner.setdefault(owner, {})[workspace] = key
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
        """The client's agent variables; this process's for those it did not send."""
        own = agent_env()
        if given is None:
            return own
        for name, value in given.items():
            if not isinstance(value, str):
                raise invalid_params("env values must be strings", f"env.{name}")
        return {**own, **{name: value for name, value in given.items() if name in ENV_NAMES and value}}

    def _release(self, owner: object, workspace: str) -> None:
        key = self.by_owner.get(owner, {}).pop(workspace, None)
        if not self.by_owner.get(owner, True):
            del self.by_owner[owner]
        watch = self.watches.get(key) if key is not None else None
        if watch is None:
            return
        watch.owners.discard(owner)
        if watch.owners:
            return
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
                if now >= watch.next_scan:
                    await self._scan(watch)
            await self._follow()
            self._looked.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL_SECONDS)

    async def _scan(self, watch: Watch) -> None:
        """List the watch's directories again (in a thread: a first look reads each rollout's first line)."""
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
                tail = self.tails[path] = Tail(path, agent, watch.key[0], Follower(_unset, path))
                tail.follower.importer = self._importer(tail)
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

    def _importer(self, tail: Tail) -> Callable[[Path, str | None, str], Coroutine[Any, Any, ImportResult]]:
        async def run(path: Path, session: str | None, fmt: str) -> ImportResult:
            return await self._import(tail, path, session, fmt)

        return run

    async def _import(self, tail: Tail, path: Path, session: str | None, fmt: str) -> ImportResult:
        """Read the file in a thread and store what changed; tell the connections following its session."""
        if tail.skipped is not None:
            raise NothingYet(tail.skipped)  # a proxy writes this conversation: the file is not read again
        params = ImportParams(path=str(path), session_id=session, format=fmt, follow=True)
        if session is not None and tail.imported and self.sidecar.store().session(session) is None:
            tail.known, tail.resume = None, None  # deleted meanwhile (memory/deleteSession): stored again whole
        start = tail.resume if time.monotonic() - tail.whole_read_at < WHOLE_READ_SECONDS else None
        if start is not None and not await asyncio.to_thread(start.still_there, path):
            start = None  # rewritten in place: read it whole
        read = await self._read(path, params, start)
        if read.window and (read.parsed.incomplete or any(c.upto is None for c in read.parsed.compactions)):
            read = await self._read(path, params, None)  # the window lacks what a compaction kept
        if not read.window:
            tail.whole_read_at = time.monotonic()
        tail.resume = read.resume
        sidecar = self.sidecar
        sidecar.workspace = tail.workspace
        proxied = proxy_session(sidecar.store(), read.session_id)
        if proxied is not None:
            # The proxy stores this conversation as it passes, with ids of its own: under the agent's session id, or
            # as a branch of it when this file was imported first. What was imported stays; no more is.
            log.info("%s is not followed any more: context-sidecar proxy writes its conversation (session %s)",
                     path, proxied)
            tail.skipped = f"context-sidecar proxy writes this conversation (session {proxied}); not imported"
            raise NothingYet(tail.skipped)
        stored = transcripts.store(sidecar, read, tail.known)
        first = not tail.imported
        tail.known = {**(tail.known or {}), **read.fingerprints}
        tail.problem, tail.imported = None, True
        result = stored.result
        changed = first or len(result.ids) - result.duplicates > 0
        found = [*tail.pending, *stored.compactions]
        if found:
            _, recorded = await transcripts.record_found(self._compactions(), found)
            tail.pending = [item for item in found if item not in recorded and item.upto is not None]
        reported = self._provider_usage(tail, read)
        if changed or reported or found:
            self.audience.settle_later()
            self.audience.push_usage(sidecar.usage(sidecar.session(result.session_id)))
        return result

    @staticmethod
    async def _read(path: Path, params: ImportParams, start: transcripts.Resume | None) -> transcripts.Read:
        """Read the file (from ``start``, or whole) in a thread; NothingYet when it holds nothing to import yet."""
        try:
            return await asyncio.to_thread(transcripts.read, path, params, start, True)
        except SidecarError as error:
            if nothing_yet(error.message):
                raise NothingYet(error.message) from None
            raise

    def _provider_usage(self, tail: Tail, read: transcripts.Read) -> bool:
        """Report the usage the provider counted for the transcript's last message, when that is an assistant's.

        That figure is the agent's real context: what its last call sent plus what it answered. Until a message
        follows, usage shows it (``source: provider``); then the estimate, calibrated by it, takes over.
        """
        last = read.parsed.messages[-1]
        counted = (last.get("metadata") or {}).get("usage")
        if last["role"] != "assistant" or not isinstance(counted, dict):
            return False
        key = (last["id"], json.dumps(counted, sort_keys=True))
        if tail.reported == key:
            return False
        tail.reported = key
        sidecar = self.sidecar
        session = sidecar.session(read.session_id)
        stored = sidecar.store().messages_by_id(read.session_id, [last["id"]]).get(last["id"])
        if stored is None or session.last_position != stored.seq:
            return False  # not the newest message stored (another file's, or an older branch)
        # The provider counted the context before the answer: that is the basis of the calibration sample.
        sidecar.runtime.of(session.session_id).note_assembled(session.revision,
                                                              max(0.0, session.context_tokens - stored.tokens))
        usage = context.report_usage(sidecar, ReportUsageParams(
            session_id=session.session_id, input_tokens=int(counted.get("input", 0)),
            output_tokens=int(counted.get("output", 0)), cache_read_tokens=int(counted.get("cacheRead", 0)),
            cache_write_tokens=int(counted.get("cacheWrite", 0))))
        return usage is not None

    def _compactions(self) -> Any:
        """The compaction runner of the watcher's own view: records what the transcripts hold, tells the audience."""
        if self._runner is None:
            from sidecar.services.compaction.runner import CompactionRunner

            self._runner = CompactionRunner(_Peer(self))
        return self._runner


async def _unset(path: Path, session: str | None, fmt: str) -> ImportResult:
    raise RuntimeError("a tail's importer is set when it is made")


def _newest_first(tail: Tail) -> float:
    try:
        return -os.stat(tail.path).st_mtime
    except OSError:
        return 0.0


class _Peer:
    """The compaction runner's client, for the compactions found in transcripts: the audience hears of them."""

    def __init__(self, service: WatchService) -> None:
        self.service = service

    @property
    def sidecar(self) -> Sidecar:
        return self.service.sidecar

    def notify_in_order(self, method: str, params: Any) -> None:
        """No client of its own."""

    def push_session_usage(self, usage: Usage) -> None:
        self.service.audience.push_usage(usage)

    def notify_session(self, session_id: str, method: str, params: Any) -> None:
        self.service.audience.notify_session(session_id, method, params)

    async def ask(self, method: str, params: Any, timeout: float) -> Any:
        raise TimeoutError  # never asked: the watcher's view declares no compaction hooks

    def begin_progress(self, token: Any, title: str, message: str, on_cancel: Callable[[], None]) -> None:
        """No progress to report."""

    def report_progress(self, token: Any, message: str, percentage: int) -> None:
        """No progress to report."""

    def end_progress(self, token: Any, message: str) -> None:
        """No progress to report."""

    def settle_later(self) -> None:
        self.service.audience.settle_later()

    def run_in_background(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(work)


def proxy_session(store: Storage, session_id: str) -> str | None:
    """The session context-sidecar proxy writes an agent's conversation to: the agent's own session id, or a branch
    of it (``<id>~…``, made when the proxy found the session imported from the transcript first); None when none."""
    for candidate in (session_id, *store.session_ids(session_id + "~")):
        found = store.session(candidate)
        if found is not None and (found.metadata or {}).get("proxy"):
            return candidate
    return None
