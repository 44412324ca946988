"""The proxy's core, format-neutral: store what is new in a request, assemble, render, and record the answer.

It reaches the shared host as any client does (``SidecarClient``); it never opens the database itself.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from typing import Any

import attrs

from protocol import errors as codes
from protocol.types import AssembleResult, ContextItem
from sidecar.client import SidecarClient, SidecarRequestError
from sidecar.config.models import context_window_for
from sidecar.config.settings import Settings
from sidecar.engine.usage import reserve_for
from sidecar.proxy.adapters.base import Adapter, Item, Recorded, Request, Unit, part_id, split_part_id, unit_id
from sidecar.proxy.conversation import MAX_RENDERED, Branch, Conversation, Conversations
from sidecar.proxy.stats import Stats

log = logging.getLogger(__name__)

MAX_MARKERS = 4
"""Anthropic's limit of cache breakpoints in one request, the agent's own included."""
FORK_ATTEMPTS = 4


@attrs.define
class Prepared:
    """A request ready to forward: the body to send, and what recording its answer needs."""

    body: bytes
    conversation: Conversation
    branch: Branch | None
    """None when the request goes upstream as the agent sent it."""
    stream: bool = False
    ids: list[str] = attrs.Factory(list)
    last: str = ""
    """The newest stored message once the request's own were stored: ``after`` for the answer."""


