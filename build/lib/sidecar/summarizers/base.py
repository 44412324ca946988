"""The summarizer interface that compaction talks to."""

from __future__ import annotations

from typing import Any, Literal, Protocol

import attrs

SummaryKind = Literal["leaf", "condensed", "handoff"]


@attrs.define(frozen=True)
class SourceText:
    """One source of a summary, rendered as text: a message or a child summary."""

    label: str
    """Who or what it is: ``user``, ``assistant``, ``tool result (read)``, ``summary (leaf, depth 0)``."""

    text: str
    """Its content as plain text, tool calls included."""

    at: str | None = None
    """ISO-8601 time of the source, when known."""


@attrs.define(frozen=True)
class SummaryRequest:
    """Everything a summarizer needs to write one summary."""

    kind: SummaryKind
    """leaf (of messages), condensed (of summaries) or handoff (structured, of everything before the tail)."""

    sources: tuple[SourceText, ...]
    """What to summarize, oldest first."""

    target_tokens: int
    """Length to aim for, in estimated tokens."""

    previous_summary: str | None = None
    """Context: the summary just before these sources; for handoff, the previous handoff to update."""

    focus: str | None = None
    """The user's extra instruction, appended as "Additionally: …"."""

    aggressive: bool = False
    """Second try after an over-long result: be much terser."""


class SummarizerError(Exception):
    """A summary could not be produced; the message says why (e.g. ``empty summary response``)."""

    def __init__(self, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.data = data
        """The endpoint's error as -32010's data: ``status``, ``code``, ``message``; None when it sent none."""


class Summarizer(Protocol):
    """Writes one summary for a request."""

    name: str
    """``openai`` or ``deterministic``, as the initialize result reports it."""

    async def summarize(self, request: SummaryRequest) -> str:
        """The summary text; raises SummarizerError when there is none."""
        ...
