"""What the sidecar keeps in memory about sessions between requests, shared by a host's connections."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import attrs

from sidecar.engine.assembly import PruneStep
from sidecar.engine.cache_cost import smoothed_growth
from sidecar.engine.messages import RenderedMessages
from sidecar.services.prompt import Prompt

OVERHEAD_SAMPLES = 8
"""Recent reports a session's prompt overhead is fitted on."""
CACHE_HIT_SMOOTHING = 0.3
"""Weight of the newest report in the smoothed cache hit rate."""
RECENT_CALLS = 256
"""Tool calls remembered per session, by id, to name the tool of the results that follow them."""
FIRST_BACKOFF = 30.0
MAX_BACKOFF = 900.0
"""Seconds before automatic compaction tries again after a failure: doubled each time, up to this."""
MAX_PROMPTS = 16
"""Sessions whose previous prompt is kept (their messages are held, not copied): the most recently assembled."""


@attrs.define
class SessionRuntime:
    """One session's state that is not stored: its previous prompt, calibration, cache and prune figures, back-off."""

    prompt: Prompt | None = None
    """Its previous assembled prompt, for stablePrefix, breakpoints and deltas."""
    assembled: tuple[int, float] | None = None
    """(session revision, uncalibrated tokens) of the last assembled context: the basis of calibration."""
    samples: list[tuple[float, int]] = attrs.field(factory=list)
    """Recent (estimated, provider-counted) prompt tokens, to tell a fixed overhead from a ratio."""
    cache_hits: tuple[float, float] | None = None
    """(last, smoothed) cache hit rate of the provider's reports."""
    recent_calls: dict[str, str] = attrs.field(factory=dict)
    """The tool name of recent tool calls, by call id."""
    prune_memo: tuple[Any, PruneStep] | None = None
    """The last prune state computed, and the (revision, frontier, calibration, settings) it holds for."""
    growth: tuple[int | None, int, float | None] = (None, 0, None)
    """Raw context tokens at its last assemble, how many assembles since added some, and how much on average."""
    backoff: tuple[float, float] | None = None
    """After a failed auto-compaction: (not before this monotonic time, the next delay)."""
    idle_at: tuple[int, str] | None = None
    """Context size at which auto-compaction last found nothing to do, and why."""
    unfit_at: int | None = None
    """Context size at which a compaction to fit an assemble's budget found nothing to do: the next waits for more."""
    judged_under: Any = None
    """The settings of the connection whose automatic compaction set ``backoff`` or ``idle_at`` last."""
    overhead: int = 0
    """Tokens its client sends beside the context (system prompt, tools), as its last assemble said."""
    budget: int | None = None
    """The budget its last assemble worked out for the prompt (``steady_budget``), when the client named none."""
    compacting: bool = False
    running: asyncio.Future[Any] | None = None
    """The compaction running now: its ``CompactResult`` once it ends (None when it failed or was cancelled)."""
    staged: asyncio.Event | None = None
    """Set it and the automatic compaction begun ahead of the threshold applies its summaries (now, or once they
    are written); None when no such compaction runs."""
    waiting: bool = False
    """That compaction's summaries are written and wait for the threshold: the session is not being compacted."""

    def note_assembled(self, revision: int, uncalibrated_tokens: float) -> None:
        """An assembled context's size at a session revision: what a usage report at that revision counted."""
        self.assembled = (revision, uncalibrated_tokens)

    def calibration_basis(self, revision: int) -> float | None:
        """Uncalibrated tokens of the context assembled at ``revision``, if that was the last one assembled."""
        return self.assembled[1] if self.assembled is not None and self.assembled[0] == revision else None

    def calibration_sample(self, basis: float, prompt: int) -> float:
        """Provider tokens per estimated token, with a fixed prompt overhead (system prompt, tools) taken out."""
        # The overhead is not in the stored history, so it is an offset, not a ratio: once the recent reports span
        # contexts of different sizes (the largest 1.5 times the smallest), a line through them separates the two.
        samples = self.samples
        samples.append((basis, prompt))
        del samples[:-OVERHEAD_SAMPLES]
        low, high = min(b for b, _ in samples), max(b for b, _ in samples)
        if high < 1.5 * low:
            return prompt / basis
        mean_b = sum(b for b, _ in samples) / len(samples)
        mean_p = sum(p for _, p in samples) / len(samples)
        slope = sum((b - mean_b) * (p - mean_p) for b, p in samples) / sum((b - mean_b) ** 2 for b, _ in samples)
        if mean_p - slope * mean_b < 0:  # no overhead after all: the plain ratio
            return mean_p / mean_b
        return slope

    def note_cache_hits(self, read: int, prompt: int) -> None:
        """A provider report's cache reads of its ``prompt`` tokens (more than 0), into the last and smoothed rate."""
        last = read / prompt
        previous = self.cache_hits
        smoothed = last if previous is None else CACHE_HIT_SMOOTHING * last + (1 - CACHE_HIT_SMOOTHING) * previous[1]
        self.cache_hits = (round(last, 4), smoothed)

    def note_prompt(self, context_tokens: int) -> None:
        """Count an assemble toward the session's growth per prompt (what a prune step's savings last for)."""
        last, samples, growth = self.growth
        if last is not None and context_tokens > last:
            samples += 1
            growth = smoothed_growth(growth, samples, context_tokens - last)
        self.growth = (context_tokens, samples, growth)

    @property
    def growth_per_prompt(self) -> float | None:
        """Raw tokens an assemble has added on average, once one has."""
        return self.growth[2]

    def remembered_prune(self, key: Any) -> PruneStep | None:
        """The prune state last computed, if it was computed for ``key``."""
        memo = self.prune_memo
        return memo[1] if memo is not None and memo[0] == key else None

    def remember_prune(self, key: Any, step: PruneStep) -> None:
        """Keep a prune state for the next ask with the same ``key``."""
        self.prune_memo = (key, step)

    def remember_calls(self, names: Mapping[str, str]) -> None:
        """Keep the names of tool calls just stored, the oldest forgotten beyond RECENT_CALLS."""
        recent = self.recent_calls
        recent.update(names)
        while len(recent) > RECENT_CALLS:
            del recent[next(iter(recent))]

    def backed_off(self, now: float) -> bool:
        """Whether a failed automatic compaction still holds the next one back at monotonic time ``now``."""
        return self.backoff is not None and now < self.backoff[0]

    def back_off(self, now: float, settings: Any = None) -> float:
        """An automatic compaction under ``settings`` failed: wait twice as long as last time (up to MAX_BACKOFF);
        returns the wait."""
        delay = min((self.backoff[1] if self.backoff is not None else FIRST_BACKOFF / 2) * 2, MAX_BACKOFF)
        self.backoff, self.judged_under = (now + delay, delay), settings
        return delay

    def clear_backoff(self) -> None:
        """An automatic compaction succeeded: the next is not held back."""
        self.backoff = None

    def note_idle(self, context_count: int, reason: str, settings: Any = None) -> None:
        """An automatic compaction under ``settings`` found nothing to do: the next waits for more context, and usage
        says why."""
        self.idle_at, self.judged_under = (context_count, reason), settings

    def note_compacted(self) -> None:
        """A compaction replaced history: automatic compaction no longer waits."""
        self.idle_at = None

    def reset(self) -> None:
        """Forget what was judged on the database before it was opened again; the prompt and cache figures stay."""
        self.assembled = self.prune_memo = self.backoff = self.idle_at = self.judged_under = self.unfit_at = None
        self.samples = []
        self.recent_calls = {}
        self.growth = (None, 0, None)


