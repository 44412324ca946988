"""Positions for a host's ingests: blocks drawn from the team database's sequence, and a reserve for when it is away.

Each ``nextval('positions')`` is the start of a block of ``BLOCK`` positions (the sequence counts in blocks), so
a host draws a statement's worth per block, and keeps a block in reserve so that ingests spooled while the
server is away (``spool.py``) get their real positions at once. A host's positions only grow, so the messages it
ingests into a session are in order.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from sidecar.rows import StorageUnavailable

BLOCK = 65536
"""Positions per nextval (the sequence's increment, migration 001): a minute's spool at 1,000 messages a second
fits the reserve."""


class Positions:
    """The host's blocks of positions."""

    def __init__(self, draw: Callable[[], int]) -> None:
        self._draw = draw
        """One nextval: the first position of a new block (StorageUnavailable when the server is away)."""
        self._blocks: list[tuple[int, int]] = []
        """(next, end) of the blocks held, oldest first."""
        self._lock = threading.Lock()

    def _held(self) -> int:
        return sum(end - start for start, end in self._blocks)

    def take(self, count: int) -> list[int]:
        """``count`` new positions, in increasing order; a block is drawn when fewer than a block is held."""
        with self._lock:
            while self._held() < count + BLOCK:
                try:
                    start = self._draw()
                except StorageUnavailable:
                    if self._held() >= count:
                        break  # away: the reserve serves
                    raise
                self._blocks.append((start, start + BLOCK))
            taken: list[int] = []
            while len(taken) < count:
                start, end = self._blocks[0]
                used = min(end - start, count - len(taken))
                taken += range(start, start + used)
                if start + used == end:
                    self._blocks.pop(0)
                else:
                    self._blocks[0] = (start + used, end)
            return taken
