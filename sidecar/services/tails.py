"""One transcript the host follows: read in a thread (from where its last turn started, whole now and then),
stored on the event loop (only the messages whose conversion changed), its provider usage reported and its
compactions recorded, and the connections that follow its session told."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from protocol.types import ImportParams, ImportResult, ReportUsageParams, Usage
from sidecar.agents.discovery import Source
from sidecar.agents.follow import Follower, NothingYet, nothing_yet
from sidecar.services import context, transcripts
from sidecar.services.errors import SidecarError
from sidecar.services.state import Sidecar

if TYPE_CHECKING:
    from sidecar.storage.interface import Store

log = logging.getLogger(__name__)

WHOLE_READ_SECONDS = 30.0
"""A growing file is read from where its last turn started, and whole again at most this often: what the window
reads converges on what a whole read stores, and the whole read settles anything it could not see."""


class Audience(Protocol):
    """The connections to tell about the sessions the watcher changes: the host's, or a lone server's client."""

    def push_usage(self, usage: Usage) -> None:
        """context/didChangeUsage to every connection following the session."""

    def notify_session(self, session_id: str, method: str, params: Any) -> None:
        """A notification about the session to every connection following it."""

    def settle_later(self) -> None:
        """Checkpoint when requests pause."""


WatchKey = tuple[str, tuple[Source, ...]]
"""A watch: its workspace and the directories it looks in."""


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


class TailImporter:
    """Imports followed transcripts into the watcher's own view of the store, and tells the audience."""

    def __init__(self, view: Callable[[], Sidecar], audience: Audience) -> None:
        """``view`` makes the watcher's view of the store (made on first use)."""
        self._view = view
        self._sidecar: Sidecar | None = None
        self.audience = audience
        self._runner: Any = None

    @property
    def sidecar(self) -> Sidecar:
        """The watcher's own view of the store (its own settings; sessions and their runtime state shared)."""
        if self._sidecar is None:
            self._sidecar = self._view()
        return self._sidecar

    def tail(self, path: Path, agent: str, workspace: str) -> Tail:
        """A new tail of ``path``, its follower importing through this importer."""
        tail = Tail(path, agent, workspace, Follower(_unset, path))

        async def run(path: Path, session: str | None, fmt: str) -> ImportResult:
            return await self.run(tail, path, session, fmt)

        tail.follower.importer = run
        return tail

    async def run(self, tail: Tail, path: Path, session: str | None, fmt: str) -> ImportResult:
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
        existing = sidecar.store().session(read.session_id)
        if existing is not None and (existing.metadata or {}).get("piSessionId"):
            # The pi extension stores this conversation as it goes, a branch rewound with /tree as a session of its
            # own: an import of the file would append the branch pi is on now to the line it left.
            if tail.skipped is None:
                log.info("%s is not followed: the context-sidecar pi extension writes its conversation (session %s)",
                         path, read.session_id)
            tail.skipped = f"the context-sidecar pi extension writes this conversation (session {read.session_id}); " \
                "not imported"
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


class _Peer:
    """The compaction runner's client, for the compactions found in transcripts: the audience hears of them."""

    def __init__(self, service: TailImporter) -> None:
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

    def summary_asker(self, session_id: str) -> None:
        """It only records the agents' own compactions: no summary calls."""
        return None


def proxy_session(store: Store, session_id: str) -> str | None:
    """The session context-sidecar proxy writes an agent's conversation to: the agent's own session id, or a branch
    of it (``<id>~…``, made when the proxy found the session imported from the transcript first); None when none."""
    for candidate in (session_id, *store.session_ids(session_id + "~")):
        found = store.session(candidate)
        if found is not None and (found.metadata or {}).get("proxy"):
            return candidate
    return None
