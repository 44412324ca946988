"""Usage figures and states: how full a context is and what to tell the user."""

from __future__ import annotations

import math

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


BUDGET_SLACK = 64
"""Tokens (or a hundredth of the budget, when more) a prompt budget may grow by before it is worked out anew."""


def prompt_budget(context_window: int, settings: CompactionSettings, overhead: int = 0, scale: float = 1.0,
                  reply: int = 0) -> int:
    """What a prompt's messages may fill: the window less the reply's room and what the client sends beside them
    (``overhead``: system prompt, tool definitions), over ``scale`` (the client's rendering of a message against the
    sidecar's count of it). The reply's room is the reserve, or the ``reply`` tokens the request allows when more
    (up to half the window)."""
    room = max(reserve_for(context_window, settings), min(reply, context_window // 2))
    return max(0, math.floor((context_window - room - overhead) / scale))


def steady_budget(wanted: int, previous: int | None) -> int:
    """The budget to assemble within: ``wanted`` the first time, then ``previous`` while ``wanted`` is at most a little
    above it, since another budget is a rewrite of the prompt (its cached prefix moves); after a larger change, a
    little below ``wanted``, so that the next small changes of the overhead keep it."""
    if previous is None:
        return wanted
    slack = max(BUDGET_SLACK, wanted // 100)
    if previous <= wanted <= previous + slack:
        return previous
    return max(wanted - slack // 2, 0)


def fresh_tail_cap(budget: int) -> int:
    """Tokens the fresh tail may hold when a compaction keeps it: half the prompt's budget, so that the summaries
    and the turns to come fit beside it (a few huge messages can outweigh the whole window)."""
    return budget // 2


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

