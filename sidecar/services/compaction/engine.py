"""One compaction of one session: plan passes, summarize, and apply everything in one transaction.

All summaries are computed first against an in-memory copy of the context;
the store is written once, at the end. Cancellation or a summarizer failure
before that leaves the session exactly as it was.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import attrs

from sidecar.engine.assembly import (
    PruneRule,
    context_total,
    is_prunable,
    prune_candidates,
    pruned_total,
)
from sidecar.engine.compaction_plan import (
    Node,
    condensed_groups,
    handoff_span,
    leaf_chunks,
    nothing_to_compact,
    protected_tail_start,
)
from sidecar.engine.files import strip_footer
from sidecar.engine.footer import carried_footer
from sidecar.engine.rules import footer_rules
from sidecar.engine.summaries import summary_message_tokens
from sidecar.engine.usage import compaction_threshold
from sidecar.rows import AgentCompactionRow, ItemRow, SessionRow, SourceMessage, StorageFailure, SummaryRow, iso, utcnow
from sidecar.services.state import Sidecar
from sidecar.storage.lineage import ReplacedSpan
from sidecar.summarizers.base import SourceText, Summarizer, SummaryRequest
from sidecar.summarizers.deterministic import DeterministicSummarizer
from sidecar.summarizers.escalation import summarize_with_escalation

MAX_SOURCE_CHARS = 16_000
"""One source's text as given to the summarizer; the rest stays in the store, one expand away."""
SPLIT_TURN_HEADING = "## Turn Context (split turn)"

Progress = Callable[[int, int], None]


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


@attrs.define
class _Stats:
    earliest: datetime | None
    latest: datetime | None
    messages: int


