"""Following a transcript an agent is writing: look at the file, import it again when it changed.

One machinery for ``context-sidecar import --follow`` (importing through a client) and the host's followers of a
workspace's transcripts (``memory/watch``, importing in the host itself): the caller gives the import.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs

from protocol.types import ImportResult

POLL_SECONDS = 0.2
"""How often a file is looked at: new entries are stored well within a second of being written."""
RETRY_SECONDS = 30.0
"""How long a file whose import failed waits, unchanged, before it is tried again (a change is tried at once)."""
_NOTHING_YET = ("no messages could be read", "cannot tell the transcript")
"""What an import says of a file that holds no entry yet (a header, harness lines, a half line)."""


class NothingYet(Exception):
    """The file holds nothing to import yet; the import says why."""


def nothing_yet(message: str) -> bool:
    """Whether an import's error means the file holds nothing to import yet (rather than a real failure)."""
    return any(text in message for text in _NOTHING_YET)


Import = Callable[[Path, str | None, str], Awaitable[ImportResult]]
"""Imports the file (path, session id or None for the transcript's own, format) with ``follow: true``, so that a
last line without its newline waits; raises NothingYet when the file holds nothing to import yet."""


@attrs.define
class Step:
    """What one look at the file found and did."""

    stored: int = 0
    replaced: int = 0
    skipped: list[str] = attrs.field(factory=list)
    """Skip reasons not reported before."""
    notes: list[str] = attrs.field(factory=list)
    """What happened to the file: missing, back, truncated, replaced."""
    imported: bool = False
    """Whether the file was imported (it changed since the last look)."""


@attrs.define
class Follower:
    """Polls one file (stat, then the import when it changed); ids are stable, so restarts duplicate nothing.

    Each change imports the file again: a half-written last line waits for its end, a truncated or replaced file is
    read again from its start, and what is already stored is recognised by id (a stand-in result is replaced once
    the real one is written).
    """

    importer: Import
    path: Path
    session: str | None = None
    format: str = "auto"
    _seen: tuple[int, int, int] | None = None
    _missing: bool = False
    _reported: set[str] = attrs.field(factory=set)
    _retry_at: float | None = None
    """After a failed import: when to try the unchanged file again."""
    waiting: str | None = None
    """Why the file holds nothing to import yet, until it does."""
    last: ImportResult | None = None

    def changed(self) -> bool:
        """Whether a look now would import (the file's inode, size or time changed, it went or came back, or a
        failed import is due again)."""
        try:
            info = os.stat(self.path)
        except OSError:
            return not self._missing
        return self._missing or (info.st_ino, info.st_size, info.st_mtime_ns) != self._seen or self._retry_due()

    def _retry_due(self) -> bool:
        return self._retry_at is not None and time.monotonic() >= self._retry_at

    async def step(self) -> Step:
        """Look at the file once; import it when it changed since the last look."""
        step = Step()
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            if not self._missing:
                self._missing = True
                step.notes.append(f"{self.path} is gone (deleted or moved); waiting for it to come back")
            return step
        if self._missing:
            self._missing = False
            step.notes.append(f"{self.path} is back; reading it from the start")
            self._seen = None
        seen = (info.st_ino, info.st_size, info.st_mtime_ns)
        if seen == self._seen and not self._retry_due():
            return step
        if self._seen is not None and seen[0] != self._seen[0]:
            step.notes.append(f"{self.path} was replaced (a new file); reading it from the start")
        elif self._seen is not None and seen[1] < self._seen[1]:
            step.notes.append(f"{self.path} was truncated; reading it from the start")
        self._seen, self._retry_at = seen, None
        step.imported = True
        try:
            result = await self.importer(self.path, self.session, self.format)
        except NothingYet as error:
            if self.waiting is None:
                step.notes.append(f"nothing to import yet, waiting for more: {error}")
            self.waiting = str(error)
            return step
        except asyncio.CancelledError:
            self._seen = None  # not imported: the next look tries again
            raise
        except Exception:
            # Not imported. Reading the whole file again at every look would only fail again (a multi-MB file
            # takes the host's CPU for that): it is tried again when it changes, or after a while.
            self._retry_at = time.monotonic() + RETRY_SECONDS
            raise
        self.waiting = None
        self.session, self.format, self.last = result.session_id, result.format, result
        step.stored = len(result.ids) - result.duplicates - (result.replaced or 0)
        step.replaced = result.replaced or 0
        step.skipped = [reason for reason in result.skipped if reason not in self._reported]
        self._reported.update(step.skipped)
        return step

    async def run(self, report: Callable[[Step], None], poll: float = POLL_SECONDS,
                  stop: asyncio.Event | None = None) -> None:
        """Step every ``poll`` seconds until ``stop`` is set (after the step under way) or the task is cancelled."""
        stop = stop or asyncio.Event()
        while not stop.is_set():
            report(await self.step())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), poll)
