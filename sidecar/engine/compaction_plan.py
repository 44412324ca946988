"""Which context items a compaction pass replaces: pure planning over the ordered context.

A leaf pass turns runs of old messages (outside the fresh tail) into leaf
summaries; a condensed pass turns runs of same-depth summaries into one
summary a level up; a handoff replaces everything before the kept tail.
Cuts never separate an assistant's tool calls from their results.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from sidecar.rows import ItemRow

MAX_LEAF_CHUNK_TOKENS = 12_000
"""Upper bound on one leaf's sources, so that one summarizer call stays a reasonable size."""
MAX_LEAF_CHUNK_FACTOR = 4
"""A leaf replaces at most this many times ``leafChunkSize`` messages, so the DAG keeps useful detail."""
MAX_CONDENSED_FANOUT = 8


@attrs.define(frozen=True)
class Node:
    """A context item as compaction sees it."""

    position: int
    kind: str
    ref_id: str
    role: str
    tokens: int
    depth: int = 0
    summary_kind: str | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None
    tool_call_ids: tuple[str, ...] | None = None
    anchored: bool = False
    """A system or pinned message (or in one's tool-call unit): never replaced, it stays an item in place."""

    @classmethod
    def of(cls, item: ItemRow, depth: int = 0, summary_kind: str | None = None, anchored: bool = False) -> Node:
        """The node of a stored context item (a summary's depth and kind are not in the item)."""
        return cls(position=item.position, kind=item.kind, ref_id=item.ref_id, role=item.role, tokens=item.tokens,
                   depth=depth, summary_kind=summary_kind, tool_name=item.tool_name, tool_call_id=item.tool_call_id,
                   tool_call_ids=item.tool_call_ids, anchored=anchored)

    def item(self) -> ItemRow:
        """The node as a context item, as usage and assembly take them."""
        return ItemRow(self.position, self.kind, self.ref_id, self.role, self.tokens, self.tool_name,
                       self.tool_call_id, self.tool_call_ids)


def unit_starts(nodes: Sequence[Node]) -> list[bool]:
    """For each node, whether a cut may fall just before it: no call before it is answered at or after it."""
    starts = [True] * len(nodes)
    owner: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for call_id in node.tool_call_ids or ():
            owner[call_id] = index
        if node.kind == "message" and node.role == "tool" and node.tool_call_id in owner:
            for inside in range(owner[node.tool_call_id] + 1, index + 1):
                starts[inside] = False
    return starts


def protected_tail_start(nodes: Sequence[Node], fresh_tail: int, keep_tokens: int = 0) -> int:
    """Index of the first node of the kept tail: the last ``fresh_tail`` messages and ``keep_tokens`` tokens."""
    starts = unit_starts(nodes)
    messages_seen = 0
    tokens_seen = 0
    cut = len(nodes)
    for index in range(len(nodes) - 1, -1, -1):
        if messages_seen >= fresh_tail and tokens_seen >= keep_tokens:
            break
        if nodes[index].kind == "message":
            messages_seen += 1
        tokens_seen += nodes[index].tokens
        cut = index
    while 0 < cut < len(nodes) and not starts[cut]:
        cut -= 1
    return cut


def fresh_tail_within(nodes: Sequence[Node], fresh_tail: int, max_tokens: int) -> int:
    """How many of the newest messages a compaction keeps: ``fresh_tail``, fewer when those hold more than
    ``max_tokens`` (counting what lies between them), but at least the newest one."""
    count = tokens = 0
    for node in reversed(nodes):
        if count >= fresh_tail:
            break
        tokens += node.tokens
        if node.kind != "message":
            continue
        if count and tokens > max_tokens:
            return count
        count += 1
    return fresh_tail


def leaf_chunks(nodes: Sequence[Node], tail_start: int, min_size: int,
                max_tokens: int = MAX_LEAF_CHUNK_TOKENS, min_tokens: int | None = None) -> list[list[int]]:
    """Runs of messages before the tail, split at safe cuts into chunks of at least ``min_size`` messages; a
    shorter run holding ``min_tokens`` or more (a few huge tool outputs) is summarized too, in chunks of any size.

    Anchored messages end a run: they are never in a chunk.
    """
    starts = unit_starts(nodes)
    chunks: list[list[int]] = []
    run: list[int] = []
    for index in range(tail_start + 1):
        if index < tail_start and nodes[index].kind == "message" and not nodes[index].anchored:
            run.append(index)
            continue
        size = min_size
        if len(run) < min_size and min_tokens is not None and sum(nodes[i].tokens for i in run) >= min_tokens:
            size = 1
        chunks.extend(_split_run(run, nodes, starts, size, max_tokens))
        run = []
    return chunks


