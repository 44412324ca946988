"""The proxy's core, format-neutral: store what is new in a request, assemble, render, and record the answer.

It reaches the shared host as any client does (``SidecarClient``); it never opens the database itself. Requests to
the host that follow one another are sent without waiting for the replies in between (the host handles them in
the order they arrive): a request's new messages and the assemble after them are one round trip, and an answer is
stored while the agent works on its next request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from protocol import errors as codes
from protocol import methods
from protocol import types as t
from sidecar.client import SidecarClient, SidecarConnectionLost, SidecarRequestError
from sidecar.config.models import context_window_for
from sidecar.config.settings import Settings
from sidecar.proxy import ahead
from sidecar.proxy.adapters.base import Adapter, Request, Unit, part_id, sidecar_messages, split_part_id, unit_id
from sidecar.proxy.answers import SETTLE_SECONDS, Answers
from sidecar.proxy.conversation import Branch, Conversation, Conversations, Prepared, checked
from sidecar.proxy.render import render_context, render_items, rendered_tokens, spliced, unit_elements
from sidecar.proxy.seen import Reader, Seen
from sidecar.proxy.stats import Stats
from sidecar.wire import structure, unstructure

log = logging.getLogger(__name__)

FORK_ATTEMPTS = 4
OPENING_ROLES = ("system", "developer")
"""A derived session id takes these leading messages and the first after them: the system prompt alone is shared."""
RESPAWN_WAIT = (5.0, 60.0)
"""Seconds before the sidecar is started again after a failed start: the first wait, and the most (doubling)."""
CHECK_SESSION = "(proxy check)"
"""A session id no one uses: asking for its usage opens the database and answers 'unknown session'."""


class Proxy:
    """The sidecar's side of every request: one connection to the host, shared by all requests."""

    def __init__(self, client: SidecarClient, settings: Settings, stats: Stats,
                 respawn: Callable[[], Awaitable[SidecarClient]] | None = None) -> None:
        self.client = client
        self.settings = settings
        self.stats = stats
        self.conversations = Conversations()
        self.reader = Reader()
        self._unknown_models: set[str] = set()
        self.answers = Answers(client, stats)
        self._respawn = respawn
        self._respawning = asyncio.Lock()
        self._respawn_wait = 0.0
        self._respawn_at = 0.0
        """When (``time.monotonic``) the sidecar may be started again after a failed start."""
        self._respawn_error = ""
        client.on_compact(self._on_compact)

    async def connected(self) -> None:
        """Another sidecar process when the one in use is gone (killed, crashed), so that requests are managed
        again; its branches ask the host for their whole context next. After a failed start the next attempt
        waits (RESPAWN_WAIT, doubled each time): meanwhile requests go upstream at once, not each paying one."""
        if not self.client.closed or self._respawn is None:
            return
        async with self._respawning:
            if not self.client.closed:
                return
            if time.monotonic() < self._respawn_at:
                raise SidecarUnavailable(f"the sidecar could not be started again: {self._respawn_error}")
            log.warning("the sidecar process is gone: starting another")
            try:
                client = await self._respawn()
            except Exception as error:
                self._respawn_wait = min(self._respawn_wait * 2 or RESPAWN_WAIT[0], RESPAWN_WAIT[1])
                self._respawn_at = time.monotonic() + self._respawn_wait
                self._respawn_error = reason(error)
                log.warning("the sidecar could not be started again (%s): requests go upstream as the agent sent "
                            "them; next attempt in %g s", self._respawn_error, self._respawn_wait)
                raise SidecarUnavailable(f"the sidecar could not be started again: {self._respawn_error}") from error
            self._respawn_wait = 0.0
            client.on_compact(self._on_compact)
            self.client = self.answers.client = client
            for conversation in self.conversations.all():
                for branch in conversation.branches:
                    branch.forget_prompt()

    async def check(self) -> None:
        """Ask the host for what needs the database (a session's usage): a sidecar that cannot take requests (its
        database locked by another process, say) is a problem in the figures before the first request."""
        try:
            await self.connected()
            await self.client.request(methods.CONTEXT_USAGE, {"sessionId": CHECK_SESSION})
        except SidecarRequestError as error:
            if error.code != codes.UNKNOWN_SESSION:  # the answer of a sidecar whose database is open
                self.stats.failed(reason(error), requests=0)
        except Exception as error:
            self.stats.failed(reason(error), requests=0)

    def _on_compact(self, event: t.DidCompactParams) -> None:
        self.stats.compacted(event.session_id, event.tokens_before, event.tokens_after, event.summarizers)
        self._compacted(event.session_id)

    def session_of(self, adapter: Adapter, request: Request, seen: Seen) -> str:
        """An id derived from the conversation's opening (its system prompt, its leading system or developer
        messages and the first message after them, without cache markers): the same for every request of one
        conversation."""
        values = request.values[adapter.conversation_key]
        elements = seen.values or (values if isinstance(values, list) else [values])
        count = next((index for index, value in enumerate(elements)
                      if not (isinstance(value, dict) and value.get("role") in OPENING_ROLES)), len(elements))
        # Spread: an opening of one message hashes as it did when only the first element was taken.
        opening = json.dumps([adapter.name, request.values.get("system"), request.values.get("instructions"),
                              *elements[:count + 1]], sort_keys=True, ensure_ascii=False)
        return "proxy-" + unit_id("", opening)[3:19]

    async def prepare(self, adapter: Adapter, request: Request, seen: Seen, conversation: Conversation) -> Prepared:
        """Store what is new and build the body to forward; called with the conversation's lock held.

        Should the host fail, the request goes upstream as the agent sent it: the agent never breaks.
        """
        body = request.body.raw
        if not adapter.manageable(request.values):
            self.stats.unmanaged(conversation.session_id, body)
            return Prepared(body, conversation, None, request.stream)
        self._check_model(request.model)
        try:
            try:
                branch, forwarded = await self._managed(adapter, request, conversation, seen)
            except SidecarConnectionLost:
                if self._respawn is None:
                    raise
                # The sidecar process died since the last request, unnoticed until this one: again, on a new one.
                branch, forwarded = await self._managed(adapter, request, conversation, seen)
        except Exception as error:  # the host's, or the sidecar's own: the agent never breaks
            log.warning("session %s: forwarded as the agent sent it (%s: %s)", conversation.session_id,
                        type(error).__name__, error)
            self.stats.unmanaged(conversation.session_id, body)
            self.stats.failed(reason(error))
            return Prepared(body, conversation, None, request.stream)
        self.stats.request(branch.session_id, conversation.session_id, adapter.name, request.model, body,
                           forwarded)
        return Prepared(forwarded, conversation, branch, request.stream, seen.ids, branch.last)

    async def _managed(self, adapter: Adapter, request: Request, conversation: Conversation, seen: Seen
                       ) -> tuple[Branch, bytes]:
        """The request's new messages stored and the body to forward, on a live sidecar process."""
        await self.connected()
        sent = await self._ahead(adapter, request, conversation, seen)
        if sent is not None:
            return sent
        branch, assembling = await self._sync(adapter, request, conversation, seen)
        return branch, await self._assembled(adapter, request, branch, assembling)

    async def _ahead(self, adapter: Adapter, request: Request, conversation: Conversation, seen: Seen
                     ) -> tuple[Branch, bytes] | None:
        """The body sent ahead of the host (see ``ahead``) when the request only appends to its branch, its ingest
        and assemble sent behind it; None when the host must answer first."""
        branch, common = conversation.best(seen.ids)
        if branch is None or not branch.ids or common != len(branch.ids):
            return None
        await checked(branch)
        units = ahead.pending(branch, seen.units, seen.ids, common)
        planned = ahead.plan(adapter, branch, units, request.overhead_tokens) if units is not None else None
        if planned is None:
            return None
        planned.covered = len(seen.ids)
        stored = await self._send_ingest(adapter, request, branch, seen.units, seen.ids, common, branch.last)
        assembling = await self._send_assemble(branch, request)
        self._extend(branch, seen.units, seen.ids, common, stored[1] if stored is not None else branch.last)
        branch.checking = asyncio.ensure_future(ahead.check(self.client, adapter, branch, planned,
                                                            stored[0] if stored is not None else None, assembling))
        return branch, self._finish(adapter, request, planned.elements, planned.ends, planned.breakpoints)

    async def count(self, adapter: Adapter, request: Request, seen: Seen, conversation: Conversation) -> Prepared:
        """count_tokens, nothing stored and the branch unchanged: the body with the context that would be sent
        when a branch holds the conversation so far (its new messages added as they are), else as the agent sent
        it."""
        body = request.body.raw
        branch, common = conversation.best(seen.ids)
        if not seen.units or branch is None or not branch.ids or common != len(branch.ids):
            return Prepared(body, conversation, None)
        await checked(branch)
        try:
            await self.connected()
            since = branch.ids[branch.covered:]
            stored = [unit for uid in since if (unit := branch.units.get(uid)) is not None]
            if branch.elements and len(stored) == len(since):
                # The prompt kept from the previous request, and what was stored since: no host call.
                elements, more = list(branch.elements), list(zip(stored, since, strict=True))
            else:  # asked for outside the branch's kept prompt, which stays as it is
                # Within the budget the branch's requests get (count_tokens names no max tokens): not a new one.
                asked = {"budget": branch.budget} if branch.budget is not None else room(branch, request)
                result = await self.client.assemble(branch.session_id, **asked)
                (elements, _), more = await render_items(self.client, adapter, branch, result.items,
                                                         result.messages), []
            for unit, uid in [*more, *zip(seen.units[common:], seen.ids[common:], strict=True)]:
                elements += unit_elements(adapter, unit, uid)
            forwarded = self._finish(adapter, request, elements, (), ())
        except Exception as error:  # the host's, or the sidecar's own
            log.warning("session %s: count_tokens forwarded as sent (%s: %s)", conversation.session_id,
                        type(error).__name__, error)
            return Prepared(body, conversation, None)
        return Prepared(forwarded, conversation, None)

    async def _sync(self, adapter: Adapter, request: Request, conversation: Conversation, seen: Seen
                    ) -> tuple[Branch, asyncio.Future[Any] | None]:
        """Store the units the branch lacks, the assemble sent right behind them; a path that leaves every stored
        one becomes a branch of its own. Returns the branch and the assemble's reply to come, if it was sent."""
        units, ids = seen.units, seen.ids
        branch, common = conversation.best(ids)
        if branch is not None:
            await checked(branch)
        if branch is not None and common == len(branch.ids) and (branch.ids or not ids):
            stored = await self._send_ingest(adapter, request, branch, units, ids, common, branch.last)
            assembling = await self._send_assemble(branch, request)
            try:
                last = await _stored(stored, branch.last)
            except SidecarRequestError as error:
                forget(assembling)  # of the session without this request's messages
                if error.code != codes.CONVERSATION_MOVED:
                    raise
            else:
                self._extend(branch, units, ids, common, last)
                return branch, assembling
        return await self._resync(adapter, request, conversation, units, ids), None

    async def _resync(self, adapter: Adapter, request: Request, conversation: Conversation, units: list[Unit],
                      ids: list[str]) -> Branch:
        """``_sync`` one step at a time: the session moved on elsewhere, or the conversation is new to this proxy."""
        branch, common = conversation.best(ids)
        if branch is not None and common == len(branch.ids) and (branch.ids or not ids):
            start, after = common, branch.last
        else:
            branch, start, after = None, 0, ""
        taken = 0
        for _ in range(FORK_ATTEMPTS):
            if branch is None:
                branch = conversation.branch(conversation.fork_name(ids, taken))
                branch.ids, branch.last, start, after = [], "", 0, ""
            try:
                last = await _stored(await self._send_ingest(adapter, request, branch, units, ids, start, after),
                                     after)
            except Exception as error:
                if not isinstance(error, SidecarRequestError) or error.code != codes.CONVERSATION_MOVED:
                    if not branch.ids and branch in conversation.branches:
                        # Made for this path and still empty: the next request tries the same session again.
                        conversation.branches.remove(branch)
                    raise
                newest = (error.data or {}).get("lastId")
                found = split_part_id(newest) if isinstance(newest, str) else None
                index = ids.index(found[0]) if found is not None and found[0] in ids else -1
                if index >= 0 and newest == self._last_part(adapter, units[index], ids[index]):
                    # The session holds this path up to there (stored by an earlier run, or another proxy).
                    branch.ids, branch.last, start, after = ids[:index + 1], newest, index + 1, newest
                    branch.units.update(zip(ids[:start], units[:start], strict=True))  # rendered without expand
                    branch.forget_prompt()
                    continue
                log.info("session %s holds another conversation (its newest message %r): this one is stored as a "
                         "branch", branch.session_id, newest)
                conversation.branches.remove(branch)
                branch, taken = None, taken + 1
                continue
            self._extend(branch, units, ids, start, last)
            return branch
        raise SidecarRequestError(codes.CONVERSATION_MOVED, "the conversation kept moving on elsewhere")

    @staticmethod
    def _extend(branch: Branch, units: Sequence[Unit], ids: Sequence[str], start: int, last: str) -> None:
        branch.ids, branch.last = list(ids), last
        for unit, uid in zip(units[start:], ids[start:], strict=True):
            branch.units[uid] = unit

    async def _send_ingest(self, adapter: Adapter, request: Request, branch: Branch, units: Sequence[Unit],
                           ids: Sequence[str], start: int, after: str) -> tuple[asyncio.Future[Any], str] | None:
        """Send the ingest of units[start:] after ``after``: the reply to come and the id of the newest message it
        stores (None when there is nothing to store)."""
        messages = sidecar_messages(adapter, units[start:], ids[start:])
        if not messages:
            return None
        info = t.SessionInfo(model=request.model, metadata={"proxy": adapter.name,
                                                           "agentSession": branch.session_id.split("~")[0]})
        params = t.IngestParams(branch.session_id, messages, info, after)
        return await self.client.send(methods.MEMORY_INGEST, unstructure(params)), str(messages[-1]["id"])

    async def _send_assemble(self, branch: Branch, request: Request) -> asyncio.Future[Any]:
        """Send context/assemble into the branch's kept prompt (a delta when nothing was rewritten), within the
        budget the host works out for this request (``room``)."""
        params = t.AssembleParams(branch.session_id, since=branch.revision, **room(branch, request))
        branch.overhead = request.overhead_tokens
        return await self.client.send(methods.CONTEXT_ASSEMBLE, unstructure(params))

    def _compacted(self, session_id: str) -> None:
        """A compaction of a session: the host decides its next context, not a request sent ahead."""
        for conversation in self.conversations.all():
            for branch in conversation.branches:
                if branch.session_id == session_id:
                    branch.epoch += 1

    def _check_model(self, model: str | None) -> None:
        """Say once per model that the host takes its window from the settings (``contextWindow``)."""
        if (model or "") not in self._unknown_models and context_window_for(model, self.settings.models) is None:
            self._unknown_models.add(model or "")
            log.warning("model %r: context window unknown; using contextWindow %d from the settings (set 'models' "
                        "to name its window)", model, self.settings.context_window)

    @staticmethod
    def _last_part(adapter: Adapter, unit: Unit, uid: str) -> str:
        count = len(adapter.parts(unit))
        return part_id(uid, count - 1, count)

    async def _assembled(self, adapter: Adapter, request: Request, branch: Branch,
                         assembling: asyncio.Future[Any] | None) -> bytes:
        """The body with its conversation replaced by the sidecar's assembled context.

        The sidecar counts its own messages; the provider's JSON of them is larger. A context whose rendering
        turns out over the budget is assembled again with the ``scale`` rendering showed, which the branch keeps
        (the budget stays the same from request to request, so the prompt's prefix does too).
        """
        for attempt in range(2):
            covered, epoch = len(branch.ids), branch.epoch
            if assembling is None:
                assembling = await self._send_assemble(branch, request)
            result = ahead.take(branch, structure(await assembling, t.AssembleResult), covered, epoch)
            assembling = None
            elements, ends = await render_context(self.client, adapter, branch, result)
            rendered = rendered_tokens(branch.size)
            if result.budget is None or rendered <= result.budget * branch.scale or attempt or not result.tokens:
                break
            branch.scale = max(branch.scale, rendered / result.tokens * 1.05)
            log.info("session %s: the rendered context (%d tokens) is over the budget (%d): scale %.2f",
                     branch.session_id, rendered, result.budget, branch.scale)
            branch.forget_prompt()
        if result.over_budget:
            log.warning("session %s: the context is over its budget: %s", branch.session_id, result.reason)
        return self._finish(adapter, request, elements, ends, result.cache_breakpoints or ())

    @staticmethod
    def _finish(adapter: Adapter, request: Request, elements: list[bytes], ends: Sequence[int],
                breakpoints: Sequence[int]) -> bytes:
        """The body to forward: cache markers after the breakpoints (items) the agent's own leave room for."""
        own, marker = adapter.marker(request)
        wanted = sorted({ends[index] for index in breakpoints if 0 <= index < len(ends)})
        room = max(0, t.MAX_CACHE_BREAKPOINTS - own)
        return spliced(request, adapter.finish(list(elements), wanted[len(wanted) - room:] if room else [], marker))

    async def settle(self, timeout: float = SETTLE_SECONDS) -> None:
        """Wait (a while at most) for the answers still being stored."""
        await self.answers.settle(timeout)


def room(branch: Branch, request: Request) -> dict[str, Any]:
    """What the host works a request's budget out from: the tokens of the body beside the conversation, the answer's
    max tokens, and the branch's rendering scale."""
    return {"overhead_tokens": request.overhead_tokens, "reply_tokens": request.reply_tokens,
            "scale": branch.scale if branch.scale > 1 else None}


async def _stored(sent: tuple[asyncio.Future[Any], str] | None, otherwise: str) -> str:
    """The id of the newest message an ingest stored, once the host confirms it (``otherwise`` when none was sent)."""
    if sent is None:
        return otherwise
    await sent[0]
    return sent[1]


class SidecarUnavailable(Exception):
    """The sidecar is gone and is not started again yet (a start failed a moment ago)."""


def reason(error: BaseException) -> str:
    """Why the sidecar failed a request, in a line."""
    return error.message if isinstance(error, SidecarRequestError) else f"{type(error).__name__}: {error}"


def forget(future: asyncio.Future[Any]) -> None:
    """A reply or work no longer awaited: its error, if any, is not reported as never retrieved."""
    future.add_done_callback(lambda done: done.cancelled() or done.exception())