class Compaction:
    """Compacts one session once, in one of the modes of docs/protocol.md (``context/compact``)."""

    def __init__(self, sidecar: Sidecar, session_id: str, mode: str, focus: str | None,
                 summarizer: Summarizer, progress: Progress | None = None) -> None:
        self.sidecar = sidecar
        self.session_id = session_id
        self.mode = mode
        self.focus = focus or None
        self.summarizer = summarizer
        self.fallback = DeterministicSummarizer()
        self.progress = progress or (lambda done, planned: None)
        self.settings = sidecar.settings.compaction
        self.nodes: list[Node] = []
        self.loaded: list[Node] = []
        """The context as read, before any replacement."""
        self.loaded_items: list[ItemRow] = []
        self.calibration = 1.0
        self.frontier = 0
        """The prune frontier as loaded."""
        self.unchanged_tokens = 0
        """Tokens of the leading items the rewrite leaves as they were (set by _apply)."""
        self.messages: dict[int, SourceMessage] = {}
        """Loaded messages by seq, which is their context position."""
        self.contents: dict[str, str] = {}
        self.stats: dict[str, _Stats] = {}
        self.rules: dict[str, tuple[list[str], list[str]]] = {}
        """Per summary: (rules it carries, rules its cap left out)."""
        self.raws: dict[int, str] = {}
        """Verbatim JSON of loaded messages with tool calls, by seq: the files footer reads their arguments."""
        self.new_summaries: list[SummaryRow] = []
        self.sources: list[tuple[str, list[tuple[str, str]]]] = []
        """Per new summary: what it replaced, in order, as (kind, id)."""
        self.summarizer_name = summarizer.name
        """What new summaries record as their summarizer (an agent's name for its own compaction)."""
        self.calls = 0
        self.db_seconds = 0.0
        self.done = 0
        self.planned = 0

    def _timed(self, work: Callable[[], Any]) -> Any:
        """``work()`` (database reads and writes), its time added to ``db_seconds`` ("ms in the database")."""
        started = time.perf_counter()
        try:
            return work()
        finally:
            self.db_seconds += time.perf_counter() - started

    def load(self) -> SessionRow:
        """Read the session's current context, with the summaries in it."""
        store = self.sidecar.store()
        session = self._timed(lambda: self.sidecar.session(self.session_id))
        items = self._timed(lambda: store.context(session))
        summary_ids = [item.ref_id for item in items if item.kind == "summary"]
        summaries = self._timed(lambda: store.summaries(self.session_id, summary_ids)) if summary_ids else {}
        for row in summaries.values():
            self._remember(row)
        anchored = self._timed(lambda: store.anchors(session)).positions
        pairs = [(item, summaries.get(item.ref_id) if item.kind == "summary" else None) for item in items]
        self.nodes = [Node.of(item, row.depth, row.kind) if row else Node.of(item, anchored=item.position in anchored)
                      for item, row in pairs]
        self.calibration = session.calibration
        self.frontier = session.pruned_upto
        self.loaded = list(self.nodes)
        self.loaded_items = items
        return session

    def loaded_context(self) -> tuple[list[ItemRow], bool]:
        """The context as loaded, as items for ``Sidecar.estimated_tokens``: no need to read it again."""
        return self.loaded_items, True

    def message_count(self) -> int:
        """Messages and summaries in the current context, as willCompact reports them."""
        return len(self.nodes)

    async def run(self, supplied_summary: str | None = None, tokens_before: int | None = None) -> Outcome:
        """Compact; ``supplied_summary`` (from a client hook) replaces the summarizer for a handoff."""
        session = self._timed(lambda: self.sidecar.session(self.session_id)) if self.nodes else self.load()
        before = tokens_before if tokens_before is not None else \
            self._timed(lambda: self.sidecar.estimated_tokens(session))
        # The context as assemble sends it now: the coalesced prune step is part of this rewrite's savings.
        raw_before = self._loaded_tokens(session)
        if supplied_summary is not None:
            self.mode = "handoff"  # the client's text stands for everything before the tail, as a handoff does
        if self.mode == "handoff":
            rounds = 1 if await self._handoff(supplied_summary) else 0
        else:
            rounds = await self._dag_rounds(session)
        if not self.new_summaries:
            settings = self.settings
            return self._outcome(False, before, before, 0, nothing_to_compact(
                self.nodes, self.mode, settings.fresh_tail, settings.keep_recent_tokens, settings.leaf_chunk_size,
                settings.condensed_min_fanout))
        virtual_after = self._virtual_tokens()
        if virtual_after >= raw_before:
            return self._outcome(False, before, before, rounds, "no progress: the summaries would not make the "
                                 "context smaller")
        min_savings = self.settings.min_savings
        if raw_before - virtual_after < min_savings * raw_before:
            return self._outcome(False, before, before, rounds,
                                 f"not worth a rewrite: it would save {raw_before - virtual_after:,} of "
                                 f"{raw_before:,} tokens, less than compaction.minSavings ({min_savings:.0%})")
        # No await from here to the write: a pin can no longer slip in between.
        self._keep_newly_anchored()
        self._apply()
        after = self._timed(self._tokens_after)
        handoff = next((s.content for s in self.new_summaries if s.kind == "handoff"), None)
        outcome = self._outcome(True, before, after, rounds, None, handoff)
        outcome.tokens_rewritten = max(0, after - self.unchanged_tokens)
        return outcome

    async def record(self, agent: AgentCompactionRow, summary: str, upto: int | None,
                     tokens_before: int | None = None) -> Outcome:
        """An agent's own compaction: its summary, as a handoff summary, replaces every item up to position ``upto``
        (the whole context when None) but system and pinned messages.

        No savings check: the agent has compacted already, and the session mirrors its context.
        """
        session = self._timed(lambda: self.sidecar.session(self.session_id)) if self.nodes else self.load()
        before = tokens_before if tokens_before is not None else \
            self._timed(lambda: self.sidecar.estimated_tokens(session))
        self.mode, self.summarizer_name = "handoff", agent.source
        replaced = [i for i, node in enumerate(self.nodes)
                    if (upto is None or node.position <= upto) and not node.anchored]
        if not replaced:
            return self._outcome(False, before, before, 0, "nothing to replace: the session holds no message "
                                 "before the compaction but system or pinned ones")
        self._load_messages(replaced)
        depth = max((self.nodes[i].depth + 1 for i in replaced if self.nodes[i].kind == "summary"), default=0)
        self._replace([replaced], [("handoff", summary.strip(), depth)])
        self._keep_newly_anchored()
        self._apply(attrs.evolve(agent, summary_id=self.new_summaries[0].id))
        after = self._timed(self._tokens_after)
        outcome = self._outcome(True, before, after, 1, None, self.new_summaries[0].content)
        outcome.tokens_rewritten = max(0, after - self.unchanged_tokens)
        return outcome

    def _tokens_after(self) -> int:
        session = self.sidecar.session(self.session_id)
        # Unless messages were ingested meanwhile, the context is exactly the in-memory nodes.
        unchanged = session.last_position == self.loaded[-1].position and session.context_count == len(self.nodes)
        tail = ([node.item() for node in self.nodes], True) if unchanged else None
        return self.sidecar.estimated_tokens(session, tail=tail)

    def _outcome(self, compacted: bool, before: int, after: int, rounds: int, reason: str | None,
                 summary: str | None = None) -> Outcome:
        top = {node.ref_id for node in self.nodes if node.kind == "summary"}
        return Outcome(compacted=compacted, mode=self.mode, tokens_before=before, tokens_after=after, rounds=rounds,
                       summary_ids=[s.id for s in self.new_summaries if s.id in top] if compacted else [],
                       reason=reason, summary=summary, calls=self.calls, db_seconds=self.db_seconds,
                       message_count=len(self.nodes))

    def _loaded_tokens(self, session: SessionRow) -> int:
        """The loaded context's size as assemble sends it: pruned up to the frontier, or the step now due."""
        if not self.sidecar.settings.prune.enabled:
            return context_total(self.loaded, None, self.calibration)
        rule = self.sidecar.prune_rule()
        frontier = self._timed(lambda: self.sidecar.prune_state(session)).frontier
        pruned = [node for node in self.loaded
                  if node.position <= frontier and is_prunable(node, rule) and not node.anchored]
        total = context_total(self.loaded, None, self.calibration)
        return pruned_total(total, len(pruned), sum(node.tokens for node in pruned), rule, self.calibration)

    def _virtual_tokens(self, whole: bool = False) -> int:
        """The in-memory context's size as usage would report it (pruned when pruning is on, unless ``whole``)."""
        rule = self.sidecar.prune_rule() if self.sidecar.settings.prune.enabled and not whole else None
        return context_total(self.nodes, rule, self.calibration, self.frontier,
                             frozenset(node.position for node in self.nodes if node.anchored))

    # Leaf and condensed passes

    async def _dag_rounds(self, session: SessionRow) -> int:
        threshold = compaction_threshold(self.sidecar.context_window(session), self.settings)
        counts_pruned = not self.sidecar.settings.prune.postpone_compaction  # pruned outputs count whole, as in usage
        rounds = 0
        max_rounds = self.settings.max_rounds if self.mode == "full" else 1
        while rounds < max_rounds:
            before = self._virtual_tokens()
            changed = await self._leaf_pass()
            changed = await self._condensed_pass() or changed
            rounds += 1
            if not changed or self._virtual_tokens() >= before:
                break
            if self.mode != "full" or self._virtual_tokens(whole=counts_pruned) < threshold:
                break
        return rounds

    async def _leaf_pass(self) -> bool:
        tail = protected_tail_start(self.nodes, self.settings.fresh_tail)
        chunks = leaf_chunks(self.nodes, tail, max(1, self.settings.leaf_chunk_size))
        if not chunks:
            return False
        self._load_messages([i for chunk in chunks for i in chunk])
        requests = []
        for chunk in chunks:
            previous = self._summary_before(chunk[0])
            source_tokens = sum(self.nodes[i].tokens for i in chunk)
            requests.append(SummaryRequest(kind="leaf", sources=self._render(chunk),
                                           target_tokens=max(64, source_tokens // 3),
                                           previous_summary=previous, focus=self.focus))
        texts = await self._summarize_all(requests)
        self._replace(chunks, [("leaf", text, 0) for text in texts])
        return True

    async def _condensed_pass(self) -> bool:
        tail = protected_tail_start(self.nodes, self.settings.fresh_tail)
        groups = condensed_groups(self.nodes, tail, max(2, self.settings.condensed_min_fanout))
        if not groups:
            return False
        requests = []
        for group in groups:
            source_tokens = sum(self.nodes[i].tokens for i in group)
            requests.append(SummaryRequest(kind="condensed", sources=self._render(group),
                                           target_tokens=max(64, source_tokens // 2),
                                           previous_summary=self._summary_before(group[0]), focus=self.focus))
        texts = await self._summarize_all(requests)
        self._replace(groups, [("condensed", text, self.nodes[group[0]].depth + 1)
                               for group, text in zip(groups, texts, strict=True)])
        return True

    def _summary_before(self, index: int) -> str | None:
        """The content of the summary just before ``index`` that existed before this pass, for continuity."""
        for node in reversed(self.nodes[:index]):
            if node.kind == "summary":
                return strip_footer(self._content(node.ref_id))
            if node.kind == "message":
                return None
        return None

    # Handoff

    async def _handoff(self, supplied: str | None) -> bool:
        turn_start, tail_start = handoff_span(self.nodes, self.settings.fresh_tail, self.settings.keep_recent_tokens)
        replaced = [i for i in range(tail_start) if not self.nodes[i].anchored]
        if not replaced or (len(replaced) == 1 and self.nodes[replaced[0]].summary_kind == "handoff"
                            and supplied is None):
            return False
        self._load_messages(replaced)
        previous_index = next((i for i in range(turn_start - 1, -1, -1) if self.nodes[i].summary_kind == "handoff"),
                              None)
        previous = self._content(self.nodes[previous_index].ref_id) if previous_index is not None else None
        history = [i for i in range(turn_start) if i != previous_index and not self.nodes[i].anchored]
        prefix = [i for i in range(turn_start, tail_start) if not self.nodes[i].anchored] \
            if 0 < turn_start < tail_start else []
        if not prefix:
            history = [i for i in replaced if i != previous_index]
        if supplied is not None:
            text = supplied.strip()
        else:
            text = await self._handoff_text(history, prefix, previous)
        depth = max((self.nodes[i].depth + 1 for i in replaced if self.nodes[i].kind == "summary"), default=0)
        self._replace([replaced], [("handoff", text, depth)])
        return True

    async def _handoff_text(self, history: list[int], prefix: list[int], previous: str | None) -> str:
        source_tokens = sum(self.nodes[i].tokens for i in history + prefix)
        target = min(max(source_tokens // 4, 600), 6000)
        requests = []
        if history or previous is None:
            requests.append(SummaryRequest(kind="handoff", sources=self._render(history), target_tokens=target,
                                           previous_summary=strip_footer(previous) if previous else None,
                                           focus=self.focus))
        if prefix:
            prefix_tokens = sum(self.nodes[i].tokens for i in prefix)
            requests.append(SummaryRequest(kind="leaf", sources=self._render(prefix),
                                           target_tokens=max(64, min(prefix_tokens // 3, 2000)), focus=self.focus))
        texts = await self._summarize_all(requests)
        main = texts[0] if history or previous is None else strip_footer(previous or "")
        return f"{main}\n\n{SPLIT_TURN_HEADING}\n{texts[-1]}" if prefix else main

    def _load_raws(self, groups: Sequence[Sequence[int]]) -> None:
        """Read the verbatim JSON of the groups' messages with tool calls: only those name files."""
        seqs = [self.nodes[i].position for group in groups for i in group
                if self.nodes[i].kind == "message" and self.nodes[i].tool_call_ids
                and self.nodes[i].position not in self.raws]
        if seqs:
            store = self.sidecar.store()
            self.raws.update(self._timed(lambda: store.message_raws(self.session_id, seqs)))

    # Shared machinery

    async def _summarize_all(self, requests: list[SummaryRequest]) -> list[str]:
        """Summaries for every request, concurrently (the summarizer bounds concurrency); all or none."""
        self.planned += len(requests)
        self.progress(self.done, self.planned)

        async def one(request: SummaryRequest) -> str:
            outcome = await summarize_with_escalation(self.summarizer, self.fallback, request)
            self.calls += outcome.calls
            self.done += 1
            self.progress(self.done, self.planned)
            return outcome.text

        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(one(request)) for request in requests]
        except ExceptionGroup as failures:
            raise failures.exceptions[0] from None  # the rest were cancelled because of it
        return [task.result() for task in tasks]

    def _load_messages(self, indexes: Sequence[int]) -> None:
        wanted = sorted(i for i in set(indexes)
                        if self.nodes[i].kind == "message" and self.nodes[i].position not in self.messages)
        # Runs of adjacent context messages are seq ranges that hold no other message of the session.
        spans: list[tuple[int, int]] = []
        for number, index in enumerate(wanted):
            position = self.nodes[index].position
            if number and index == wanted[number - 1] + 1:
                spans[-1] = (spans[-1][0], position)
            else:
                spans.append((position, position))
        store = self.sidecar.store()
        found = self._timed(lambda: store.source_messages(self.session_id, spans))
        seqs = {self.nodes[i].position for i in wanted}
        self.messages.update({message.seq: message for message in found if message.seq in seqs})

    def _content(self, summary_id: str) -> str:
        if summary_id not in self.contents:
            store = self.sidecar.store()
            self._remember(self._timed(lambda: store.summary(self.session_id, summary_id)))
        return self.contents[summary_id]

    def _remember(self, row: SummaryRow) -> None:
        self.contents[row.id] = row.content
        self.stats[row.id] = _Stats(row.earliest_at, row.latest_at, row.message_count)
        rules = row.rules if row.rules is not None else footer_rules(row.content)
        self.rules[row.id] = (list(rules), list(row.rules_left_out or ()))

    def _render(self, indexes: Sequence[int]) -> tuple[SourceText, ...]:
        sources = []
        for index in indexes:
            node = self.nodes[index]
            if node.kind == "summary":
                text = strip_footer(self._content(node.ref_id))  # code carries the footer, not the summarizer
                stats = self.stats[node.ref_id]
                label = f"summary ({node.summary_kind}, depth {node.depth})"
                sources.append(SourceText(label=label, text=text, at=iso(stats.latest)))
                continue
            stored = self.messages[node.position]
            text = stored.text  # message_text() of the message, stored at ingest
            if len(text) > MAX_SOURCE_CHARS:
                text = f"{text[:MAX_SOURCE_CHARS]}\n[… {len(text) - MAX_SOURCE_CHARS} more characters]"
            label = node.role
            if node.role == "tool":
                label = f"tool result ({node.tool_name or 'tool'})"
            elif node.tool_call_ids:
                label = "assistant (tool calls)"
            sources.append(SourceText(label=label, text=text, at=iso(stored.message_at)))
        return tuple(sources)

    def _stats_of(self, node: Node) -> _Stats:
        if node.kind == "summary":
            self._content(node.ref_id)
            return self.stats[node.ref_id]
        stored = self.messages[node.position]
        return _Stats(stored.message_at, stored.message_at, 1)

    def _replace(self, groups: list[list[int]], made: list[tuple[str, str, int]]) -> None:
        """Swap each group of nodes for a new summary node, recording lineage."""
        self._load_raws(groups)
        first_of = {group[0]: (group, spec) for group, spec in zip(groups, made, strict=True)}
        dropped = {i for group in groups for i in group}
        nodes: list[Node] = []
        for index, node in enumerate(self.nodes):
            if index in first_of:
                group, (kind, content, depth) = first_of[index]
                nodes.append(self._new_summary(group, kind, content, depth))
            elif index not in dropped:
                nodes.append(node)
        self.nodes = nodes

    def _new_summary(self, group: list[int], kind: str, text: str, depth: int) -> Node:
        members = [self.nodes[i] for i in group]
        stats = [self._stats_of(node) for node in members]
        texts = {node.position: self.messages[node.position].text for node in members if node.kind == "message"}
        footer, rules, left_out = carried_footer(
            members, lambda ref: (self._content(ref), *self.rules[ref]), self.raws, texts)
        content = f"{text.rstrip()}\n\n{footer}" if footer else text
        summary_id = f"sum_{uuid.uuid4().hex[:24]}"
        earliest = min((s.earliest for s in stats if s.earliest), default=None)
        latest = max((s.latest for s in stats if s.latest), default=None)
        tokens = summary_message_tokens(summary_id, kind, depth, iso(earliest), iso(latest), content)
        row = SummaryRow(id=summary_id, kind=kind, depth=depth, content=content, tokens=tokens,
                         source_tokens=sum(node.tokens for node in members),
                         message_count=sum(s.messages for s in stats), earliest_at=earliest, latest_at=latest,
                         summarizer=self.summarizer_name, created_at=utcnow(), rules=rules, rules_left_out=left_out)
        self.new_summaries.append(row)
        self._remember(row)
        self.sources.append((summary_id, [(node.kind, node.ref_id) for node in members]))
        return Node(position=members[0].position, kind="summary", ref_id=summary_id, role="user", tokens=tokens,
                    depth=depth, summary_kind=kind)

    def _keep_newly_anchored(self) -> None:
        """Messages pinned while the summaries were computed stay items in their place.

        A summary keeps its text (which may mention them) and lineage; it moves to the first position it
        replaces that is not pinned. One that would replace pinned messages only fails the compaction.
        """
        store = self.sidecar.store()
        session = self._timed(lambda: self.sidecar.session(self.session_id))
        anchored = self._timed(lambda: store.anchors(session)).positions
        top = {node.position for node in self.nodes}
        fresh = {node.position: node for node in self.loaded
                 if node.position in anchored and not node.anchored and node.position not in top}
        if not fresh:
            return
        new_ids = {summary.id for summary in self.new_summaries}
        nodes = list(self.nodes)
        loaded = [node.position for node in self.loaded]
        for index, node in enumerate(self.nodes):
            if node.ref_id not in new_ids:
                continue
            end = self.nodes[index + 1].position if index + 1 < len(self.nodes) else loaded[-1] + 1
            covered = [p for p in loaded if node.position <= p < end]
            rest = [p for p in covered if p not in fresh]
            if not rest:
                raise StorageFailure("the context changed during compaction: every message a summary "
                                     "replaces was pinned")
            nodes[index] = attrs.evolve(node, position=rest[0])
            nodes += [attrs.evolve(fresh[p], anchored=True) for p in covered if p in fresh]
        self.nodes = sorted(nodes, key=lambda node: node.position)

    def _apply(self, agent: AgentCompactionRow | None = None) -> None:
        new_ids = {s.id for s in self.new_summaries}
        # New summaries sit at the position of the first item they replace, so every stored position
        # not held by a surviving stored item was replaced.
        kept = {node.position for node in self.nodes if node.ref_id not in new_ids}
        added = [(node.position, node.ref_id, node.tokens) for node in self.nodes if node.ref_id in new_ids]
        gone = [node for node in self.loaded if node.position not in kept]
        first, last = gone[0].position, gone[-1].position
        rule = self.sidecar.prune_rule()
        prunable = [node for node in gone if is_prunable(node, rule)]
        replaced = ReplacedSpan(first=first, last=last,
                            kept=tuple(node.position for node in self.loaded if first < node.position < last
                                       and node.position in kept),
                            count=len(gone), tokens=sum(node.tokens for node in gone), prunable_count=len(prunable),
                            prunable_tokens=sum(node.tokens for node in prunable))
        pruned = self._prune_frontier(rule)
        store = self.sidecar.store()
        self._timed(lambda: store.apply_compaction(self.session_id, self.new_summaries, self.sources, replaced, added,
                                                   pruned, agent))

    def _prune_frontier(self, rule: PruneRule) -> tuple[int, int, int]:
        """The prune step this rewrite takes along (any amount: the prompt changes anyway), as (frontier, count,
        raw tokens) of the new context; also notes the tokens of the leading items left unchanged."""
        frontier = max(self.frontier, self.sidecar.session(self.session_id).pruned_upto)
        if self.sidecar.settings.prune.enabled:
            positions, _ = prune_candidates(self.nodes, rule, self.calibration, frontier,
                                            frozenset(node.position for node in self.nodes if node.anchored))
            frontier = max([frontier, *positions])
        new_ids = {s.id for s in self.new_summaries}
        first_changed = min(node.position for node in self.nodes if node.ref_id in new_ids)
        count = tokens = unchanged = 0
        for node in self.nodes:
            pruned = node.position <= frontier and is_prunable(node, rule)
            if pruned:  # the stored totals count anchored outputs too; they are never pruned all the same
                count += 1
                tokens += node.tokens
                if node.position > self.frontier and not node.anchored:
                    first_changed = min(first_changed, node.position)
        for node in self.nodes:
            if node.position >= first_changed:
                break
            pruned = node.position <= self.frontier and is_prunable(node, rule) and not node.anchored \
                and self.sidecar.settings.prune.enabled
            unchanged += rule.placeholder_tokens if pruned else math.ceil(node.tokens * self.calibration)
        self.unchanged_tokens = unchanged
        return frontier, count, tokens

