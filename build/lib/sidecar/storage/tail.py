"""The newest context items of recently read sessions, kept in memory so an active session's reads touch no rows.

Entries are valid for one session revision: ingest appends to an entry (its rows are known), every other
change of the context (a compaction, a delete) bumps the revision and so retires the entry.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Sequence

import attrs

from sidecar.rows import ItemRow

MAX_SESSIONS = 8
SLACK_ITEMS = 512
"""Items kept beyond the longest suffix served recently: appends push the needed window forward only slowly."""


@attrs.define
class _Entry:
    revision: int
    items: list[ItemRow]
    prefix: list[int]
    """prefix[i]: raw tokens of items[:i]."""
    complete: bool
    """items start at the first item of the context."""
    served: int = 0
    """The longest suffix served since the entry was filled or trimmed."""


class TailCache:
    """Per session, a chronological suffix of the context items, with prefix sums for covering queries."""

    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self.max_sessions = max_sessions

    def get(self, session_id: str, revision: int, min_tokens: int,
            min_count: int) -> tuple[list[ItemRow], bool] | None:
        """The shortest cached suffix holding ``min_tokens`` and ``min_count`` (all, if complete); None on a miss."""
        entry = self._entries.get(session_id)
        if entry is None:
            return None
        if entry.revision != revision:
            del self._entries[session_id]
            return None
        total = entry.prefix[-1]
        start = min(bisect.bisect_right(entry.prefix, total - min_tokens) - 1, len(entry.items) - min_count)
        if start < 0:
            if not entry.complete:
                return None
            start = 0
        self._entries.move_to_end(session_id)
        entry.served = max(entry.served, len(entry.items) - start)
        return entry.items[start:], entry.complete and start == 0

    def after(self, session_id: str, revision: int, position: int) -> list[ItemRow] | None:
        """The cached items newer than ``position``; None on a miss or when the entry starts after it."""
        entry = self._entries.get(session_id)
        if entry is None or entry.revision != revision or not entry.items:
            return None
        if entry.items[0].position > position and not entry.complete:
            return None
        start = bisect.bisect_right(entry.items, position, key=lambda item: item.position)
        return entry.items[start:]

    def put(self, session_id: str, revision: int, items: list[ItemRow], complete: bool) -> None:
        """Remember a session's newest items as read at ``revision``."""
        prefix = [0]
        for item in items:
            prefix.append(prefix[-1] + item.tokens)
        self._entries[session_id] = _Entry(revision, list(items), prefix, complete, len(items))
        self._entries.move_to_end(session_id)
        while len(self._entries) > self.max_sessions:
            self._entries.popitem(last=False)

    def append(self, session_id: str, revision: int, new_revision: int, items: Sequence[ItemRow]) -> None:
        """Items ingested at the end of the context, taking it from ``revision`` to ``new_revision``."""
        entry = self._entries.get(session_id)
        if entry is None:
            return
        if entry.revision != revision:
            del self._entries[session_id]
            return
        for item in items:
            entry.items.append(item)
            entry.prefix.append(entry.prefix[-1] + item.tokens)
        entry.revision = new_revision
        keep = entry.served + SLACK_ITEMS
        if len(entry.items) > 2 * keep:
            cut = len(entry.items) - keep
            base = entry.prefix[cut]
            del entry.items[:cut]
            entry.prefix = [tokens - base for tokens in entry.prefix[cut:]]
            entry.complete = False
            entry.served = 0

    def rebase(self, session_id: str, revision: int, new_revision: int) -> None:
        """The context went from ``revision`` to ``new_revision`` with the same items (a prune step)."""
        entry = self._entries.get(session_id)
        if entry is not None:
            if entry.revision == revision:
                entry.revision = new_revision
            else:
                del self._entries[session_id]

    def drop(self, session_id: str | None = None) -> None:
        """Forget one session's entry, or all."""
        if session_id is None:
            self._entries.clear()
        else:
            self._entries.pop(session_id, None)
