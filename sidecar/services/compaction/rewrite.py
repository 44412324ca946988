"""A session's context as one compaction read it, rewritten in memory and written back in one transaction.

The compaction (``engine``) decides what to summarize and asks the summarizer; this is what it works on:
the context's items as nodes, the sources it reads for the summarizer, each group of nodes replaced by a
new summary with its footer and lineage, and the one write that applies it all.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import attrs

from sidecar.engine.assembly import PruneRule, context_total, is_prunable, prune_candidates, pruned_total
from sidecar.engine.compaction_plan import Node
from sidecar.engine.files import strip_footer
from sidecar.engine.footer import carried_footer
from sidecar.engine.rules import footer_rules
from sidecar.engine.summaries import summary_message_tokens
from sidecar.rows import (
    AgentCompactionRow,
    ItemRow,
    ReplacedSpan,
    SessionRow,
    SourceMessage,
    StorageFailure,
    SummaryRow,
    iso,
    utcnow,
)
from sidecar.services.state import Sidecar
from sidecar.summarizers.base import SourceText

MAX_SOURCE_CHARS = 16_000
"""One source's text as given to the summarizer; the rest stays in the store, one expand away."""


@attrs.define
class _Stats:
    earliest: datetime | None
    latest: datetime | None
    messages: int


