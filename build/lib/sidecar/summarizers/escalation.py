"""LCM escalation: normal summary, then aggressive, then deterministic truncation."""

from __future__ import annotations

from typing import Literal

import attrs

from sidecar.engine.tokens import estimate_text_tokens
from sidecar.summarizers.base import Summarizer, SummaryRequest
from sidecar.summarizers.deterministic import truncate_to_tokens, truncation_marker

OVERSHOOT = 1.5
"""A summary longer than this times its target is redone aggressively, then truncated."""

EscalationLevel = Literal["normal", "aggressive", "truncated"]


@attrs.define(frozen=True)
class EscalatedSummary:
    """The summary that escalation settled on."""

    text: str
    level: EscalationLevel
    """Which step produced it: the normal call, the aggressive call, or truncation."""

    calls: int
    """How many calls the primary summarizer made (per try one, or more for an input split to fit its
    window); the fallback is not counted."""


async def summarize_with_escalation(primary: Summarizer, fallback: Summarizer | None,
                                    request: SummaryRequest) -> EscalatedSummary:
    """A summary within 150% of the target, escalating as LCM does; primary's SummarizerError propagates."""
    limit = request.target_tokens * OVERSHOOT
    text, first = await _summarize(primary, attrs.evolve(request, aggressive=False))
    if estimate_text_tokens(text) <= limit:
        return EscalatedSummary(text, "normal", first)
    terse, second = await _summarize(primary, attrs.evolve(request, aggressive=True))
    if estimate_text_tokens(terse) <= limit:
        return EscalatedSummary(terse, "aggressive", first + second)
    shorter = min(terse, text, key=estimate_text_tokens)
    cut = truncate_to_tokens(shorter, request.target_tokens)
    if fallback is not None and cut == truncation_marker(request.target_tokens):
        # Nothing of the LLM text survived the cut (one enormous line): an extractive summary says more.
        cut = await fallback.summarize(attrs.evolve(request, aggressive=False))
    return EscalatedSummary(cut, "truncated", first + second)


async def _summarize(summarizer: Summarizer, request: SummaryRequest) -> tuple[str, int]:
    """The text and the calls it took: one, unless the summarizer splits inputs to fit its window."""
    counted = getattr(summarizer, "summarize_counted", None)
    if counted is not None:
        return await counted(request)
    return await summarizer.summarize(request), 1
