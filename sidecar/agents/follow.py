"""``context-sidecar import --follow``: tail a transcript an agent is writing, importing each new entry."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path

import attrs

from protocol.types import ImportResult
from sidecar.client import SidecarClient, SidecarRequestError

POLL_SECONDS = 0.2
"""How often the file is looked at: new entries are stored well within a second of being written."""


@attrs.define
class Step:
    """What one look at the file found and did."""

    stored: int = 0
    replaced: int = 0
    skipped: list[str] = attrs.field(factory=list)
    """Skip reasons not reported before."""
    notes: list[str] = attrs.field(factory=list)
    """What happened to the file: missing, back, truncated, replaced."""


@attrs.define
class Follower:
    """Polls one file (stat, then memory/import when it changed); ids are stable, so restarts duplicate nothing.

    Each change re-reads the whole file through ``memory/import`` with ``follow: true``: a half-written last
    line waits for its end, a truncated or replaced file is read again from its start, and what is already
    stored is recognised by id (a stand-in result is replaced once the real one is written).
    """

    client: SidecarClient
    path: Path
    session: str | None = None
    format: str = "auto"
    _seen: tuple[int, int, int] | None = None
    _missing: bool = False
    _reported: set[str] = attrs.field(factory=set)
    _waiting: str | None = None
    last: ImportResult | None = None

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
        if seen == self._seen:
            return step
        if self._seen is not None and seen[0] != self._seen[0]:
            step.notes.append(f"{self.path} was replaced (a new file); reading it from the start")
        elif self._seen is not None and seen[1] < self._seen[1]:
            step.notes.append(f"{self.path} was truncated; reading it from the start")
        self._seen = seen
        try:
            result = await self.client.import_transcript(str(self.path), self.session, self.format, follow=True)
        except SidecarRequestError as error:
            if not any(text in str(error) for text in ("no messages could be read", "cannot tell the transcript")):
                raise
            # Nothing to store yet (a header, harness lines, a half line): said once, then the next change.
            if self._waiting is None:
                step.notes.append(f"nothing to import yet, waiting for more: {error.message}")
            self._waiting = error.message
            return step
        self._waiting = None
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
