"""Running compactions for the server: one at a time per session, hooks, progress, notifications, auto mode."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException

from protocol import errors as codes
from protocol import methods
from protocol.types import CompactParams, CompactResult, DidCompactParams, Usage, WillCompactParams
from sidecar.errors import SidecarError
from sidecar.storage.rows import StorageFailure
from sidecar.summarizers.base import Summarizer, SummarizerError
from sidecar.wire import unstructure

if TYPE_CHECKING:
    from sidecar.compaction.engine import Outcome
    from sidecar.server import SidecarServer

log = logging.getLogger(__name__)

HOOK_TIMEOUT = 10.0
FIRST_BACKOFF = 30.0
MAX_BACKOFF = 900.0


class CompactionRunner:
    """Starts compactions, manual and automatic, and tells the client about them."""

    def __init__(self, server: SidecarServer) -> None:
        self.server = server
        self.sidecar = server.sidecar
        self._summarizer: Summarizer | None = None
        self._summarizer_key: Any = None
        self.calls: deque[float] = deque()
        self.backoff: dict[str, tuple[float, float]] = {}
        """Per session: (not before this monotonic time, the next delay), after a failed auto-compaction."""
        self.idle_at: dict[str, int] = {}
        """Per session: context size at which auto-compaction last found nothing to do."""
        self.sidecar.runtime_tables += [self.backoff, self.idle_at]

    def summarizer(self) -> Summarizer:
        """The summarizer for the current settings, rebuilt when they change."""
        from sidecar.summarizers.llm import summarizer_from_settings

        key = self.sidecar.settings.llm
        if self._summarizer is None or key != self._summarizer_key:
            self._summarizer = summarizer_from_settings(self.sidecar.settings.llm)
            self._summarizer_key = key
        return self._summarizer

    async def close(self) -> None:
        """Release the summarizer's connections."""
        closer = getattr(self._summarizer, "aclose", None)
        if closer is not None:
            await closer()

    async def compact(self, params: CompactParams, trigger: str = "manual") -> CompactResult:
        """Run one compaction; raises SidecarError with the protocol's codes."""
        session_id = params.session_id
        mode = params.mode or self.sidecar.settings.compaction.mode
        if mode not in methods.COMPACTION_MODES:
            raise SidecarError(codes.INVALID_PARAMS, f"unknown compaction mode {mode!r}", {"field": "mode"})
        if session_id in self.sidecar.compacting:
            raise SidecarError(codes.COMPACTION_RUNNING, f"a compaction of session {session_id!r} is already running")
        self.sidecar.session(session_id)
        from sidecar.compaction.engine import Compaction, Outcome  # loaded with the first compaction

        self.sidecar.compacting.add(session_id)
        token = params.work_done_token
        try:
            summarizer = self.summarizer()
            if summarizer.name == "openai":
                await self._openai_imported()
            compaction = Compaction(self.sidecar, session_id, mode, params.focus, summarizer,
                                    progress=self._progress_reporter(token, session_id))
            session = compaction.load()
            tokens_before = self.sidecar.estimated_tokens(session, tail=compaction.loaded_context())
            supplied, cancelled = await self._ask_client(session_id, mode, trigger, tokens_before,
                                                         compaction.message_count(), params.focus)
            if cancelled:
                return self._result(session_id, Outcome(False, mode, tokens_before, tokens_before,
                                                        reason="cancelled by client"))
            if token is not None:
                self._begin_progress(token, mode)
            try:
                outcome = await compaction.run(supplied, tokens_before)
            except SummarizerError as error:
                raise SidecarError(codes.SUMMARIZER_FAILED, f"summarizer failed: {error}") from error
            except StorageFailure as error:
                raise SidecarError(codes.STORAGE_ERROR, f"storage error: {error}") from error
        finally:
            self.sidecar.compacting.discard(session_id)
            if token is not None:
                self._end_progress(token)
            self._push_usage(session_id)
        self._record_calls(outcome.calls)
        log.info("compaction of %s (%s, %s): %s, %d -> %d tokens, %d calls, %.1f ms in the database",
                 session_id, outcome.mode, trigger, "done" if outcome.compacted else outcome.reason,
                 outcome.tokens_before, outcome.tokens_after, outcome.calls, outcome.db_seconds * 1000)
        if outcome.compacted:
            self.server.settle_later()
            self.server.protocol.notify(methods.CONTEXT_DID_COMPACT, unstructure(DidCompactParams(
                session_id=session_id, mode=outcome.mode, trigger=trigger,  # type: ignore[arg-type]
                summary_ids=outcome.summary_ids, tokens_before=outcome.tokens_before,
                tokens_after=outcome.tokens_after, tokens_rewritten=outcome.tokens_rewritten)))
        return self._result(session_id, outcome)

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
        try:
            answer = await asyncio.wait_for(
                self.server.protocol.send_request_async(methods.CONTEXT_WILL_COMPACT, params), HOOK_TIMEOUT)
        except TimeoutError:
            log.info("context/willCompact got no answer in %.0f s; proceeding", HOOK_TIMEOUT)
            return None, False
        except JsonRpcException as error:
            log.warning("context/willCompact failed (%s); proceeding", error)
            return None, False
        if not isinstance(answer, dict):
            return None, False
        if answer.get("action") == "cancel":
            return None, True
        summary = answer.get("summary")
        return (summary if isinstance(summary, str) and summary.strip() else None), False

    def _progress_reporter(self, token: Any, session_id: str) -> Any:
        progress = self.server.work_done_progress
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
            progress.report(token, lsp.WorkDoneProgressReport(message=f"{done}/{planned} summaries",
                                                               percentage=percentage, cancellable=True))

        return report

    def _begin_progress(self, token: Any, mode: str) -> None:
        progress = self.server.work_done_progress
        progress.begin(token, lsp.WorkDoneProgressBegin(title="Compacting context", message=f"{mode} compaction",
                                                        percentage=0, cancellable=True))
        task = asyncio.current_task()
        future = progress.tokens.get(token)
        if future is not None and task is not None:
            # window/workDoneProgress/cancel cancels this compaction like $/cancelRequest would.
            future.add_done_callback(lambda f: task.cancel() if f.cancelled() else None)

    def _end_progress(self, token: Any) -> None:
        progress = self.server.work_done_progress
        progress.end(token, lsp.WorkDoneProgressEnd(message="done"))
        future = progress.tokens.pop(token, None)
        if future is not None and not future.done():
            future.set_result(None)

    def _push_usage(self, session_id: str) -> None:
        session = self.sidecar.store().session(session_id)
        if session is not None:
            self.server.push_usage(self.sidecar.usage(session))

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

    def maybe_auto(self, session_id: str, usage: Usage) -> None:
        """Start a background compaction when the session is over its threshold and nothing holds it back."""
        settings = self.sidecar.settings.compaction
        if not settings.auto or settings.max_tokens == -1 or usage.tokens < usage.threshold:
            return
        if session_id in self.sidecar.compacting:
            return
        not_before, _ = self.backoff.get(session_id, (0.0, 0.0))
        if time.monotonic() < not_before:
            return
        session = self.sidecar.store().session(session_id)
        if session is None:
            return
        idle = self.idle_at.get(session_id)
        if idle is not None and session.context_count < idle + max(1, settings.leaf_chunk_size):
            return
        limit = self.sidecar.settings.llm.max_calls_per_minute
        if self.summarizer().name == "openai" and self.calls_last_minute() >= limit:
            log.info("auto-compaction of %s deferred: %d summarizer calls in the last minute", session_id, limit)
            return
        task = asyncio.get_running_loop().create_task(self._auto(session_id, session.context_count))
        self.server.background_tasks.add(task)
        task.add_done_callback(self.server.background_tasks.discard)

    async def _auto(self, session_id: str, context_count: int) -> None:
        mode = self.sidecar.settings.compaction.mode
        try:
            result = await self.compact(CompactParams(session_id=session_id, mode=mode), trigger="auto")  # type: ignore
        except asyncio.CancelledError:
            raise
        except Exception as error:
            _, delay = self.backoff.get(session_id, (0.0, FIRST_BACKOFF / 2))
            delay = min(delay * 2, MAX_BACKOFF)
            self.backoff[session_id] = (time.monotonic() + delay, delay)
            message = error.message if isinstance(error, JsonRpcException) else repr(error)
            log.warning("auto-compaction of %s failed, history kept; next try in %.0f s: %s",
                        session_id, delay, message)
            self.sidecar.auto_failed[session_id] = time.time() + delay
            self._push_usage(session_id)
            return
        self.backoff.pop(session_id, None)
        self.sidecar.auto_failed.pop(session_id, None)
        if result.compacted:
            self.idle_at.pop(session_id, None)
        else:
            self.idle_at[session_id] = context_count