class Rewrite:
    """One session's context, loaded once, rewritten in memory, applied once."""

    def __init__(self, sidecar: Sidecar, session_id: str, summarizer_name: str) -> None:
        self.sidecar = sidecar
        self.session_id = session_id
        self.summarizer_name = summarizer_name
        """What new summaries record as their summarizer (an agent's name for its own compaction)."""
        self.nodes: list[Node] = []
        """The context as it is being rewritten."""
        self.loaded: list[Node] = []
        """The context as read, before any replacement."""
        self.loaded_items: list[ItemRow] = []
        self.calibration = 1.0
        self.frontier = 0
        """The prune frontier as loaded."""
        self.unchanged_tokens = 0
        """Tokens of the leading items the rewrite leaves as they were (set by ``apply``)."""
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
        self.db_seconds = 0.0

    def timed(self, work: Callable[[], Any]) -> Any:
        """``work()`` (database reads and writes), its time added to ``db_seconds`` ("ms in the database")."""
        started = time.perf_counter()
        try:
            return work()
        finally:
            self.db_seconds += time.perf_counter() - started

    def session(self) -> SessionRow:
        """The session as stored now."""
        return self.timed(lambda: self.sidecar.session(self.session_id))

    def load(self) -> SessionRow:
        """Read the session's current context, with the summaries in it."""
        store = self.sidecar.store()
        session = self.session()
        items = self.timed(lambda: store.context(session))
        summary_ids = [item.ref_id for item in items if item.kind == "summary"]
        summaries = self.timed(lambda: store.summaries(self.session_id, summary_ids)) if summary_ids else {}
        for row in summaries.values():
            self._remember(row)
        anchored = self.timed(lambda: store.anchors(session)).positions
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

    # Token figures

    def tokens_after(self) -> int:
        """The context's size as usage reports it, once applied."""
        return self.timed(self._tokens_after)

    def _tokens_after(self) -> int:
        session = self.sidecar.session(self.session_id)
        # Unless messages were ingested meanwhile, the context is exactly the in-memory nodes.
        unchanged = session.last_position == self.loaded[-1].position and session.context_count == len(self.nodes)
        tail = ([node.item() for node in self.nodes], True) if unchanged else None
        return self.sidecar.estimated_tokens(session, tail=tail)

    def loaded_tokens(self, session: SessionRow) -> int:
        """The loaded context's size as assemble sends it: pruned up to the frontier, or the step now due."""
        if not self.sidecar.settings.prune.enabled:
            return context_total(self.loaded, None, self.calibration)
        rule = self.sidecar.prune_rule()
        frontier = self.timed(lambda: self.sidecar.prune_state(session)).frontier
        pruned = [node for node in self.loaded
                  if node.position <= frontier and is_prunable(node, rule) and not node.anchored]
        total = context_total(self.loaded, None, self.calibration)
        return pruned_total(total, len(pruned), sum(node.tokens for node in pruned), rule, self.calibration)

    def virtual_tokens(self, whole: bool = False) -> int:
        """The in-memory context's size as usage would report it (pruned when pruning is on, unless ``whole``)."""
        rule = self.sidecar.prune_rule() if self.sidecar.settings.prune.enabled and not whole else None
        return context_total(self.nodes, rule, self.calibration, self.frontier,
                             frozenset(node.position for node in self.nodes if node.anchored))

    # What the summarizer reads

    def load_messages(self, indexes: Sequence[int]) -> None:
        """Read the messages among the nodes at ``indexes`` that are not read yet."""
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
        found = self.timed(lambda: store.source_messages(self.session_id, spans))
        seqs = {self.nodes[i].position for i in wanted}
        self.messages.update({message.seq: message for message in found if message.seq in seqs})

    def content(self, summary_id: str) -> str:
        """A summary's text, read once."""
        if summary_id not in self.contents:
            store = self.sidecar.store()
            self._remember(self.timed(lambda: store.summary(self.session_id, summary_id)))
        return self.contents[summary_id]

    def _remember(self, row: SummaryRow) -> None:
        self.contents[row.id] = row.content
        self.stats[row.id] = _Stats(row.earliest_at, row.latest_at, row.message_count)
        rules = row.rules if row.rules is not None else footer_rules(row.content)
        self.rules[row.id] = (list(rules), list(row.rules_left_out or ()))

    def render(self, indexes: Sequence[int]) -> tuple[SourceText, ...]:
        """The nodes at ``indexes`` as the summarizer reads them (their messages loaded)."""
        sources = []
        for index in indexes:
            node = self.nodes[index]
            if node.kind == "summary":
                text = strip_footer(self.content(node.ref_id))  # code carries the footer, not the summarizer
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

    def summary_before(self, index: int) -> str | None:
        """The content of the summary just before ``index`` that existed before this pass, for continuity."""
        for node in reversed(self.nodes[:index]):
            if node.kind == "summary":
                return strip_footer(self.content(node.ref_id))
            if node.kind == "message":
                return None
        return None

    # Rewriting

    def replace(self, groups: list[list[int]], made: list[tuple[str, str, int]],
                writers: Sequence[str] | None = None) -> None:
        """Swap each group of nodes for a new summary node (kind, text, depth), recording lineage and, per summary,
        the summarizer that wrote it (``summarizer_name`` when ``writers`` does not say)."""
        self._load_raws(groups)
        names = list(writers) if writers is not None else [self.summarizer_name] * len(groups)
        first_of = {group[0]: (group, spec, name) for group, spec, name in zip(groups, made, names, strict=True)}
        dropped = {i for group in groups for i in group}
        nodes: list[Node] = []
        for index, node in enumerate(self.nodes):
            if index in first_of:
                group, (kind, content, depth), name = first_of[index]
                nodes.append(self._new_summary(group, kind, content, depth, name))
            elif index not in dropped:
                nodes.append(node)
        self.nodes = nodes

    def _load_raws(self, groups: Sequence[Sequence[int]]) -> None:
        """Read the verbatim JSON of the groups' messages with tool calls: only those name files."""
        seqs = [self.nodes[i].position for group in groups for i in group
                if self.nodes[i].kind == "message" and self.nodes[i].tool_call_ids
                and self.nodes[i].position not in self.raws]
        if seqs:
            store = self.sidecar.store()
            self.raws.update(self.timed(lambda: store.message_raws(self.session_id, seqs)))

    def _stats_of(self, node: Node) -> _Stats:
        if node.kind == "summary":
            self.content(node.ref_id)
            return self.stats[node.ref_id]
        stored = self.messages[node.position]
        return _Stats(stored.message_at, stored.message_at, 1)

    def _new_summary(self, group: list[int], kind: str, text: str, depth: int, writer: str) -> Node:
        members = [self.nodes[i] for i in group]
        stats = [self._stats_of(node) for node in members]
        texts = {node.position: self.messages[node.position].text for node in members if node.kind == "message"}
        footer, rules, left_out = carried_footer(
            members, lambda ref: (self.content(ref), *self.rules[ref]), self.raws, texts)
        content = f"{text.rstrip()}\n\n{footer}" if footer else text
        summary_id = f"sum_{uuid.uuid4().hex[:24]}"
        earliest = min((s.earliest for s in stats if s.earliest), default=None)
        latest = max((s.latest for s in stats if s.latest), default=None)
        tokens = summary_message_tokens(summary_id, kind, depth, iso(earliest), iso(latest), content)
        row = SummaryRow(id=summary_id, kind=kind, depth=depth, content=content, tokens=tokens,
                         source_tokens=sum(node.tokens for node in members),
                         message_count=sum(s.messages for s in stats), earliest_at=earliest, latest_at=latest,
                         summarizer=writer, created_at=utcnow(), rules=rules, rules_left_out=left_out)
        self.new_summaries.append(row)
        self._remember(row)
        self.sources.append((summary_id, [(node.kind, node.ref_id) for node in members]))
        return Node(position=members[0].position, kind="summary", ref_id=summary_id, role="user", tokens=tokens,
                    depth=depth, summary_kind=kind)

    def keep_newly_anchored(self) -> None:
        """Messages pinned while the summaries were computed stay items in their place.

        A summary keeps its text (which may mention them) and lineage; it moves to the first position it
        replaces that is not pinned. One that would replace pinned messages only fails the compaction.
        """
        store = self.sidecar.store()
        session = self.session()
        anchored = self.timed(lambda: store.anchors(session)).positions
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

    def apply(self, agent: AgentCompactionRow | None = None) -> None:
        """Write the new summaries, their lineage and the new context in one transaction (with the record of an
        agent's own compaction, when it is one)."""
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
                                count=len(gone), tokens=sum(node.tokens for node in gone),
                                prunable_count=len(prunable), prunable_tokens=sum(node.tokens for node in prunable))
        pruned = self._prune_frontier(rule)
        store = self.sidecar.store()
        self.timed(lambda: store.apply_compaction(self.session_id, self.new_summaries, self.sources, replaced, added,
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
