"""Reads of a session's context built on ``items`` alone, the same for every backend: the tail, what is new, all."""

from __future__ import annotations

from collections.abc import Callable

from sidecar.rows import ItemRow, SessionRow
from sidecar.storage.tail import TailCache


class ContextReads:
    """Mixin of a store: the newest items of a context through its ``TailCache``; ``items`` reads the rows."""

    _tails: TailCache
    items: Callable[..., list[ItemRow]]

    def tail(self, session: SessionRow, min_tokens: int, min_count: int,
             before: int | None = None) -> tuple[list[ItemRow], bool]:
        """The newest items (older than ``before``) covering ``min_tokens`` and ``min_count``; and whether
        they reach the start of the context."""
        if session.last_position is None:
            return [], True
        if before is None:
            cached = self._tails.get(session.session_id, session.revision, min_tokens, min_count)
            if cached is not None:
                return cached
        upto = session.last_position if before is None else before - 1
        # Positions are global, so a session's items may be spread out; start from its average density.
        average = session.context_tokens / max(1, session.context_count)
        span = (session.last_position - (session.first_position or 0) + 1) / max(1, session.context_count)
        window = int(max(min_tokens / max(average, 1.0), min_count, 64) * 1.25 * span)
        found: list[ItemRow] = []
        tokens = 0
        while True:
            after = upto - window
            complete = after < (session.first_position or 0)
            chunk = self.items(session, None if complete else after, upto)
            found = chunk + found
            tokens += sum(item.tokens for item in chunk)
            if complete or (tokens >= min_tokens and len(found) >= min_count):
                if before is None:
                    self._tails.put(session.session_id, session.revision, found, complete)
                return found, complete
            upto = after
            window *= 4

    def items_after(self, session: SessionRow, position: int) -> list[ItemRow]:
        """The context items newer than ``position``: from the tail cache when it holds them."""
        cached = self._tails.after(session.session_id, session.revision, position)
        return cached if cached is not None else self.items(session, after=position)

    def context(self, session: SessionRow) -> list[ItemRow]:
        """The session's whole current context, in order; from the tail cache when it holds all of it."""
        if session.first_position is None or session.last_position is None:
            return []
        cached = self._tails.get(session.session_id, session.revision, session.context_tokens + 1,
                                 session.context_count + 1)
        if cached is not None and cached[1] and len(cached[0]) == session.context_count:
            return cached[0]
        return self.items(session)