class Proxy:
    """The sidecar's side of every request: one connection to the host, shared by all requests."""

    def __init__(self, client: SidecarClient, settings: Settings, stats: Stats) -> None:
        self.client = client
        self.settings = settings
        self.stats = stats
        self.conversations = Conversations()
        self._unknown_models: set[str] = set()
        client.on_compact(lambda event: stats.compacted(event.session_id, event.tokens_before, event.tokens_after))

    def session_of(self, adapter: Adapter, request: Request, header: str | None) -> str:
        """The agent's session id, else one derived from the conversation's opening (its system prompt and first
        message): the same for every request of one conversation."""
        if header:
            return header
        values = request.values[adapter.conversation_key]
        first = values[0] if isinstance(values, list) and values else values
        opening = json.dumps([adapter.name, request.values.get("system"), request.values.get("instructions"),
                              first], sort_keys=True, ensure_ascii=False)
        return "proxy-" + unit_id("", opening)[3:19]

    async def prepare(self, adapter: Adapter, request: Request, conversation: Conversation,
                      body: bytes) -> Prepared:
        """Store what is new and build the body to forward; called with the conversation's lock held.

        Should the host fail, the request goes upstream as the agent sent it: the agent never breaks.
        """
        if not adapter.manageable(request.values):
            self.stats.unmanaged(conversation.session_id, len(body))
            return Prepared(body, conversation, None, request.stream)
        values, texts = self._elements(adapter, request, conversation)
        units = adapter.units(values, texts)
        ids = conversation.unit_ids(adapter, units)
        try:
            branch = await self._sync(adapter, request, conversation, units, ids)
            forwarded = await self._assembled(adapter, request, branch)
        except SidecarRequestError as error:
            log.warning("session %s: forwarded as the agent sent it: %s", conversation.session_id, error)
            self.stats.unmanaged(conversation.session_id, len(body))
            return Prepared(body, conversation, None, request.stream)
        self.stats.request(branch.session_id, conversation.session_id, adapter.name, request.model, len(body),
                           len(forwarded))
        return Prepared(forwarded, conversation, branch, request.stream, ids, branch.last)

    async def count(self, adapter: Adapter, request: Request, conversation: Conversation, body: bytes) -> Prepared:
        """count_tokens, nothing stored: the body with the context that would be sent when a branch holds the
        conversation so far (its new messages added as they are), else as the agent sent it."""
        if not adapter.manageable(request.values):
            return Prepared(body, conversation, None)
        values, texts = self._elements(adapter, request, conversation)
        units = adapter.units(values, texts)
        ids = conversation.unit_ids(adapter, units)
        branch, common = conversation.best(ids)
        if branch is None or not branch.ids or common != len(branch.ids):
            return Prepared(body, conversation, None)
        try:
            forwarded = await self._assembled(adapter, request, branch, units[common:], ids[common:])
        except SidecarRequestError as error:
            log.warning("session %s: count_tokens forwarded as sent: %s", conversation.session_id, error)
            return Prepared(body, conversation, None)
        return Prepared(forwarded, conversation, None)

    def _elements(self, adapter: Adapter, request: Request, conversation: Conversation
                  ) -> tuple[list[Any], list[str]]:
        """Each element's clean value and text; an element whose text is known keeps the value it had."""
        raw = request.values[adapter.conversation_key]
        values: list[Any] = []
        texts: list[str] = []
        known, known_values = conversation.known, conversation.known_values
        for index, ((start, end), value) in enumerate(zip(request.elements, raw, strict=True)):
            if value is None and index < len(known):
                values.append(known_values[index])
                texts.append(known[index])
            else:
                value, text = adapter.clean(value, request.text[start:end])
                values.append(value)
                texts.append(text)
        conversation.known, conversation.known_values = texts, values
        return values, texts

    async def _sync(self, adapter: Adapter, request: Request, conversation: Conversation, units: list[Unit],
                    ids: list[str]) -> Branch:
        """Store the units the branch lacks; a path that leaves every stored one becomes a branch of its own."""
        branch, common = conversation.best(ids)
        if branch is not None and common == len(branch.ids) and (branch.ids or not ids):
            start, after = common, branch.last
        else:
            branch, start, after = None, 0, ""
        taken = 0
        for _ in range(FORK_ATTEMPTS):
            if branch is None:
                name = conversation.fork_name(ids, taken)
                branch = conversation.branch(name)
                branch.ids, branch.last, start, after = [], "", 0, ""
            try:
                last = await self._store(adapter, request, branch, units, ids, start, after)
            except SidecarRequestError as error:
                if error.code != codes.CONVERSATION_MOVED:
                    raise
                newest = (error.data or {}).get("lastId")
                found = split_part_id(newest) if isinstance(newest, str) else None
                index = ids.index(found[0]) if found is not None and found[0] in ids else -1
                if index >= 0 and newest == self._last_part(adapter, units[index], ids[index]):
                    # The session holds this path up to there (stored by an earlier run, or another proxy).
                    branch.ids, branch.last, start, after = ids[:index + 1], newest, index + 1, newest
                    branch.forget_prompt()
                    continue
                log.info("session %s moved on elsewhere (newest %r): this conversation branches off",
                         branch.session_id, newest)
                conversation.branches.remove(branch)
                branch, taken = None, taken + 1
                continue
            branch.ids, branch.last = list(ids), last
            for unit, uid in zip(units[start:], ids[start:], strict=True):
                branch.units[uid] = unit
            return branch
        raise SidecarRequestError(codes.CONVERSATION_MOVED, "the conversation kept moving on elsewhere")

    async def _store(self, adapter: Adapter, request: Request, branch: Branch, units: Sequence[Unit],
                     ids: Sequence[str], start: int, after: str) -> str:
        """Ingest units[start:] after ``after``; returns the id of the newest stored message."""
        messages = sidecar_messages(adapter, units[start:], ids[start:])
        if not messages:
            return after
        info: dict[str, Any] = {"model": request.model,
                                "metadata": {"proxy": adapter.name, "agentSession": branch.session_id.split("~")[0]}}
        await self.client.ingest(branch.session_id, messages, info, after=after)
        return str(messages[-1]["id"])

    @staticmethod
    def _last_part(adapter: Adapter, unit: Unit, uid: str) -> str:
        count = len(adapter.parts(unit))
        return part_id(uid, count - 1, count)

    def budget(self, request: Request) -> int:
        """What the conversation may fill: the model's window less the answer's reserve and the rest of the body."""
        model = request.model
        window = context_window_for(model, self.settings.models)
        if window is None:
            window = self.settings.context_window
            if model not in self._unknown_models:
                self._unknown_models.add(model or "")
                log.warning("model %r: context window unknown; using contextWindow %d from the settings (set "
                            "'models' to name its window)", model, window)
        overhead = math.ceil(request.overhead_chars / 4)
        return max(window - reserve_for(window, self.settings.compaction) - overhead, window // 4)

    async def _assembled(self, adapter: Adapter, request: Request, branch: Branch,
                         extra: Sequence[Unit] = (), extra_ids: Sequence[str] = ()) -> bytes:
        """The body with its conversation replaced by the sidecar's assembled context (then ``extra`` units).

        The sidecar counts its own messages; the provider's JSON of them is larger. A context whose rendering
        turns out over the budget is assembled again within a budget scaled by what rendering added, a scale the
        branch keeps (the budget stays the same from request to request, so the prompt's prefix does too).
        """
        budget = self.budget(request)
        for attempt in range(2):
            result = await self._assemble(branch, math.floor(budget / branch.scale))
            elements, ends = await self._render_kept(adapter, branch, result)
            for unit, uid in zip(extra, extra_ids, strict=True):
                parts = adapter.parts(unit)
                elements += adapter.render_unit(unit, [Item("message", part_id(uid, index, len(parts)), part)
                                                       for index, part in enumerate(parts)])
            rendered = math.ceil((sum(len(element) + 1 for element in elements) + 1) / 4)
            if rendered <= budget or attempt or not result.tokens:
                break
            branch.scale = max(branch.scale, rendered / result.tokens * 1.05)
            log.info("session %s: the rendered context (%d tokens) is over the budget (%d): scale %.2f",
                     branch.session_id, rendered, budget, branch.scale)
            branch.forget_prompt()
        own, marker = adapter.marker(request)
        wanted = sorted({ends[index] for index in result.cache_breakpoints or () if 0 <= index < len(ends)})
        room = max(0, MAX_MARKERS - own)
        elements = adapter.finish(elements, wanted[len(wanted) - room:] if room else [], marker)
        start, end = request.conversation
        text = request.text
        return (text[:start] + "[" + ",".join(elements) + "]" + text[end:]).encode()

    async def _render_kept(self, adapter: Adapter, branch: Branch, result: AssembleResult
                           ) -> tuple[list[str], list[int]]:
        """The context's elements: after a delta, those of the kept items as last rendered and the new ones."""
        keep = result.keep or 0 if result.delta else 0
        if keep and len(branch.ends) >= keep:
            cut = branch.ends[keep - 1] + 1  # a unit's parts are stored together: no group spans the cut
            more, more_ends = await self._render(adapter, branch, branch.items[keep:], branch.messages[keep:])
            elements, ends = branch.elements[:cut] + more, branch.ends[:keep] + [end + cut for end in more_ends]
        else:
            elements, ends = await self._render(adapter, branch, branch.items, branch.messages)
        branch.elements, branch.ends = list(elements), list(ends)
        return elements, ends

    async def _assemble(self, branch: Branch, budget: int) -> AssembleResult:
        """context/assemble into the branch's kept prompt (a delta when nothing was rewritten)."""
        result = await self.client.assemble(branch.session_id, budget=budget, since=branch.revision)
        if result.over_budget:
            log.info("session %s: over budget even at its fresh tail; compacting before sending", branch.session_id)
            await self.client.compact(branch.session_id, mode="full")
            branch.forget_prompt()
            result = await self.client.assemble(branch.session_id, budget=budget)
        if result.delta and branch.revision is not None:
            keep = result.keep or 0
            branch.items = branch.items[:keep] + result.items
            branch.messages = branch.messages[:keep] + result.messages
        else:
            branch.items, branch.messages = list(result.items), list(result.messages)
        branch.revision = result.revision
        return result

    async def _render(self, adapter: Adapter, branch: Branch, items: Sequence[ContextItem],
                      messages: Sequence[dict[str, Any]]) -> tuple[list[str], list[int]]:
        """The elements of the assembled context, and for each item the index of its group's last element."""
        elements: list[str] = []
        ends: list[int] = []
        group: list[Item] = []
        owner: Unit | None = None
        owner_id = ""
        members = 0

        def flush() -> None:
            nonlocal members
            if not group:
                return
            if owner is None:
                out = adapter.render_others(group)
            else:
                key = (owner_id, *((i.id, i.pruned, _calls(i.message)) for i in group))
                out = branch.rendered.get(key) or adapter.render_unit(owner, group)
                branch.rendered[key] = out
                branch.rendered.move_to_end(key)
                if len(branch.rendered) > MAX_RENDERED:
                    branch.rendered.popitem(last=False)
            elements.extend(out)
            ends.extend([len(elements) - 1] * members)
            group.clear()
            members = 0

        for context_item, message in zip(items, messages, strict=True):
            item = Item(context_item.kind, context_item.id, message, bool(context_item.pruned))
            parsed = split_part_id(item.id) if item.kind == "message" else None
            unit = await self._unit(branch, parsed[0], item.id) if parsed is not None else None
            uid = parsed[0] if unit is not None and parsed is not None else ""
            if group and (unit is not owner or uid != owner_id):
                flush()
            owner, owner_id = unit, uid
            group.append(item)
            members += 1
        flush()
        return elements, ends

    async def _unit(self, branch: Branch, uid: str, message_id: str) -> Unit | None:
        """The unit a stored message came from, from memory or its stored original."""
        unit = branch.units.get(uid)
        if unit is not None:
            return unit
        first = uid if message_id == uid else f"{uid}.0"
        try:
            expanded = await self.client.expand(branch.session_id, first)
        except SidecarRequestError as error:
            log.warning("session %s: no original for %s (%s); rendered from the stored message", branch.session_id,
                        first, error)
            return None
        original = expanded.items[0].original if expanded.items else None
        if not original:
            return None
        unit = Unit(tuple(original), tuple(json.loads(text) for text in original))
        branch.units[uid] = unit
        return unit

    async def record(self, adapter: Adapter, prepared: Prepared, recorded: Recorded) -> None:
        """Store the answer after the request's messages and report the provider's usage."""
        branch, conversation = prepared.branch, prepared.conversation
        if branch is None:
            return
        if recorded.unit is not None:
            async with conversation.lock:
                parent = prepared.ids[-1] if prepared.ids else ""
                uid = unit_id(parent, adapter.identity(recorded.unit))
                messages = sidecar_messages(adapter, [recorded.unit], [uid])
                try:
                    await self.client.ingest(branch.session_id, messages, after=prepared.last)
                except SidecarRequestError as error:
                    log.info("session %s: answer not recorded (%s); the agent's next request brings it",
                             branch.session_id, error.message)
                    return
                if branch.ids == prepared.ids:
                    branch.ids.append(uid)
                    branch.last = str(messages[-1]["id"])
                branch.units[uid] = recorded.unit
                conversation.remember(parent, recorded.unit, uid)
        self.stats.usage(branch.session_id, recorded)
        if recorded.input_tokens is not None and recorded.output_tokens is not None:
            await self.client.report_usage(branch.session_id, recorded.input_tokens, recorded.output_tokens,
                                           recorded.cache_read_tokens, recorded.cache_write_tokens)


def _calls(message: dict[str, Any]) -> tuple[str, ...]:
    return tuple(call["id"] for call in message.get("tool_calls") or ())


def sidecar_messages(adapter: Adapter, units: Sequence[Unit], ids: Sequence[str]) -> list[dict[str, Any]]:
    """The units as messages to ingest: ids per part, the unit's original on its first part."""
    out: list[dict[str, Any]] = []
    for unit, uid in zip(units, ids, strict=True):
        parts = adapter.parts(unit)
        for index, part in enumerate(parts):
            message = {**part, "id": part_id(uid, index, len(parts)),
                       "metadata": {"format": adapter.name, **(part.get("metadata") or {})}}
            if index == 0:
                message["original"] = list(unit.texts)
            out.append(message)
    return out
