"""Every summarizer call planned to fit the model's window, with room for the answer.

A request too large for one call is split: leaf and condensed sources into parts summarized apart, then
merged by condensed calls in rounds; handoff sources into parts taken in order, each round updating the
previous round's handoff summary (as the update prompt does for a previous handoff).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import attrs

from sidecar.config.models import context_window_for
from sidecar.config.settings import LlmSettings
from sidecar.engine.tokens import MESSAGE_OVERHEAD_TOKENS, estimate_text_tokens
from sidecar.summarizers.base import SourceText, SummaryRequest
from sidecar.summarizers.deterministic import truncate_to_tokens
from sidecar.summarizers.escalation import OVERSHOOT
from sidecar.summarizers.prompts import build_prompt

log = logging.getLogger(__name__)

DEFAULT_WINDOW = 8192
"""The summarizer model's window when neither llm.contextWindow nor the model table names one."""
USABLE_SHARE = 0.9
"""Prompts are planned to this share of the window: the endpoint's tokenizer is not our estimate."""
TARGET_SHARE = 8
"""A summary aims at most at 1/8 of the window, so a handoff round holds its previous summary and new history."""
ANSWER_MARGIN = 64
MIN_SOURCE_TOKENS = 256
MAX_DEPTH = 6
"""Merge rounds after which sources are cut rather than split again: a safeguard, not reached in practice."""

Call = Callable[[SummaryRequest], Awaitable[str]]


def summarizer_window(llm: LlmSettings) -> int:
    """llm.contextWindow, else the model table's window for llm.model, else DEFAULT_WINDOW."""
    return llm.context_window or context_window_for(llm.model, {}) or DEFAULT_WINDOW


def prompt_tokens(request: SummaryRequest) -> int:
    """Estimated tokens of the request's prompt."""
    prompt = build_prompt(request)
    return estimate_text_tokens(prompt.system) + estimate_text_tokens(prompt.user) + 3 * MESSAGE_OVERHEAD_TOKENS


def answer_room(request: SummaryRequest) -> int:
    """Tokens kept free for the answer: what escalation accepts, plus a margin."""
    return int(request.target_tokens * OVERSHOOT) + ANSWER_MARGIN


@attrs.define
class Planner:
    """Fits requests into one window; counts the calls and merge rounds it made."""

    call: Call
    window: int
    calls: int = 0
    rounds: int = 0

    @property
    def usable(self) -> int:
        """Tokens a prompt and its answer may take together."""
        return int(self.window * USABLE_SHARE)

    def fits(self, request: SummaryRequest) -> bool:
        """Whether one call can take the request."""
        return prompt_tokens(request) + answer_room(request) <= self.usable

    async def summarize(self, request: SummaryRequest, depth: int = 0) -> str:
        """The summary of ``request``, in one call when it fits, else in parts and rounds."""
        request = self._bounded(request)
        if self.fits(request):
            self.calls += 1
            return await self.call(request)
        self.rounds = max(self.rounds, depth + 1)
        parts = self._parts(request)
        if depth >= MAX_DEPTH and len(parts) > 1:
            share = self._source_budget(request) // len(request.sources)
            self.calls += 1
            return await self.call(attrs.evolve(request, sources=tuple(
                attrs.evolve(s, text=truncate_to_tokens(s.text, max(16, share - 32))) for s in request.sources)))
        if request.kind == "handoff":
            summary = request.previous_summary
            for part in parts:
                self.calls += 1
                summary = await self.call(self._bounded(attrs.evolve(request, sources=part,
                                                                     previous_summary=summary)))
            return summary or ""
        targets = [self._part_target(request, part) for part in parts]
        texts = await asyncio.gather(*(
            self.summarize(attrs.evolve(request, sources=part, target_tokens=target,
                                        previous_summary=request.previous_summary if index == 0 else None),
                           depth + 1)
            for index, (part, target) in enumerate(zip(parts, targets, strict=True))))
        log.info("a %s summary of %d sources took %d parts, merged in round %d", request.kind,
                 len(request.sources), len(parts), depth + 1)
        merged = tuple(SourceText(label=f"summary of part {n} of {len(parts)}", text=text, at=part[-1].at)
                       for n, (text, part) in enumerate(zip(texts, parts, strict=True), 1))
        return await self.summarize(SummaryRequest(kind="condensed", sources=merged,
                                                   target_tokens=request.target_tokens, focus=request.focus,
                                                   aggressive=request.aggressive), depth + 1)

    def _bounded(self, request: SummaryRequest) -> SummaryRequest:
        """The target and the previous summary cut to what a window of this size can hold."""
        target = max(64, min(request.target_tokens, self.window // TARGET_SHARE))
        previous = request.previous_summary
        if previous and estimate_text_tokens(previous) > answer_room(attrs.evolve(request, target_tokens=target)):
            previous = truncate_to_tokens(previous, int(target * OVERSHOOT))
        return attrs.evolve(request, target_tokens=target, previous_summary=previous)

    def _source_budget(self, request: SummaryRequest) -> int:
        """Tokens of sources one call can take beside the instructions, the previous summary and the answer."""
        previous = request.previous_summary
        if request.kind == "handoff":  # later rounds carry the previous round's summary, up to an answer long
            previous = "x" * (answer_room(request) * 4)
        empty = attrs.evolve(request, sources=(), previous_summary=previous)
        return max(MIN_SOURCE_TOKENS, self.usable - prompt_tokens(empty) - answer_room(request))

    def _parts(self, request: SummaryRequest) -> list[tuple[SourceText, ...]]:
        """Consecutive runs of sources that each fit the source budget; a source too big alone is cut."""
        budget = self._source_budget(request)
        parts: list[list[SourceText]] = [[]]
        used = 0
        for source in request.sources:
            cost = _source_tokens(source)
            if cost > budget:
                source = attrs.evolve(source, text=truncate_to_tokens(source.text, budget - 32))
                cost = _source_tokens(source)
            if parts[-1] and used + cost > budget:
                parts.append([])
                used = 0
            parts[-1].append(source)
            used += cost
        return [tuple(part) for part in parts]

    @staticmethod
    def _part_target(request: SummaryRequest, part: tuple[SourceText, ...]) -> int:
        """A part's share of the whole request's target, by its share of the sources."""
        total = sum(_source_tokens(s) for s in request.sources) or 1
        share = sum(_source_tokens(s) for s in part) / total
        return max(64, int(request.target_tokens * share))


def _source_tokens(source: SourceText) -> int:
    return estimate_text_tokens(source.text) + estimate_text_tokens(source.label) + 12
