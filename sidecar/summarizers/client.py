"""The summarizer whose calls a connected client runs on its own model (``context/summarize``).

The prompts, the fitting of every call into a window, escalation and the footer stay the engine's; only the
model call crosses the connection. The client holds whatever credential the call needs: nothing of it reaches
the sidecar.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from protocol.types import SummarizeParams, SummarizeResult
from sidecar.config.settings import LlmSettings
from sidecar.summarizers.base import SummarizerError, SummaryRequest
from sidecar.summarizers.fitting import DEFAULT_WINDOW, Planner, answer_room
from sidecar.summarizers.prompts import build_prompt
from sidecar.wire import ParamsError, structure, unstructure

log = logging.getLogger(__name__)

NAME = "client"
"""What summaries written this way record as their summarizer."""

Ask = Callable[[dict[str, Any], float], Awaitable[Any]]
"""Sends ``context/summarize`` with these params to the client and returns its result within the timeout; raises
TimeoutError, or any other exception when the client answered an error or is gone."""


@attrs.define
class SummaryCalls:
    """What the client's summary calls of one compaction cost, as its provider reported it."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    models: set[str] = attrs.field(factory=set)

    def add(self, result: SummarizeResult) -> None:
        """Count one answered call."""
        self.calls += 1
        if result.model:
            self.models.add(result.model)
        if result.usage is not None:
            self.input_tokens += max(0, result.usage.input_tokens)
            self.output_tokens += max(0, result.usage.output_tokens)
            self.cache_read_tokens += max(0, result.usage.cache_read_tokens or 0)


class ClientSummarizer:
    """Summaries written by the model of the client that drives the session, one ``context/summarize`` per call."""

    name = NAME

    def __init__(self, ask: Ask, session_id: str, settings: LlmSettings) -> None:
        self.ask = ask
        self.session_id = session_id
        self.timeout = settings.timeout_seconds
        """Each call's deadline (``llm.timeoutSeconds``), sent to the client and kept by the server."""
        self.window = settings.context_window or DEFAULT_WINDOW
        """Every call is planned to fit this window: ``llm.contextWindow``, else 8192."""
        self.semaphore = asyncio.Semaphore(max(1, settings.max_concurrency))
        self.spent = SummaryCalls()

    async def summarize(self, request: SummaryRequest) -> str:
        """The summary text; raises SummarizerError when the client gives none."""
        return (await self.summarize_counted(request))[0]

    async def summarize_counted(self, request: SummaryRequest) -> tuple[str, int]:
        """The summary text and how many calls it took (more than one when the input was split to fit)."""
        planner = Planner(self._call, self.window)
        text = await planner.summarize(request)
        if not text.strip():
            raise SummarizerError("empty summary response")
        return text, planner.calls

    async def _call(self, request: SummaryRequest) -> str:
        """One call on the client's model: its text, or SummarizerError saying why there is none."""
        params = unstructure(SummarizeParams(
            session_id=self.session_id, kind=request.kind, messages=list(build_prompt(request).messages()),
            max_tokens=answer_room(request), deadline_seconds=self.timeout, aggressive=request.aggressive))
        async with self.semaphore:
            try:
                answer = await self.ask(params, self.timeout)
            except TimeoutError:
                raise SummarizerError(f"the client's summary call timed out after {self.timeout:g}s") from None
            except Exception as error:
                raise SummarizerError(f"the client's summary call failed: {str(error)[:300]}") from None
        try:
            result = structure(answer, SummarizeResult)
        except ParamsError as error:
            raise SummarizerError(f"malformed summary from the client: {error}"[:300]) from None
        if not result.text.strip():
            raise SummarizerError("empty summary response")
        self.spent.add(result)
        return result.text.strip()
