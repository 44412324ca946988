"""Running compactions for the server: one at a time per session, hooks, progress, notifications, auto mode."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from protocol import errors as codes
from protocol import methods
from protocol.types import (
    CompactParams,
    CompactResult,
    DidCompactParams,
    RecordCompactionParams,
    RecordCompactionResult,
    Usage,
    WillCompactParams,
)
from sidecar.engine.usage import compaction_threshold, fresh_tail_cap
from sidecar.rows import StorageFailure
from sidecar.services.errors import SidecarError
from sidecar.summarizers.base import Summarizer, SummarizerError
from sidecar.wire import unstructure

if TYPE_CHECKING:
    from sidecar.rows import SessionRow
    from sidecar.services.compaction.engine import Compaction, Outcome, Target
    from sidecar.services.model_tools.calls import Answerer
    from sidecar.services.runtime import SessionRuntime
    from sidecar.services.state import Sidecar

log = logging.getLogger(__name__)
TEAM_LOCK_POLL_SECONDS = 0.2
"""How often a compaction waiting for another host's (a team database) looks whether it ended."""

class PeerRequestFailed(Exception):
    """The client answered a request of the server's with an error."""


class CompactionPeer(Protocol):
    """What the runner needs of the connection it serves; the RPC layer's server provides it."""

    @property
    def sidecar(self) -> Sidecar: ...

    def notify_in_order(self, method: str, params: Any) -> None:
        """Send a notification after the replies already queued."""

    def push_session_usage(self, usage: Usage) -> None:
        """Send the session's usage to this client and every other one following the session."""

    def notify_session(self, session_id: str, method: str, params: Any) -> None:
        """Send a notification about a session to this client and every other one following it, in order."""

    async def ask(self, method: str, params: Any, timeout: float) -> Any:
        """A request to the client; TimeoutError, or PeerRequestFailed when it answers an error."""

    def begin_progress(self, token: Any, title: str, message: str, on_cancel: Callable[[], None]) -> None:
        """Start $/progress on the client's token; ``on_cancel`` runs if the client cancels it."""

    def report_progress(self, token: Any, message: str, percentage: int) -> None:
        """Report $/progress."""

    def end_progress(self, token: Any, message: str) -> None:
        """End $/progress."""

    def settle_later(self) -> None:
        """Checkpoint when requests pause."""

    def run_in_background(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``work`` as a task the server keeps until it ends."""

    def summary_asker(self, session_id: str) -> Callable[[Any, float], Awaitable[Any]] | None:
        """How to ask the client driving the session for a summary call, if one that declared ``summaries`` does."""


class CompactionRunner:
    """Starts compactions, manual and automatic, and tells the client about them."""

    def __init__(self, server: CompactionPeer) -> None:
        self.server = server
        self.sidecar = server.sidecar
        self._summarizer: Summarizer | None = None
        self._summarizer_key: Any = None
        self.calls: deque[float] = deque()
        self.ahead: set[str] = set()
        """Sessions whose automatic compaction this connection began ahead of their threshold, still running."""

    def summarizer(self) -> Summarizer:
        """The summarizer for the current settings, rebuilt when they change."""
        from sidecar.summarizers.llm import summarizer_from_settings

        key = self.sidecar.settings.llm
        if self._summarizer is None or key != self._summarizer_key:
            self._summarizer = summarizer_from_settings(self.sidecar.settings.llm)
            self._summarizer_key = key
        return self._summarizer

    def summarizer_for(self, session_id: str) -> Summarizer:
        """The session's summarizer: the model of the client driving it, if that client runs summary calls, else
        ``summarizer()``."""
        ask = self.server.summary_asker(session_id)
        if ask is None:
            return self.summarizer()
        from sidecar.summarizers.client import ClientSummarizer

        return ClientSummarizer(ask, session_id, self.sidecar.settings.llm)

    def answerer(self) -> Answerer | None:
        """The summarizer's model as a question answerer (for memory_query), or None without an LLM."""
        from sidecar.services.model_tools.calls import Answerer

        summarizer = self.summarizer()
        complete = getattr(summarizer, "complete", None)
        return None if complete is None else Answerer(complete, summarizer.window)  # type: ignore[attr-defined]

    async def close(self) -> None:
        """Release the summarizer's connections."""
        closer = getattr(self._summarizer, "aclose", None)
        if closer is not None:
            await closer()

    async def compact(self, params: CompactParams, trigger: str = "manual") -> CompactResult:
        """Run one compaction; raises SidecarError with the protocol's codes.

        One of the session running already (automatic, or another client's) is waited for: its result answers when
        it left the session under its threshold, else this one runs after it.
        """
        from sidecar.services.compaction.engine import Outcome

        mode = self._mode(params)
        before = self.sidecar.session(params.session_id)  # -32001 before any wait
        lock = self.sidecar.store().session_lock(params.session_id)
        waited = False
        while not lock.acquire():  # another host of a team database compacts it: its result is ours
            if not waited:
                log.info("session %s: waiting for the compaction another host runs", params.session_id)
            waited = True
            await asyncio.sleep(TEAM_LOCK_POLL_SECONDS)
        try:
            if waited:
                after = self.sidecar.session(params.session_id)
                if after.summary_count > before.summary_count:
                    return self._result(params.session_id, Outcome(
                        True, mode, self.sidecar.estimated_tokens(before), self.sidecar.estimated_tokens(after),
                        reason="compacted by another host"))
            ended = await self.after_running(params.session_id)
            if ended is not None and ended.compacted and ended.usage.tokens < ended.usage.threshold:
                return ended
            return await self._finish(self._begin(params, trigger))
        finally:
            lock.release()

    async def after_running(self, session_id: str) -> CompactResult | None:
        """Once no compaction of the session runs: the result of the last one waited for (None: none ran, or it
        failed), with the session's usage now."""
        result: CompactResult | None = None
        self.land_ahead(session_id)
        while (running := self.sidecar.runtime.of(session_id).running) is not None:
            log.info("session %s: waiting for the compaction that is running", session_id)
            result = await asyncio.shield(running)
        if result is None:
            return None
        return attrs.evolve(result, usage=self.sidecar.usage(self.sidecar.session(session_id)))

    def _mode(self, params: CompactParams) -> str:
        """The mode asked for, else the settings'; -32602 for an unknown one."""
        mode = params.mode or self.sidecar.settings.compaction.mode
        if mode not in methods.COMPACTION_MODES:
            raise SidecarError(codes.INVALID_PARAMS, f"unknown compaction mode {mode!r}", {"field": "mode"})
        return mode

    def _target(self, session_id: str, budget: int | None) -> Target:
        """What a compaction gets the session under: its threshold less what the client sends beside the context,
        its kept tail within half the prompt's budget, and a few older messages summarized when they hold as much;
        with ``budget`` (to fit it), under that too, and any older messages summarized."""
        from sidecar.services.compaction.engine import Target

        session = self.sidecar.session(session_id)
        settings = self.sidecar.settings.compaction
        tokens = compaction_threshold(self.sidecar.context_window(session), settings) - self.sidecar.overhead(session)
        prompt = self.sidecar.prompt_budget(session) if budget is None else budget
        tail = math.ceil(fresh_tail_cap(prompt) / session.calibration)
        if budget is None:
            return Target(max(tokens, 0), tail, tail)
        return Target(max(min(tokens, budget), 0), tail, 0)  # to fit: any run of older messages

    async def fit(self, session_id: str, budget: int) -> CompactResult | None:
        """Compact so that the session's summaries and fresh tail fit ``budget`` (an assemble found them over it):
        in the settings' mode (``incremental`` taken as ``full``), the kept tail within half the budget.

        None when automatic compaction is off, held back after a failure, or found nothing to do last time (until
        the context grows), or when it failed (logged, backed off). A cancelled assemble leaves it running.
        """
        settings = self.sidecar.settings.compaction
        state = self.sidecar.runtime.of(session_id)
        if not settings.automatic or state.compacting or state.backed_off(time.monotonic()):
            return None
        count = self.sidecar.session(session_id).context_count
        if state.unfit_at is not None and count <= state.unfit_at:
            return None
        mode = "handoff" if settings.mode == "handoff" else "full"
        log.info("session %s: its summaries and fresh tail are over the budget (%d): compacting before the reply",
                 session_id, budget)
        try:
            begun = self._begin(CompactParams(session_id=session_id, mode=mode), "auto", budget)  # type: ignore
        except Exception as error:
            self._auto_failed(session_id, error)
            return None
        task = self.server.run_in_background(self._auto(begun))
        task.add_done_callback(lambda _: begun.release(settle=True))
        result = await asyncio.shield(begun.done)
        state.unfit_at = None if result is not None and result.compacted else count
        return result

    def _begin(self, params: CompactParams, trigger: str, budget: int | None = None) -> _Begun:
        """Check, mark the session compacting and read its context, all before any await.

        So a compaction works on the context as it was when it was asked for or triggered, whatever the client
        sends next, and a second trigger in the same turn of the loop finds the session taken.
        """
        session_id = params.session_id
        mode = self._mode(params)
        if self.sidecar.runtime.compacting(session_id):
            raise SidecarError(codes.COMPACTION_RUNNING, f"a compaction of session {session_id!r} is already running")
        self.sidecar.session(session_id)
        from sidecar.services.compaction.engine import Compaction  # loaded with the first compaction

        begun = _Begun(session_id, mode, trigger, params.focus, params.work_done_token,
                       self.sidecar.runtime.of(session_id), asyncio.get_running_loop().create_future())
        begun.state.compacting, begun.state.running = True, begun.done
        try:
            summarizer = self.summarizer_for(session_id)
            # A client's model call that fails never fails the compaction: the deterministic summary stands in.
            begun.compaction = Compaction(self.sidecar, session_id, mode, params.focus, summarizer,
                                          progress=self._progress_reporter(begun.token, session_id),
                                          fall_back_on_failure=summarizer.name == "client",
                                          target=self._target(session_id, budget))
            begun.session = begun.compaction.load()
            begun.tokens_before = self.sidecar.estimated_tokens(begun.session,
                                                                tail=begun.compaction.loaded_context())
        except BaseException:
            begun.release(settle=True)  # no await since it was marked: nobody saw it compacting
            raise
        return begun

    async def _finish(self, begun: _Begun) -> CompactResult:
        """Summarize and write what ``_begin`` read; the session is released however this ends, and whoever waits
        for this compaction gets its result (None when it fails)."""
        try:
            result = await self._summarize_and_write(begun)
        except BaseException:
            begun.settle(None)
            raise
        begun.settle(result)
        return result

    async def _summarize_and_write(self, begun: _Begun) -> CompactResult:
        from sidecar.services.compaction.engine import Outcome

        session_id, mode, trigger, token = begun.session_id, begun.mode, begun.trigger, begun.token
        compaction, session, tokens_before = begun.compaction, begun.session, begun.tokens_before
        assert compaction is not None and session is not None, "_begin read the context"
        try:
            if compaction.summarizer.name == "openai":
                await self._openai_imported()
            supplied, cancelled = await self._ask_client(session_id, mode, trigger, tokens_before,
                                                         compaction.message_count(), begun.focus)
            if cancelled:
                return self._result(session_id, Outcome(False, mode, tokens_before, tokens_before,
                                                        reason="cancelled by client"))
            if token is not None:
                self._begin_progress(token, mode)
            try:
                outcome = await compaction.run(supplied, tokens_before,
                                               None if begun.staged is None else begun.until_threshold)
                if outcome.compacted:
                    begun.state.note_compacted()
                elif trigger == "auto":  # usage tells why until the context has grown enough to try again
                    begun.state.note_idle(session.context_count, outcome.reason or "", self.sidecar.settings)
            except SummarizerError as error:
                raise SidecarError(codes.SUMMARIZER_FAILED, f"summarizer failed: {error}", error.data) from error
            except StorageFailure as error:
                raise SidecarError(codes.STORAGE_ERROR, f"storage error: {error}") from error
        finally:
            begun.release()
            if token is not None:
                self._end_progress(token)
            self._push_usage(session_id)
        self._record_calls(outcome.calls)
        log.info("compaction of %s (%s, %s): %s, %d -> %d tokens, %d calls, %.1f ms in the database",
                 session_id, outcome.mode, trigger, "done" if outcome.compacted else outcome.reason,
                 outcome.tokens_before, outcome.tokens_after, outcome.calls, outcome.db_seconds * 1000)
        spent = getattr(compaction.summarizer, "spent", None)
        if spent is not None and spent.calls:
            log.info("summary calls of %s on the client's model (%s): %d, %d tokens in, %d out, %d cache reads",
                     session_id, ", ".join(sorted(spent.models)) or "unnamed", spent.calls, spent.input_tokens,
                     spent.output_tokens, spent.cache_read_tokens)
        if outcome.compacted:
            self.server.settle_later()
            # After the usage pushed above, so a client that reacts to didCompact already has the new usage.
            self.server.notify_session(session_id, methods.CONTEXT_DID_COMPACT, unstructure(DidCompactParams(
                session_id=session_id, mode=outcome.mode, trigger=trigger,  # type: ignore[arg-type]
                summary_ids=outcome.summary_ids, tokens_before=outcome.tokens_before,
                tokens_after=outcome.tokens_after, tokens_rewritten=outcome.tokens_rewritten,
                summarizers=outcome.summarizers or None)))
        return self._result(session_id, outcome)

    async def record(self, params: RecordCompactionParams, upto: int | None = None) -> RecordCompactionResult:
        """Store a compaction the agent made itself (memory/recordCompaction, or one found in its transcript).

        Its summary becomes a handoff summary, summarized by ``params.source``, in place of the context up to position
        ``upto`` (all of it when None); announced with context/didCompact and its ``source``. Recorded once: a record
        with the id or the text of one recorded before changes nothing.
        """
        from sidecar.rows import AgentCompactionRow, utcnow
        from sidecar.services.compaction import recorded
        from sidecar.services.compaction.engine import Compaction

        recorded.check(params)
        session_id = params.session_id
        self.sidecar.session(session_id)
        text = recorded.fold(params.summary)
        found = recorded.recorded_before(self.sidecar.store().agent_compactions(session_id), params.id, text)
        if found is not None:
            return self._recorded(session_id, False, found.summary_id, "this compaction is recorded already")
        if self.sidecar.runtime.compacting(session_id):
            raise SidecarError(codes.COMPACTION_RUNNING, f"a compaction of session {session_id!r} is running; "
                               "record this one after it")
        state = self.sidecar.runtime.of(session_id)
        running = state.running = asyncio.get_running_loop().create_future()
        state.compacting = True
        try:
            compaction = Compaction(self.sidecar, session_id, "handoff", None, self.summarizer())
            session = compaction.load()
            before = self.sidecar.estimated_tokens(session, tail=compaction.loaded_context())
            row = AgentCompactionRow(summary_id="", compaction_id=params.id, source=params.source.strip(),
                                     trigger=params.trigger, text=text, recorded_at=utcnow())
            try:
                outcome = await compaction.record(row, params.summary, upto, before)
            except StorageFailure as error:
                raise SidecarError(codes.STORAGE_ERROR, f"storage error: {error}") from error
        finally:
            state.compacting = False
            if state.running is running:
                state.running = None
            running.set_result(None)  # a context/compact waiting for it compacts next, if still needed
            self._push_usage(session_id)
        if not outcome.compacted:
            return self._recorded(session_id, False, None, outcome.reason)
        log.info("%s's own compaction of %s recorded: %d -> %d tokens", row.source, session_id,
                 outcome.tokens_before, outcome.tokens_after)
        self.server.settle_later()
        self.server.notify_session(session_id, methods.CONTEXT_DID_COMPACT, unstructure(DidCompactParams(
            session_id=session_id, mode="handoff", trigger=params.trigger or "manual", summary_ids=outcome.summary_ids,
            tokens_before=outcome.tokens_before, tokens_after=outcome.tokens_after,
            tokens_rewritten=outcome.tokens_rewritten, source=row.source)))
        return self._recorded(session_id, True, outcome.summary_ids[0], None)

    def _recorded(self, session_id: str, recorded: bool, summary_id: str | None, reason: str | None
                  ) -> RecordCompactionResult:
        usage = self.sidecar.usage(self.sidecar.session(session_id))
        return RecordCompactionResult(recorded=recorded, summary_id=summary_id, usage=usage, reason=reason)

    @staticmethod
    async def _openai_imported() -> None:
        """Wait, off the event loop, for openai's import, which initialize starts in a thread."""
        # Until it ends, that thread takes the GIL from every database call of the compaction (several ms
        # each), and the first summarizer call would block the loop on the import lock anyway.
        with contextlib.suppress(ImportError):
            await asyncio.to_thread(importlib.import_module, "openai")

    def _result(self, session_id: str, outcome: Outcome) -> CompactResult:
        usage = self.sidecar.usage(self.sidecar.session(session_id))
        return CompactResult(compacted=outcome.compacted, mode=outcome.mode, summary_ids=outcome.summary_ids,
                             tokens_before=outcome.tokens_before, tokens_after=outcome.tokens_after,
                             rounds=outcome.rounds, usage=usage, reason=outcome.reason, summary=outcome.summary)

    async def _ask_client(self, session_id: str, mode: str, trigger: str, tokens: int, count: int,
                          focus: str | None) -> tuple[str | None, bool]:
        """context/willCompact, for clients that declared compactionHooks: (supplied summary, cancelled)."""
        if not self.sidecar.compaction_hooks:
            return None, False
        params = unstructure(WillCompactParams(session_id=session_id, mode=mode, trigger=trigger,  # type: ignore
                                               tokens_before=tokens, message_count=count, focus=focus))
        timeout = self.sidecar.settings.compaction.hook_timeout_seconds
        try:
            answer = await self.server.ask(methods.CONTEXT_WILL_COMPACT, params, timeout)
        except TimeoutError:
            log.info("context/willCompact got no answer in %g s; proceeding", timeout)
            return None, False
        except PeerRequestFailed as error:
            log.warning("context/willCompact failed (%s); proceeding", error)
            return None, False
        if not isinstance(answer, dict):
            return None, False
        if answer.get("action") == "cancel":
            return None, True
        summary = answer.get("summary")
        return (summary if isinstance(summary, str) and summary.strip() else None), False

    def _progress_reporter(self, token: Any, session_id: str) -> Callable[[int, int], None]:
        announced = False

        def report(done: int, planned: int) -> None:
            nonlocal announced
            if not announced:
                # Only now is there work: a compaction with nothing to do never shows 'compacting'.
                announced = True
                self._push_usage(session_id)
            if token is None:
                return
            percentage = int(100 * done / planned) if planned else 0
            self.server.report_progress(token, f"{done}/{planned} summaries", percentage)

        return report

    def _begin_progress(self, token: Any, mode: str) -> None:
        task = asyncio.current_task()

        def cancel() -> None:
            # window/workDoneProgress/cancel cancels this compaction like $/cancelRequest would.
            if task is not None:
                task.cancel()

        self.server.begin_progress(token, "Compacting context", f"{mode} compaction", on_cancel=cancel)

    def _end_progress(self, token: Any) -> None:
        self.server.end_progress(token, "done")

    def _push_usage(self, session_id: str) -> None:
        session = self.sidecar.store().session(session_id)
        if session is not None:
            self.server.push_session_usage(self.sidecar.usage(session))

    # Automatic compaction

    def _record_calls(self, count: int) -> None:
        now = time.monotonic()
        self.calls.extend([now] * count)

    def calls_last_minute(self) -> int:
        """Summarizer calls made in the last 60 s."""
        horizon = time.monotonic() - 60
        while self.calls and self.calls[0] < horizon:
            self.calls.popleft()
        return len(self.calls)

    def land_ahead(self, session_id: str) -> None:
        """The compaction begun ahead of the session's threshold applies its summaries as soon as they are written."""
        state = self.sidecar.runtime.get(session_id)
        if state is not None and state.staged is not None:
            state.staged.set()

    def land_all_ahead(self) -> None:
        """Every compaction this connection began ahead applies its summaries once written (the connection ends)."""
        for session_id in list(self.ahead):
            self.land_ahead(session_id)

    def maybe_auto(self, session_id: str, usage: Usage) -> None:
        """Start a background compaction when the session is over its threshold and nothing holds it back; one
        whose summaries a model writes starts ahead, at ``summarizeAhead`` of the threshold, and applies them at it."""
        settings = self.sidecar.settings.compaction
        if not settings.automatic:
            return
        ahead = usage.tokens < usage.threshold
        if ahead and (settings.summarize_ahead >= 1 or usage.tokens < settings.summarize_ahead * usage.threshold):
            return
        if not ahead:
            staged = self.sidecar.runtime.get(session_id)
            if staged is not None and staged.staged is not None and not staged.staged.is_set():
                log.info("session %s reached its threshold (%d of %d tokens)", session_id, usage.tokens,
                         usage.threshold)
            self.land_ahead(session_id)
        state = self.sidecar.runtime.get(session_id)
        if state is not None and (state.compacting or state.backed_off(time.monotonic())):
            return
        session = self.sidecar.store().session(session_id)
        if session is None:
            return
        if state is not None and self._idle(state, session):
            return
        limit = self.sidecar.settings.llm.max_calls_per_minute
        if self.summarizer_for(session_id).name != "deterministic" and self.calls_last_minute() >= limit:
            log.info("auto-compaction of %s deferred: %d summarizer calls in the last minute", session_id, limit)
            return
        if ahead and self.summarizer_for(session_id).name == "deterministic":
            return  # it takes no time: nothing to win by writing it ahead
        mode = self.sidecar.settings.compaction.mode
        lock = self.sidecar.store().session_lock(session_id)
        try:
            if not lock.acquire():
                log.info("auto-compaction of %s left to the host that compacts it", session_id)
                return
            # Begun here, in the request that crossed the threshold: the messages that follow it are not compacted
            # with it, and their own changes find the session taken (no second start, no back-off).
            begun = self._begin(CompactParams(session_id=session_id, mode=mode), "auto")  # type: ignore[arg-type]
        except Exception as error:
            lock.release()
            self._auto_failed(session_id, error)
            return
        if ahead:
            begun.staged = begun.state.staged = asyncio.Event()
            self.ahead.add(session_id)
            log.info("session %s at %d of its %d-token threshold: its summaries are written ahead", session_id,
                     usage.tokens, usage.threshold)

        def done(_: asyncio.Task[None]) -> None:  # also when cancelled before it ever ran
            begun.release(settle=True)
            lock.release()
            self.ahead.discard(session_id)

        task = self.server.run_in_background(self._auto(begun))
        task.add_done_callback(done)

    def _idle(self, state: SessionRuntime, session: SessionRow) -> bool:
        """Whether the last automatic compaction found nothing to do and the context has not grown enough since."""
        idle, grown = state.idle_at, max(1, self.sidecar.settings.compaction.leaf_chunk_size)
        return idle is not None and session.context_count < idle[0] + grown

    async def _auto(self, begun: _Begun) -> None:
        try:
            await self._finish(begun)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            self._auto_failed(begun.session_id, error)
            return
        begun.state.clear_backoff()

    def _auto_failed(self, session_id: str, error: Exception) -> None:
        delay = self.sidecar.runtime.of(session_id).back_off(time.monotonic(), self.sidecar.settings)
        message = error.message if isinstance(error, SidecarError) else repr(error)
        log.warning("auto-compaction of %s failed, history kept; next try in %.0f s: %s", session_id, delay, message)
        self._push_usage(session_id)


@attrs.define
class _Begun:
    """A compaction that has begun: its session marked compacting, its context read."""

    session_id: str
    mode: str
    trigger: str
    focus: str | None
    token: Any
    """The client's work-done progress token, if any."""
    state: SessionRuntime
    done: asyncio.Future[CompactResult | None]
    """Its result for those who wait for it (``CompactionRunner.after_running``)."""
    compaction: Compaction | None = None
    session: SessionRow | None = None
    tokens_before: int = 0
    released: bool = False
    staged: asyncio.Event | None = None
    """Begun ahead of the threshold: its summaries are applied once this is set."""

    async def until_threshold(self) -> None:
        """Wait, the summaries written, until the session reaches its threshold (or someone else needs them)."""
        assert self.staged is not None
        if not self.staged.is_set():
            self.state.waiting = True
            log.info("session %s: summaries written ahead, waiting for the threshold", self.session_id)
            try:
                await self.staged.wait()
            finally:
                self.state.waiting = False
        log.info("session %s: the summaries written ahead replace the history now", self.session_id)

    def release(self, settle: bool = False) -> None:
        """The session is no longer being compacted (once: later calls change nothing); with ``settle``, those who
        wait for it get None unless they got its result."""
        if not self.released:
            self.released = True
            self.state.compacting = False
            if self.state.running is self.done:
                self.state.running = None
            if self.staged is not None and self.state.staged is self.staged:
                self.state.staged = None
        if settle:
            self.settle(None)

    def settle(self, result: CompactResult | None) -> None:
        """Hand the result to those who wait for this compaction (once)."""
        if not self.done.done():
            self.done.set_result(result)
