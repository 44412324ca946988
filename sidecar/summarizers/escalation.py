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
    """How many times the primary summarizer was called (1 or 2); the fallback is not counted."""


async def summarize_with_escalation(primary: Summarizer, fallback: Summarizer | None,
                                    request: SummaryRequest) -> EscalatedSummary:
    """A summary within 150% of the target, escalating as LCM does; primary's SummarizerError propagates."""
    limit = request.target_tokens * OVERSHOOT
    text = await primary.summarize(attrs.evolve(request, aggressive=False))
    if estimate_text_tokens(text) <= limit:
        return EscalatedSummary(text, "normal", 1)
    terse = await primary.summarize(attrs.evolve(request, aggressive=True))
    if estimate_text_tokens(terse) <= limit:
        return EscalatedSummary(terse, "aggressive", 2)
    shorter = min(terse, text, key=estimate_text_tokens)
    cut = truncate_to_tokens(shorter, request.target_tokens)
    if fallback is not None and cut == truncation_marker(request.target_tokens):
        # Nothing of the LLM text survived the cut (one enormous line): an extractive summary says more.
        cut = await fallback.summarize(attrs.evolve(request, aggressive=False))
    return EscalatedSummary(cut, "truncated", 2)
