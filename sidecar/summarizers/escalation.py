"""LCM escalation: normal summary, then aggressive, then deterministic truncation."""

from __future__ import annotations

import logging
from typing import Literal

import attrs

from sidecar.engine.tokens import estimate_text_tokens
from sidecar.summarizers.base import Summarizer, SummarizerError, SummaryRequest
from sidecar.summarizers.deterministic import truncate_to_tokens, truncation_marker

log = logging.getLogger(__name__)

OVERSHOOT = 1.5
"""A summary longer than this times its target is redone aggressively, then truncated."""

EscalationLevel = Literal["normal", "aggressive", "truncated", "fallback"]


@attrs.define(frozen=True)
class EscalatedSummary:
    """The summary that escalation settled on."""

    text: str
    level: EscalationLevel
    """Which step produced it: the normal call, the aggressive call, truncation, or the fallback after a failure."""

    calls: int
    """How many calls the primary summarizer made (per try one, or more for an input split to fit its
    window); the fallback is not counted."""

    writer: str = ""
    """The name of the summarizer whose text it is."""


async def summarize_with_escalation(primary: Summarizer, fallback: Summarizer | None, request: SummaryRequest,
                                    fall_back_on_failure: bool = False) -> EscalatedSummary:
    """A summary within 150% of the target, escalating as LCM does.

    The primary's SummarizerError propagates, unless ``fall_back_on_failure``: then a failed normal call is
    replaced by the fallback's summary, and a failed aggressive call by the normal text cut to the target.
    """
    limit = request.target_tokens * OVERSHOOT
    try:
        text, first = await _summarize(primary, attrs.evolve(request, aggressive=False))
    except SummarizerError as error:
        if not fall_back_on_failure or fallback is None:
            raise
        log.warning("%s summary failed, %s summary instead: %s", primary.name, fallback.name, error)
        return EscalatedSummary(await fallback.summarize(attrs.evolve(request, aggressive=False)), "fallback", 0,
                                fallback.name)
    if estimate_text_tokens(text) <= limit:
        return EscalatedSummary(text, "normal", first, primary.name)
    try:
        terse, second = await _summarize(primary, attrs.evolve(request, aggressive=True))
    except SummarizerError as error:
        if not fall_back_on_failure:
            raise
        log.warning("%s aggressive summary failed, the first one is cut instead: %s", primary.name, error)
        terse, second = text, 0
    if estimate_text_tokens(terse) <= limit:
        return EscalatedSummary(terse, "aggressive", first + second, primary.name)
    shorter = min(terse, text, key=estimate_text_tokens)
    cut = truncate_to_tokens(shorter, request.target_tokens)
    writer = primary.name
    if fallback is not None and cut == truncation_marker(request.target_tokens):
        # Nothing of the LLM text survived the cut (one enormous line): an extractive summary says more.
        cut = await fallback.summarize(attrs.evolve(request, aggressive=False))
        writer = fallback.name
    return EscalatedSummary(cut, "truncated", first + second, writer)


async def _summarize(summarizer: Summarizer, request: SummaryRequest) -> tuple[str, int]:
    """The text and the calls it took: one, unless the summarizer splits inputs to fit its window."""
    counted = getattr(summarizer, "summarize_counted", None)
    if counted is not None:
        return await counted(request)
    return await summarizer.summarize(request), 1