class Runtime:
    """Every session's runtime and the messages rendered once, for one database; a host's connections share it."""

    def __init__(self) -> None:
        self.sessions: dict[str, SessionRuntime] = {}
        self.rendered = RenderedMessages()
        """Assembled messages as JSON text, reused while they stay in the context."""
        self._prompted: dict[str, None] = {}
        """Sessions holding a prompt, least recently assembled first."""

    def get(self, session_id: str) -> SessionRuntime | None:
        """The session's runtime, if it has any."""
        return self.sessions.get(session_id)

    def of(self, session_id: str) -> SessionRuntime:
        """The session's runtime, made on first use."""
        state = self.sessions.get(session_id)
        if state is None:
            state = self.sessions[session_id] = SessionRuntime()
        return state

    def compacting(self, session_id: str | None = None) -> bool:
        """Whether the session (any session, when None) is being compacted."""
        if session_id is None:
            return any(state.compacting for state in self.sessions.values())
        state = self.sessions.get(session_id)
        return state is not None and state.compacting

    def keep_prompt(self, session_id: str, prompt: Prompt) -> None:
        """Remember a session's prompt, forgetting the least recently assembled beyond MAX_PROMPTS."""
        self.of(session_id).prompt = prompt
        self._prompted.pop(session_id, None)
        self._prompted[session_id] = None
        while len(self._prompted) > MAX_PROMPTS:
            oldest = next(iter(self._prompted))
            del self._prompted[oldest]
            self.sessions[oldest].prompt = None

    def forget(self, session_id: str | None = None) -> None:
        """Drop a deleted session's runtime; with None, reset every session's and the renderings (the database was
        opened again)."""
        if session_id is not None:
            self.sessions.pop(session_id, None)
            self._prompted.pop(session_id, None)
            return
        self.rendered.clear()
        for state in self.sessions.values():
            state.reset()

    def reconsider(self, settings: Any) -> None:
        """A connection's settings changed from ``settings``: the back-offs and idle marks its automatic compactions
        judged under them no longer hold; what other connections judged, and every measured figure, stay."""
        for state in self.sessions.values():
            if state.judged_under is settings:
                state.backoff = state.idle_at = state.judged_under = None
