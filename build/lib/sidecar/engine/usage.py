"""Usage figures and states: how full a context is and what to tell the user."""

from __future__ import annotations

import attrs

from protocol.types import UsageState
from sidecar.config.settings import CompactionSettings

HINTS = {
    "suggest": "Context {percent:.0f}% full: type /compact to free up context",
    "compact": "Context {percent:.0f}% full, over the compaction threshold: type /compact now",
    "compacting": "Compacting context…",
    "overflow": "Context {percent:.0f}% full, over the model's window: type /compact or older messages are dropped",
}


NOT_COMPACTED = {
    "compact": "Context {percent:.0f}% full, over the compaction threshold, and auto-compaction replaced nothing: "
               "{reason}",
    "overflow": "Context {percent:.0f}% full, over the model's window, and auto-compaction replaced nothing "
                "(older messages are dropped): {reason}",
}


def not_compacted_hint(state: UsageState, percent: float, reason: str) -> str | None:
    """The hint over the threshold when the last auto-compaction replaced nothing: why, instead of "/compact"."""
    return NOT_COMPACTED[state].format(percent=percent, reason=reason) if state in NOT_COMPACTED else None


@attrs.define(frozen=True)
class UsageFigures:
    tokens: int
    context_window: int
    threshold: int
    percent: float
    state: UsageState
    hint: str | None


def reserve_for(context_window: int, settings: CompactionSettings) -> int:
    """Tokens kept free for the reply: reserveTokens, but at most half the window so small windows stay usable."""
    return min(settings.reserve_tokens, context_window // 2)


def default_budget(context_window: int, settings: CompactionSettings) -> int:
    """What an assemble with no ``budget`` may fill: the window less the reply's reserve."""
    return context_window - reserve_for(context_window, settings)


def compaction_threshold(context_window: int, settings: CompactionSettings) -> int:
    """Tokens at which auto-compaction starts: the smallest of maxTokens (> 0), threshold share, window - reserve."""
    candidates = [int(settings.threshold * context_window), default_budget(context_window, settings)]
    if settings.max_tokens > 0:
        candidates.append(settings.max_tokens)
    return max(1, min(candidates))


def usage_figures(tokens: int, context_window: int, settings: CompactionSettings, compacting: bool,
                  pruned: int = 0) -> UsageFigures:
    """The usage state of a context of ``tokens`` in ``context_window``.

    ``pruned``: tokens pruning saves that still count toward compaction; the threshold and the suggestion come that
    much earlier, so the session compacts when it would without pruning.
    """
    threshold = max(1, compaction_threshold(context_window, settings) - pruned)
    percent = round(100.0 * tokens / context_window, 1) if context_window > 0 else 100.0
    state: UsageState
    if compacting:
        state = "compacting"
    elif tokens > context_window:
        state = "overflow"
    elif tokens >= threshold:
        state = "compact"
    elif tokens + pruned >= settings.suggest_at * context_window:
        state = "suggest"
    else:
        state = "ok"
    hint = HINTS[state].format(percent=percent) if state in HINTS else None
    return UsageFigures(tokens, context_window, threshold, percent, state, hint)

