"""One compaction of one session: plan passes, summarize, and apply everything in one transaction.

All summaries are computed first against an in-memory copy of the context (``rewrite.Rewrite``);
the store is written once, at the end. Cancellation or a summarizer failure
before that leaves the session exactly as it was.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable

import attrs

from sidecar.engine.compaction_plan import (
    condensed_groups,
    fresh_tail_within,
    handoff_span,
    leaf_chunks,
    nothing_to_compact,
    protected_tail_start,
)
from sidecar.engine.files import strip_footer
from sidecar.engine.usage import compaction_threshold
from sidecar.rows import AgentCompactionRow, ItemRow, SessionRow
from sidecar.services.compaction.rewrite import Rewrite
from sidecar.services.state import Sidecar
from sidecar.summarizers.base import Summarizer, SummaryRequest
from sidecar.summarizers.deterministic import DeterministicSummarizer
from sidecar.summarizers.escalation import EscalatedSummary, summarize_with_escalation

SPLIT_TURN_HEADING = "## Turn Context (split turn)"

Progress = Callable[[int, int], None]


@attrs.frozen
class Target:
    """What a compaction must get the context under: ``tokens`` (calibrated, as usage counts them), its kept tail
    holding at most ``tail_tokens`` (raw) but for the newest message; a run of fewer than ``leafChunkSize`` older
    messages is summarized when it holds ``run_tokens`` (raw)."""

    tokens: int
    tail_tokens: int
    run_tokens: int


@attrs.define
class Outcome:
    """What a compaction did."""

    compacted: bool
    mode: str
    tokens_before: int
    tokens_after: int
    rounds: int = 0
    summary_ids: list[str] = attrs.field(factory=list)
    reason: str | None = None
    summary: str | None = None
    calls: int = 0
    db_seconds: float = 0.0
    message_count: int = 0
    tokens_rewritten: int = 0
    """Prompt tokens from the first item the rewrite changed on."""
    summarizers: dict[str, int] = attrs.field(factory=dict)
    """How many of the new summaries each summarizer wrote."""


class Compaction:
    """Compacts one session once, in one of the modes of docs/protocol.md (``context/compact``)."""

    def __init__(self, sidecar: Sidecar, session_id: str, mode: str, focus: str | None,
                 summarizer: Summarizer, progress: Progress | None = None, fall_back_on_failure: bool = False,
                 target: Target | None = None) -> None:
        self.sidecar = sidecar
        self.session_id = session_id
        self.mode = mode
        self.focus = focus or None
        self.summarizer = summarizer
        self.fallback = DeterministicSummarizer()
        self.fall_back_on_failure = fall_back_on_failure
        """A failed summarizer call is replaced by the deterministic summary instead of failing the compaction."""
        self.progress = progress or (lambda done, planned: None)
        self.settings = sidecar.settings.compaction
        self.target = target
        self.fresh_tail = self.settings.fresh_tail
        self.keep_recent_tokens = self.settings.keep_recent_tokens
        """The kept tail (``load`` caps them by the target's tail tokens)."""
        self.rewrite = Rewrite(sidecar, session_id, summarizer.name)
        """The session's context, as read and as rewritten so far."""
        self.calls = 0
        self.done = 0
        self.planned = 0

    def load(self) -> SessionRow:
        """Read the session's current context, with the summaries in it; the kept tail fits the target."""
        session = self.rewrite.load()
        if self.target is not None:
            self.fresh_tail = fresh_tail_within(self.rewrite.nodes, self.settings.fresh_tail, self.target.tail_tokens)
            self.keep_recent_tokens = min(self.keep_recent_tokens, self.target.tail_tokens)
        return session

    def loaded_context(self) -> tuple[list[ItemRow], bool]:
        """The context as loaded, as items for ``Sidecar.estimated_tokens``: no need to read it again."""
        return self.rewrite.loaded_context()

    def message_count(self) -> int:
        """Messages and summaries in the current context, as willCompact reports them."""
        return len(self.rewrite.nodes)

    async def run(self, supplied_summary: str | None = None, tokens_before: int | None = None,
                  ready: Callable[[], Awaitable[None]] | None = None) -> Outcome:
        """Compact; ``supplied_summary`` (from a client hook) replaces the summarizer for a handoff; ``ready``, when
        given, is awaited between writing the summaries and applying them (a compaction begun ahead of time)."""
        rewrite = self.rewrite
        session, before = self._begin(tokens_before)
        # The context as assemble sends it now: the coalesced prune step is part of this rewrite's savings.
        raw_before = rewrite.loaded_tokens(session)
        if supplied_summary is not None:
            self.mode = "handoff"  # the client's text stands for everything before the tail, as a handoff does
        if self.mode == "handoff":
            rounds = 1 if await self._handoff(supplied_summary) else 0
        else:
            rounds = await self._dag_rounds(session)
        if not rewrite.new_summaries:
            settings = self.settings
            kept = self.fresh_tail if self.fresh_tail != settings.fresh_tail else None
            run = self.target.run_tokens or None if self.target is not None else None
            return self._outcome(False, before, before, 0, nothing_to_compact(
                rewrite.nodes, self.mode, settings.fresh_tail, self.keep_recent_tokens, settings.leaf_chunk_size,
                settings.condensed_min_fanout, kept, run))
        virtual_after = rewrite.virtual_tokens()
        if virtual_after >= raw_before:
            return self._outcome(False, before, before, rounds, "no progress: the summaries would not make the "
                                 "context smaller")
        min_savings = self.settings.min_savings
        if raw_before - virtual_after < min_savings * raw_before:
            return self._outcome(False, before, before, rounds,
                                 f"not worth a rewrite: it would save {raw_before - virtual_after:,} of "
                                 f"{raw_before:,} tokens, less than compaction.minSavings ({min_savings:.0%})")
        if ready is not None:
            await ready()
        # No await from here to the write: a pin can no longer slip in between.
        rewrite.keep_newly_anchored()
        rewrite.apply()
        handoff = next((s.content for s in rewrite.new_summaries if s.kind == "handoff"), None)
        return self._applied(before, rounds, handoff)

    async def record(self, agent: AgentCompactionRow, summary: str, upto: int | None,
                     tokens_before: int | None = None) -> Outcome:
        """An agent's own compaction: its summary, as a handoff summary, replaces every item up to position ``upto``
        (the whole context when None) but system and pinned messages.

        No savings check: the agent has compacted already, and the session mirrors its context.
        """
        rewrite = self.rewrite
        _, before = self._begin(tokens_before)
        self.mode, rewrite.summarizer_name = "handoff", agent.source
        replaced = [i for i, node in enumerate(rewrite.nodes)
                    if (upto is None or node.position <= upto) and not node.anchored]
        if not replaced:
            return self._outcome(False, before, before, 0, "nothing to replace: the session holds no message "
                                 "before the compaction but system or pinned ones")
        rewrite.load_messages(replaced)
        depth = max((rewrite.nodes[i].depth + 1 for i in replaced if rewrite.nodes[i].kind == "summary"), default=0)
        rewrite.replace([replaced], [("handoff", summary.strip(), depth)])
        rewrite.keep_newly_anchored()
        rewrite.apply(attrs.evolve(agent, summary_id=rewrite.new_summaries[0].id))
        return self._applied(before, 1, rewrite.new_summaries[0].content)

    def _begin(self, tokens_before: int | None) -> tuple[SessionRow, int]:
        """The session (its context loaded, if ``load`` was not called) and its size before, as usage counts it."""
        rewrite = self.rewrite
        session = rewrite.session() if rewrite.nodes else self.load()
        before = tokens_before if tokens_before is not None else \
            rewrite.timed(lambda: self.sidecar.estimated_tokens(session))
        return session, before

    def _applied(self, before: int, rounds: int, summary: str | None) -> Outcome:
        after = self.rewrite.tokens_after()
        outcome = self._outcome(True, before, after, rounds, None, summary)
        outcome.tokens_rewritten = max(0, after - self.rewrite.unchanged_tokens)
        return outcome

    def _outcome(self, compacted: bool, before: int, after: int, rounds: int, reason: str | None,
                 summary: str | None = None) -> Outcome:
        rewrite = self.rewrite
        top = {node.ref_id for node in rewrite.nodes if node.kind == "summary"}
        return Outcome(compacted=compacted, mode=self.mode, tokens_before=before, tokens_after=after, rounds=rounds,
                       summary_ids=[s.id for s in rewrite.new_summaries if s.id in top] if compacted else [],
                       reason=reason, summary=summary, calls=self.calls, db_seconds=rewrite.db_seconds,
                       message_count=len(rewrite.nodes),
                       summarizers=dict(Counter(s.summarizer for s in rewrite.new_summaries if s.id in top))
                       if compacted else {})

    # Leaf and condensed passes

    async def _dag_rounds(self, session: SessionRow) -> int:
        threshold = compaction_threshold(self.sidecar.context_window(session), self.settings)
        if self.target is not None:
            threshold = min(threshold, self.target.tokens)
        counts_pruned = not self.sidecar.settings.prune.postpone_compaction  # pruned outputs count whole, as in usage
        rounds = 0
        max_rounds = self.settings.max_rounds if self.mode == "full" else 1
        while rounds < max_rounds:
            before = self.rewrite.virtual_tokens()
            changed = await self._leaf_pass()
            changed = await self._condensed_pass() or changed
            rounds += 1
            if not changed or self.rewrite.virtual_tokens() >= before:
                break
            if self.mode != "full" or self.rewrite.virtual_tokens(whole=counts_pruned) < threshold:
                break
        return rounds

    async def _leaf_pass(self) -> bool:
        rewrite = self.rewrite
        tail = protected_tail_start(rewrite.nodes, self.fresh_tail)
        chunks = leaf_chunks(rewrite.nodes, tail, max(1, self.settings.leaf_chunk_size),
                             min_tokens=self.target.run_tokens if self.target is not None else None)
        if not chunks:
            return False
        rewrite.load_messages([i for chunk in chunks for i in chunk])
        requests = []
        for chunk in chunks:
            source_tokens = sum(rewrite.nodes[i].tokens for i in chunk)
            requests.append(SummaryRequest(kind="leaf", sources=rewrite.render(chunk),
                                           target_tokens=max(64, source_tokens // 3),
                                           previous_summary=rewrite.summary_before(chunk[0]), focus=self.focus))
        made = await self._summarize_all(requests)
        rewrite.replace(chunks, [("leaf", m.text, 0) for m in made], [m.writer for m in made])
        return True

    async def _condensed_pass(self) -> bool:
        rewrite = self.rewrite
        tail = protected_tail_start(rewrite.nodes, self.fresh_tail)
        groups = condensed_groups(rewrite.nodes, tail, max(2, self.settings.condensed_min_fanout))
        if not groups:
            return False
        requests = []
        for group in groups:
            source_tokens = sum(rewrite.nodes[i].tokens for i in group)
            requests.append(SummaryRequest(kind="condensed", sources=rewrite.render(group),
                                           target_tokens=max(64, source_tokens // 2),
                                           previous_summary=rewrite.summary_before(group[0]), focus=self.focus))
        made = await self._summarize_all(requests)
        rewrite.replace(groups, [("condensed", m.text, rewrite.nodes[group[0]].depth + 1)
                                 for group, m in zip(groups, made, strict=True)], [m.writer for m in made])
        return True

    # Handoff

    async def _handoff(self, supplied: str | None) -> bool:
        rewrite = self.rewrite
        nodes = rewrite.nodes
        turn_start, tail_start = handoff_span(nodes, self.fresh_tail, self.keep_recent_tokens)
        replaced = [i for i in range(tail_start) if not nodes[i].anchored]
        if not replaced or (len(replaced) == 1 and nodes[replaced[0]].summary_kind == "handoff"
                            and supplied is None):
            return False
        rewrite.load_messages(replaced)
        previous_index = next((i for i in range(turn_start - 1, -1, -1) if nodes[i].summary_kind == "handoff"),
                              None)
        previous = rewrite.content(nodes[previous_index].ref_id) if previous_index is not None else None
        history = [i for i in range(turn_start) if i != previous_index and not nodes[i].anchored]
        prefix = [i for i in range(turn_start, tail_start) if not nodes[i].anchored] \
            if 0 < turn_start < tail_start else []
        if not prefix:
            history = [i for i in replaced if i != previous_index]
        if supplied is not None:
            text, writer = supplied.strip(), self.summarizer.name
        else:
            text, writer = await self._handoff_text(history, prefix, previous)
        depth = max((nodes[i].depth + 1 for i in replaced if nodes[i].kind == "summary"), default=0)
        rewrite.replace([replaced], [("handoff", text, depth)], [writer])
        return True

    async def _handoff_text(self, history: list[int], prefix: list[int], previous: str | None) -> tuple[str, str]:
        """The handoff summary's text and the summarizer that wrote it (of its main part, when two did)."""
        rewrite = self.rewrite
        source_tokens = sum(rewrite.nodes[i].tokens for i in history + prefix)
        target = min(max(source_tokens // 4, 600), 6000)
        requests = []
        if history or previous is None:
            requests.append(SummaryRequest(kind="handoff", sources=rewrite.render(history), target_tokens=target,
                                           previous_summary=strip_footer(previous) if previous else None,
                                           focus=self.focus))
        if prefix:
            prefix_tokens = sum(rewrite.nodes[i].tokens for i in prefix)
            requests.append(SummaryRequest(kind="leaf", sources=rewrite.render(prefix),
                                           target_tokens=max(64, min(prefix_tokens // 3, 2000)), focus=self.focus))
        made = await self._summarize_all(requests)
        main = made[0].text if history or previous is None else strip_footer(previous or "")
        text = f"{main}\n\n{SPLIT_TURN_HEADING}\n{made[-1].text}" if prefix else main
        return text, made[0].writer

    async def _summarize_all(self, requests: list[SummaryRequest]) -> list[EscalatedSummary]:
        """Summaries for every request, concurrently (the summarizer bounds concurrency); all or none."""
        self.planned += len(requests)
        self.progress(self.done, self.planned)

        async def one(request: SummaryRequest) -> EscalatedSummary:
            outcome = await summarize_with_escalation(self.summarizer, self.fallback, request,
                                                      self.fall_back_on_failure)
            self.calls += outcome.calls
            self.done += 1
            self.progress(self.done, self.planned)
            return outcome

        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(one(request)) for request in requests]
        except ExceptionGroup as failures:
            raise failures.exceptions[0] from None  # the rest were cancelled because of it
        return [task.result() for task in tasks]