def _split_run(run: list[int], nodes: Sequence[Node], starts: list[bool], min_size: int,
               max_tokens: int) -> list[list[int]]:
    if len(run) < min_size:
        return []
    chunks: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for index in run:
        big_enough = len(current) >= min_size and (
            tokens + nodes[index].tokens > max_tokens or len(current) >= MAX_LEAF_CHUNK_FACTOR * min_size)
        if current and starts[index] and big_enough:
            chunks.append(current)
            current, tokens = [], 0
        current.append(index)
        tokens += nodes[index].tokens
    if chunks and (len(current) < min_size or not starts[current[0]]):
        chunks[-1].extend(current)
    else:
        chunks.append(current)
    # A chunk must end on a unit boundary: the next node may not be a result of a call inside it.
    last = chunks[-1][-1]
    while last + 1 < len(nodes) and not starts[last + 1] and chunks[-1]:
        chunks[-1].pop()
        last = chunks[-1][-1] if chunks[-1] else -1
    return [chunk for chunk in chunks if len(chunk) >= min_size]


def condensed_groups(nodes: Sequence[Node], tail_start: int, min_fanout: int,
                     max_fanout: int = MAX_CONDENSED_FANOUT) -> list[list[int]]:
    """Runs of adjacent leaf/condensed summaries of one depth before the tail, in groups of ``min_fanout``+."""
    groups: list[list[int]] = []
    run: list[int] = []

    def flush() -> None:
        for offset in range(0, len(run), max_fanout):
            group = run[offset: offset + max_fanout]
            if len(group) >= min_fanout:
                groups.append(group)
            elif groups and groups[-1][-1] + 1 == group[0] and len(groups[-1]) + len(group) <= 2 * max_fanout:
                groups[-1].extend(group)

    for index in range(tail_start):
        node = nodes[index]
        condensable = node.kind == "summary" and node.summary_kind in ("leaf", "condensed")
        if condensable and run and nodes[run[-1]].depth == node.depth:
            run.append(index)
            continue
        flush()
        run = [index] if condensable else []
    flush()
    return groups


def handoff_span(nodes: Sequence[Node], fresh_tail: int, keep_tokens: int) -> tuple[int, int]:
    """(turn_start, tail_start): what a handoff replaces is ``nodes[:tail_start]``.

    When the tail starts inside a turn (not at a user message), ``turn_start`` is that turn's user
    message, so its prefix can be summarized separately; otherwise both are equal.
    """
    tail_start = protected_tail_start(nodes, fresh_tail, keep_tokens)
    turn_start = tail_start
    if 0 < tail_start < len(nodes) and not _starts_turn(nodes[tail_start]):
        for index in range(tail_start - 1, -1, -1):
            if _starts_turn(nodes[index]):
                turn_start = index
                break
            if nodes[index].kind == "summary":
                break
    return turn_start, tail_start


def _starts_turn(node: Node) -> bool:
    return node.kind == "message" and node.role == "user"


def nothing_to_compact(nodes: Sequence[Node], mode: str, fresh_tail: int, keep_tokens: int, leaf_chunk_size: int,
                       condensed_min_fanout: int, kept: int | None = None, run_tokens: int | None = None) -> str:
    """Why a compaction found nothing to replace, naming the settings that decide it.

    ``kept``: the messages the tail kept when half the prompt's budget cut ``fresh_tail`` down; ``run_tokens``: the
    tokens that make a shorter run worth a leaf summary.
    """
    tail = fresh_tail if kept is None else kept
    newest = f"the newest {fresh_tail} messages" if kept is None else \
        f"the newest {fresh_tail} messages, {kept} within half the prompt's budget"
    if mode == "handoff":
        tail_start = protected_tail_start(nodes, tail, keep_tokens)
        return (f"nothing to compact: all {_count(nodes, len(nodes))} are in the kept tail "
                f"(compaction.freshTail: {newest}, compaction.keepRecentTokens: "
                f"{keep_tokens:,} tokens)" if tail_start == 0 else
                "nothing to compact: the only thing before the kept tail is the previous handoff summary")
    tail_start = protected_tail_start(nodes, tail)
    older = _count(nodes, tail_start)
    anchored = any(node.anchored for node in nodes[:tail_start])
    reason = (f"nothing to compact: {older} before the fresh tail (compaction.freshTail: {newest} "
              f"stay), and a leaf summary needs a run of compaction.leafChunkSize ({leaf_chunk_size})")
    if run_tokens is not None:
        reason += f" or of {run_tokens:,} tokens"
    if anchored:
        reason += " not broken by a system or pinned message"
    if any(node.kind == "summary" for node in nodes[:tail_start]):
        reason += (f"; summaries are condensed in runs of compaction.condensedMinFanout ({condensed_min_fanout}) "
                   "of one depth")
    return reason


def _count(nodes: Sequence[Node], end: int) -> str:
    messages = sum(1 for node in nodes[:end] if node.kind == "message")
    return f"{messages} message" if messages == 1 else f"{messages} messages"
