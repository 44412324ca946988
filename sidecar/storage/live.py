"""A session's live messages added to its stored row: the one sum both backends make when they read a session."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import attrs

from sidecar.rows import SessionRow


def with_live(stored: SessionRow, count: int, tokens: int, prunable_count: int, prunable_tokens: int,
              first: int | None, last: int | None, latest: datetime | None) -> SessionRow:
    """The stored row plus its live messages (``seq > live_after``: ``count`` of them, ``tokens``, ...)."""
    if not count:
        return stored
    assert first is not None and last is not None and latest is not None
    return attrs.evolve(
        stored, message_count=stored.message_count + count, context_count=stored.context_count + count,
        context_tokens=stored.context_tokens + tokens, prunable_count=stored.prunable_count + prunable_count,
        prunable_tokens=stored.prunable_tokens + prunable_tokens,
        first_position=first if stored.first_position is None else min(first, stored.first_position),
        last_position=last if stored.last_position is None else max(last, stored.last_position),
        revision=stored.revision + count, updated_at=max(latest, stored.updated_at), live_count=count)


SESSION_COLUMNS = ", ".join(f.name for f in attrs.fields(SessionRow) if f.name != "live_count")
"""The stored columns of a session, in SessionRow's order (``live_count`` is counted, not stored)."""


def session_from_row(row: Sequence[Any]) -> SessionRow:
    """A session row read as ``SESSION_COLUMNS`` (its metadata stored as JSON text)."""
    values = list(row)
    metadata_index = 4
    values[metadata_index] = json.loads(values[metadata_index]) if values[metadata_index] else None
    return SessionRow(*values)
