"""What the proxy remembers of each agent's conversation: the branches it is stored as.

An agent resends its whole conversation with every request. Each unit (message) gets an id chained on its
parent's (``seen``), so a resend maps onto what is stored, an answer the proxy recorded is recognised when the agent
sends it back, and an edited or rewound conversation gets new ids from the first change on. A conversation's path
that leaves a stored one is a branch: a sidecar session of its own (``<session>~<id>``), so the old one is never
overwritten. After a restart, a path is found again in the session that holds it (``core.Proxy``: the host's
answer to an ingest that does not follow its newest message names that message).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
from collections.abc import Sequence
from typing import Any

import attrs

from protocol.types import ContextItem
from sidecar.proxy.adapters.base import Unit

MAX_CONVERSATIONS = 64
"""Agent sessions whose state is kept; an older one is rebuilt from the host when it comes back."""
MAX_RENDERED = 4096
"""Rendered units kept per branch."""


@attrs.define(eq=False)
class Branch:
    """One sidecar session: a path of the conversation, and its previous assembled context."""

    session_id: str
    ids: list[str] = attrs.Factory(list)
    """Unit ids along the path, oldest first."""
    last: str = ""
    """The id of the newest message stored in the session ("" when none): ``after`` for the next ingest."""
    units: dict[str, Unit] = attrs.Factory(dict)
    """Units by id, for rendering from their originals."""
    revision: str | None = None
    """The previous assemble's revision, for a delta."""
    items: list[ContextItem] = attrs.Factory(list)
    messages: list[dict[str, Any]] = attrs.Factory(list)
    rendered: collections.OrderedDict[tuple[Any, ...], list[bytes]] = attrs.Factory(collections.OrderedDict)
    """Units rendered (UTF-8 JSON), by what they were rendered from."""
    elements: list[bytes] = attrs.Factory(list)
    """The previous context as rendered (before cache markers), and for each item its group's last element."""
    ends: list[int] = attrs.Factory(list)
    size: int = 0
    """Bytes of ``elements`` in a JSON array (``render.joined_size``), kept as they change."""
    scale: float = 1.0
    """Tokens of the provider's JSON per token the sidecar counts, once a rendering was over the budget."""
    budget: int | None = None
    """The budget the host assembled the previous context within, in its tokens."""
    overhead: int = 0
    """The tokens of the body beside the conversation that budget was worked out for."""
    fixed: list[int] = attrs.Factory(list)
    """The previous context's cache breakpoints that appending leaves where they are (``fixedBreakpoints``)."""
    tokens: int = 0
    over_budget: bool = False
    """The previous context's tokens as the sidecar counts them, and whether it was over the budget."""
    covered: int = 0
    """How many units of ``ids`` the previous context holds (those after it were stored since)."""
    epoch: int = 0
    """Compactions of the session announced so far."""
    prompt_epoch: int = 0
    """``epoch`` when the previous context was asked for: a compaction since, and the host decides the next."""
    checking: asyncio.Task[None] | None = None
    """Taking the host's answers to the request sent ahead of them (``ahead``)."""

    def common(self, ids: Sequence[str]) -> int:
        """How many leading ids of ``ids`` are this path's."""
        length = len(self.ids)
        if length <= len(ids) and ids[length - 1:length] == self.ids[-1:] and list(ids[:length]) == self.ids:
            return length  # the usual case, compared in one go
        count = 0
        for mine, theirs in zip(self.ids, ids, strict=False):
            if mine != theirs:
                break
            count += 1
        return count

    def forget_prompt(self) -> None:
        """Ask for the whole context next time (after a rewrite or an error)."""
        self.revision, self.items, self.messages, self.elements, self.ends, self.size = None, [], [], [], [], 0
        self.covered, self.tokens, self.over_budget = 0, 0, False


@attrs.define(eq=False)
class Conversation:
    """An agent session: the branches its paths are stored as."""

    session_id: str
    """The agent's own session id (or one derived from the conversation's opening)."""
    lock: asyncio.Lock = attrs.Factory(asyncio.Lock)
    branches: list[Branch] = attrs.Factory(list)
    stalled: asyncio.Event = attrs.Factory(asyncio.Event)
    """Set while a preparation that took too long (a compaction, say) is left to finish, holding the lock: the
    conversation's other requests go upstream meanwhile instead of waiting for it."""

    def stall(self, work: asyncio.Future[Any]) -> None:
        """``work`` took too long and is left to finish: ``stalled`` until it does."""
        self.stalled.set()
        work.add_done_callback(lambda _: self.stalled.clear())

    def best(self, ids: Sequence[str]) -> tuple[Branch | None, int]:
        """The branch that shares the most leading ids with ``ids``, and how many."""
        found: Branch | None = None
        most = -1
        for branch in self.branches:
            common = branch.common(ids)
            if common > most or (common == most and found is not None and len(branch.ids) < len(found.ids)):
                found, most = branch, common
        return found, max(most, 0)

    def branch(self, session_id: str) -> Branch:
        """The branch stored as ``session_id``, made if new."""
        for branch in self.branches:
            if branch.session_id == session_id:
                return branch
        branch = Branch(session_id)
        self.branches.append(branch)
        return branch

    def fork_name(self, ids: Sequence[str], taken: int = 0) -> str:
        """The ``taken``-th session id to store a path as, unused by the branches known here: the agent's own, then
        one named after the conversation's opening (where an edited conversation, or one whose agent session holds
        another, is found again after a restart), then ones named after its last unit."""
        known = {branch.session_id for branch in self.branches}
        opening = f"{self.session_id}~{ids[0][3:11]}" if ids else f"{self.session_id}~empty"
        last = f"{self.session_id}~{ids[-1][3:11]}" if ids else opening
        names = itertools.chain((self.session_id, opening, last), (f"{last}-{number}" for number in itertools.count(2)))
        unused = (name for name in dict.fromkeys(itertools.islice(names, len(known) + taken + 3)) if name not in known)
        return next(itertools.islice(unused, taken, None))


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


async def checked(branch: Branch) -> None:
    """Wait until the host's answers to a request sent ahead are taken (``ahead.check`` handles their errors)."""
    if branch.checking is not None:
        with contextlib.suppress(asyncio.CancelledError):
            await branch.checking
        branch.checking = None


class Conversations:
    """Agent sessions by id, the most recently used kept."""

    def __init__(self) -> None:
        self._items: collections.OrderedDict[str, Conversation] = collections.OrderedDict()

    def all(self) -> list[Conversation]:
        """Every conversation kept."""
        return list(self._items.values())

    def get(self, session_id: str) -> Conversation:
        """The conversation, made if new."""
        conversation = self._items.pop(session_id, None) or Conversation(session_id)
        self._items[session_id] = conversation
        while len(self._items) > MAX_CONVERSATIONS:
            oldest = next(iter(self._items))
            if self._items[oldest].lock.locked():
                break
            del self._items[oldest]
        return conversation
