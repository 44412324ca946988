"""A session's previous assembled prompt: what stayed since (stablePrefix), cache breakpoints, delta replies."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from protocol import types as t
from sidecar.engine.assembly import Assembly
from sidecar.rows import Anchors, ItemRow, SessionRow

PromptKey = tuple[int, int, bool, bool]
"""(budget, freshTail, prune, reasoning): a prompt is compared only with one built by the same call."""


@attrs.define(kw_only=True)
class Prompt:
    """What a session's previous assemble returned, kept to compare the next one with and to answer ``since``."""

    revision: str
    key: PromptKey
    """(budget, freshTail, prune, reasoning) it was built with."""
    messages: list[bytes]
    anchor: int | None
    """Position of its first item: while nothing is rewritten, the fill keeps starting there if all fits."""
    summaries: int
    """The session's summary count then: a compaction since is a rewrite."""
    frontier: int
    """The prune frontier then: a step since is a rewrite."""
    settings: Any
    """The settings object then: a settings change is a rewrite."""
    calibration: float
    last_position: int | None
    """The session's newest position then: what came after is what a delta appends."""
    tokens: int
    over_budget: bool
    leading: list[int]
    """Breakpoints of the leading block (system messages, then summaries), which appending does not move."""
    raw: list[int]
    """Per message, its uncalibrated token estimate; -1 for a pruned output (a placeholder)."""
    session_revision: int
    """The session's revision then: appending n messages adds n, any other change of the context adds more."""
    pins: frozenset[int] = frozenset()
    """Positions of the anchored (system and pinned) items then: a pin or unpin since is a rewrite."""

    @classmethod
    def assembled(cls, revision: str, key: PromptKey, session: SessionRow, settings: Any, plan: Assembly,
                  messages: list[bytes], rows: Sequence[ItemRow], raw_tokens: Mapping[int, int] | None,
                  pins: frozenset[int]) -> Prompt:
        """The prompt assemble built from ``plan``; ``raw_tokens``: the rows' uncalibrated estimates, if not theirs."""
        raw = [-1 if row.position in plan.pruned else raw_tokens[row.position] if raw_tokens else row.tokens
               for row in rows]
        return cls(revision=revision, key=key, messages=messages, anchor=plan.start, summaries=session.summary_count,
                   frontier=session.pruned_upto, settings=settings, calibration=session.calibration,
                   last_position=session.last_position, tokens=plan.tokens, over_budget=plan.over_budget,
                   leading=leading_breakpoints(rows), raw=raw, session_revision=session.revision, pins=pins)

    def append(self, revision: str, session: SessionRow, messages: list[bytes], raw: Iterable[int], tokens: int,
               pins: frozenset[int]) -> int:
        """Messages appended at the end (a delta reply), as of ``session``; returns how many it kept from before."""
        kept = len(self.messages)
        self.messages.extend(messages)
        self.raw.extend(raw)
        self.revision, self.tokens, self.pins = revision, tokens, pins
        self.last_position, self.session_revision = session.last_position, session.revision
        return kept

    def holds(self, key: PromptKey, session: SessionRow, settings: Any, anchors: Anchors) -> bool:
        """Whether nothing but appending happened since, for a call with ``key``; ``anchors`` are the session's now.

        Appended pinned messages keep their place at the end; a pin or unpin of an older message, or a new system
        message (system messages lead), rewrites the prompt.
        """
        if self.frontier != session.pruned_upto or not self.anchors(key, session, settings):
            return False
        if anchors.positions is self.pins:
            return True
        last = self.last_position if self.last_position is not None else -1
        return frozenset(p for p in anchors.positions if p <= last) == self.pins \
            and not any(p > last for p in anchors.system)

    def anchors(self, key: PromptKey, session: SessionRow, settings: Any) -> bool:
        """Whether the fill may keep starting where this one did: the same call, no compaction, the same settings.

        A prune step keeps the anchor: the prompt shrinks, and it changes only from the first pruned output on.
        """
        return self.key == key and self.summaries == session.summary_count and self.settings is settings

    def recalibrate(self, factor: float, placeholder: int) -> None:
        """The token total under another calibration factor, counted as assemble counts it."""
        self.tokens = sum(placeholder if raw < 0 else math.ceil(raw * factor) for raw in self.raw)
        self.calibration = factor

    def common_prefix(self, messages: list[bytes]) -> int:
        """How many leading ``messages`` equal this prompt's, byte for byte."""
        old = self.messages
        limit = min(len(old), len(messages))
        for index in range(limit):
            if old[index] is not messages[index] and old[index] != messages[index]:
                return index
        return limit

    def breakpoints(self, stable: int) -> list[int]:
        """The prompt's cache breakpoints, ``stable`` of its messages kept from the previous one."""
        return cache_breakpoints(self.leading, stable, len(self.messages))


def cache_breakpoints(leading: Sequence[int], stable: int, count: int) -> list[int]:
    """At most 4 indexes of a prompt's ``count`` messages to put cache markers after: the ``leading`` block's ends
    (its system messages', its summaries'), the last of the ``stable`` messages kept from the previous prompt, the
    last message. A client that appends messages to a prompt gets the same from its ``fixedBreakpoints``."""
    points = [*leading]
    if stable:
        points.append(stable - 1)
    if count:
        points.append(count - 1)
    return sorted(set(points))[-t.MAX_CACHE_BREAKPOINTS:]


def leading_breakpoints(rows: Sequence[ItemRow]) -> list[int]:
    """The last index of the leading system messages and of the summaries right after them, where there are any."""
    points: list[int] = []
    index = 0
    while index < len(rows) and rows[index].kind == "message" and rows[index].role == "system":
        index += 1
    if index:
        points.append(index - 1)
    summaries = index
    while index < len(rows) and rows[index].kind == "summary":
        index += 1
    if index > summaries:
        points.append(index - 1)
    return points
