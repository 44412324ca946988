"""Recording the provider's answers: the usage reported, the assistant message stored after the request's own.

Recording never holds up the agent: it is written to the host without waiting for its reply, nor for the host to
read it (a big answer to a busy host fills the pipe), and when another request of the conversation is being prepared
(which may wait for a long compaction) the answer is stored after it, the agent having its end meanwhile. Should
recording fail, the answer is not stored; the agent's next request brings it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from protocol import methods
from protocol import types as t
from sidecar.client import SidecarClient, SidecarRequestError
from sidecar.proxy.adapters.base import Adapter, Recorded, Unit, sidecar_messages, unit_id
from sidecar.proxy.conversation import Prepared, checked
from sidecar.proxy.stats import Stats
from sidecar.wire import unstructure

log = logging.getLogger(__name__)

SETTLE_SECONDS = 10.0
"""How long stopping waits for answers still being stored."""


class Answers:
    """Stores the answers of the requests the proxy assembled."""

    def __init__(self, client: SidecarClient, stats: Stats) -> None:
        self.client = client
        self.stats = stats
        self._storing: set[asyncio.Task[None]] = set()

    async def record(self, adapter: Adapter, prepared: Prepared, recorded: Recorded) -> None:
        """Report the provider's usage and store the answer after the request's messages; never raises."""
        branch = prepared.branch
        if branch is None:
            return
        try:
            self.stats.usage(branch.session_id, recorded)
            if recorded.input_tokens is not None and recorded.output_tokens is not None:
                # Before the answer is stored: the usage is that of the prompt sent, on which the host calibrates.
                await self.client.report_usage(branch.session_id, recorded.input_tokens, recorded.output_tokens,
                                               recorded.cache_read_tokens, recorded.cache_write_tokens, drain=False)
            if recorded.unit is None:
                return
            if prepared.conversation.lock.locked():
                self._soon(self._store(adapter, prepared, recorded.unit))
            else:
                await self._store(adapter, prepared, recorded.unit)
        except Exception as error:
            log.warning("session %s: answer not recorded (%s: %s)", branch.session_id, type(error).__name__, error)

    async def _store(self, adapter: Adapter, prepared: Prepared, unit: Unit) -> None:
        """Send the answer's ingest, the branch moved on to it; the host's reply is taken in the background."""
        branch, conversation = prepared.branch, prepared.conversation
        assert branch is not None
        async with conversation.lock:
            parent = prepared.ids[-1] if prepared.ids else ""
            uid = unit_id(parent, adapter.identity(unit))
            messages = sidecar_messages(adapter, [unit], [uid])
            params = t.IngestParams(branch.session_id, messages, None, prepared.last)
            try:
                sent = await self.client.send(methods.MEMORY_INGEST, unstructure(params), drain=False)
            except SidecarRequestError as error:
                log.info("session %s: answer not recorded (%s)", branch.session_id, error.message)
                return
            newest = str(messages[-1]["id"])
            if branch.ids == prepared.ids and branch.last == prepared.last:
                branch.ids.append(uid)
                branch.last = newest
            branch.units[uid] = unit
        self._soon(self._recorded(prepared, sent, newest))

    async def _recorded(self, prepared: Prepared, sent: asyncio.Future[Any], newest: str) -> None:
        """The host's reply to an answer's ingest: should it refuse, the branch is back where the request left it
        (the agent's next request brings the answer again)."""
        branch, conversation = prepared.branch, prepared.conversation
        assert branch is not None
        try:
            await sent
        except SidecarRequestError as error:
            log.info("session %s: answer not recorded (%s); the agent's next request brings it",
                     branch.session_id, error.message)
            async with conversation.lock:
                await checked(branch)
                branch.forget_prompt()  # the next request waits for the host, which says where the session is
                if branch.last == newest:
                    branch.ids, branch.last = list(prepared.ids), prepared.last

    def _soon(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in the background, kept until done, its failure logged."""
        task = asyncio.ensure_future(work)
        self._storing.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._storing.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.warning("an answer not recorded (%s: %s)", type(error).__name__, error)

    async def settle(self, timeout: float = SETTLE_SECONDS) -> None:
        """Wait (a while at most) for the answers still being stored."""
        if self._storing:
            await asyncio.wait(set(self._storing), timeout=timeout)
