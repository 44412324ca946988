"""Compactions agents made themselves: checking a record, and recognising one recorded before."""

from __future__ import annotations

from collections.abc import Sequence

from protocol.types import RecordCompactionParams
from sidecar.rows import AgentCompactionRow
from sidecar.services.errors import invalid_params

MAX_SUMMARY_CHARS = 1_000_000
"""A summary longer than this is no summary: refused rather than stored."""
MIN_CONTAINED_CHARS = 40
"""A recorded text contained in another (or containing it) is the same compaction only past this length: short
texts ("Done.") may well recur in different compactions."""


def fold(text: str) -> str:
    """The text with every run of whitespace as one space, trimmed: how two records of one summary are compared."""
    return " ".join(text.split())


def check(params: RecordCompactionParams) -> None:
    """-32602 (with ``data.field``) for a record that cannot be stored."""
    if not params.session_id:
        raise invalid_params("sessionId must be a non-empty string", "sessionId")
    if not params.summary.strip():
        raise invalid_params("summary must hold text (the agent's compaction summary)", "summary")
    if len(params.summary) > MAX_SUMMARY_CHARS:
        raise invalid_params(f"summary is longer than {MAX_SUMMARY_CHARS:,} characters", "summary")
    if not params.source.strip():
        raise invalid_params("source must name the agent that compacted, e.g. claude-code", "source")
    if params.trigger is not None and params.trigger not in ("manual", "auto"):
        raise invalid_params('trigger must be "manual" or "auto"', "trigger")
    if params.id is not None and not params.id:
        raise invalid_params("id must be a non-empty string when given", "id")


def recorded_before(rows: Sequence[AgentCompactionRow], compaction_id: str | None,
                    text: str) -> AgentCompactionRow | None:
    """The record of this compaction, if there is one: the same id, or the same (folded) text, or one text holding
    the other (an agent that wraps its summary in a preface where it writes it down, and not where it hands it to
    a hook)."""
    for row in rows:
        if compaction_id is not None and row.compaction_id == compaction_id:
            return row
    for row in rows:
        if row.text == text:
            return row
        shorter, longer = sorted((row.text, text), key=len)
        if len(shorter) >= MIN_CONTAINED_CHARS and shorter in longer:
            return row
    return None
