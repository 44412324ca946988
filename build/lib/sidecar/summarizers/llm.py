"""The summarizer that calls an OpenAI-compatible chat completions endpoint."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import TYPE_CHECKING, Any, cast

from sidecar.config.settings import LlmSettings, Settings
from sidecar.summarizers.base import Summarizer, SummarizerError, SummaryRequest
from sidecar.summarizers.deterministic import DeterministicSummarizer
from sidecar.summarizers.fitting import Planner, summarizer_window
from sidecar.summarizers.prompts import build_prompt

if TYPE_CHECKING:
    import openai
    from openai import AsyncStream
    from openai.types.chat import ChatCompletionChunk

log = logging.getLogger(__name__)

PLACEHOLDER_API_KEY = "not-needed"
"""Sent when a base URL is set but no key: local servers need none, the openai client needs one."""

_RETRY_STATUSES = frozenset({408, 409, 429})


class _Transient(Exception):
    """A failure worth retrying; carries the reason for the final error message."""

    def __init__(self, reason: str, retry_after: float | None = None, data: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after
        self.data = data


class OpenAISummarizer:
    """Summaries from an OpenAI-compatible endpoint, streamed, with retries and bounded concurrency."""

    name = "openai"

    def __init__(self, settings: LlmSettings, *, stream: bool = True, max_retries: int = 2,
                 backoff_seconds: float = 0.5, max_backoff_seconds: float = 8.0) -> None:
        if not settings.model:
            raise ValueError("the openai summarizer needs llm.model")
        self.settings = settings
        self.stream = stream
        self.max_retries = max(0, max_retries)
        self.backoff_seconds = backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.window = summarizer_window(settings)
        """The model's context window: every call is planned to fit it."""
        # The HTTP client and the semaphore belong to one event loop; both are made again on another.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self._http: Any = None

    async def summarize(self, request: SummaryRequest) -> str:
        """The summary text, in calls that each fit the model's window; raises SummarizerError."""
        return (await self.summarize_counted(request))[0]

    async def summarize_counted(self, request: SummaryRequest) -> tuple[str, int]:
        """The summary text and how many calls it took (more than one when the input was split)."""
        planner = Planner(lambda part: self.complete(build_prompt(part).messages()), self.window)
        text = await planner.summarize(request)
        if not text.strip():
            raise SummarizerError("empty summary response")
        return text, planner.calls

    async def complete(self, messages: list[dict[str, str]]) -> str:
        """One chat completion of ``messages``, with retries; raises SummarizerError after they are spent."""
        attempts = self.max_retries + 1
        for attempt in range(attempts):
            try:
                async with self._limit():
                    return await self._attempt(messages)
            except _Transient as transient:
                if attempt + 1 >= attempts:
                    raise SummarizerError(f"{transient} (after {attempts} attempts)", transient.data) from None
                delay = self._delay(attempt, transient.retry_after)
                log.warning("summarizer attempt %d of %d failed: %s; retrying in %.2fs",
                            attempt + 1, attempts, transient, delay)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        """Close the pooled HTTP connections."""
        http, self._http, self._loop = self._http, None, None
        if http is not None:
            await http.aclose()

    def _limit(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._semaphore is None:
            self._loop, self._http = loop, None
            self._semaphore = asyncio.Semaphore(max(1, self.settings.max_concurrency))
        return self._semaphore

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        backoff = min(self.backoff_seconds * 2**attempt, self.max_backoff_seconds)
        if retry_after is not None and 0 <= retry_after <= self.max_backoff_seconds:
            return max(backoff, retry_after)
        return backoff

    async def _attempt(self, messages: list[dict[str, str]]) -> str:
        """One HTTP call; transient failures raise _Transient, others SummarizerError."""
        import openai  # here, not at module import: it costs ~0.3 s of start-up

        key = self._api_key()
        client = self._client(openai, key)
        timeout = self.settings.timeout_seconds
        try:
            async with asyncio.timeout(timeout):
                call = self._streamed if self.stream else self._whole
                text = await call(client, messages)
        except TimeoutError:
            raise _Transient(f"summarizer request timed out after {timeout:g}s") from None
        except openai.APIStatusError as error:
            detail = _redact(_detail(error), key)
            reason = f"summarizer request failed: HTTP {error.status_code}: {detail}"
            data = _error_data(error, detail, error.status_code)
            if error.status_code in _RETRY_STATUSES or error.status_code >= 500:
                raise _Transient(reason, _retry_after(error), data) from None
            raise SummarizerError(reason, data) from None
        except openai.APITimeoutError:
            raise _Transient(f"summarizer request timed out after {timeout:g}s") from None
        except openai.APIConnectionError as error:
            raise _Transient(_redact(f"cannot reach the summarizer endpoint: {_cause(error)}", key)) from None
        except openai.APIError as error:  # an error event in the middle of a stream
            detail = _redact(_detail(error), key)
            raise SummarizerError(f"summarizer endpoint error during the response: {detail}",
                                  _error_data(error, detail, None)) from None
        except (openai.OpenAIError, ValueError) as error:
            raise SummarizerError(_redact(f"malformed summarizer response: {error}"[:300], key)) from None
        except _transport_errors() as error:
            raise _Transient(_redact(f"summarizer connection failed: {_cause(error)}", key)) from None
        if not text.strip():
            raise SummarizerError("empty summary response")
        return text.strip()

    async def _whole(self, client: openai.AsyncOpenAI, messages: list[dict[str, str]]) -> str:
        completion = await client.chat.completions.create(
            model=self.settings.model or "", messages=messages,  # type: ignore[arg-type]
            temperature=self.settings.temperature)
        if not isinstance(getattr(completion, "choices", None), list):
            raise ValueError("no choices in the response")
        return "".join(choice.message.content or "" for choice in completion.choices[:1])

    async def _streamed(self, client: openai.AsyncOpenAI, messages: list[dict[str, str]]) -> str:
        stream = cast("AsyncStream[ChatCompletionChunk]", await client.chat.completions.create(
            model=self.settings.model or "", messages=messages,  # type: ignore[arg-type]
            temperature=self.settings.temperature, stream=True))
        pieces: list[str] = []
        try:
            async for chunk in stream:
                for choice in chunk.choices or ():
                    if choice.index == 0 and choice.delta is not None and choice.delta.content:
                        pieces.append(choice.delta.content)
        finally:
            await stream.close()
        return "".join(pieces)

    def _api_key(self) -> str:
        """The key, read from the environment on every call and never kept."""
        key = os.environ.get(self.settings.api_key_env, "")
        if key:
            return key
        if self.settings.base_url:
            return PLACEHOLDER_API_KEY
        raise SummarizerError(f"no API key: the environment variable {self.settings.api_key_env} is not set")

    def _client(self, sdk: Any, key: str) -> openai.AsyncOpenAI:
        """A light per-call client over the shared connection pool, so the key lives only for this call."""
        if self._http is None:
            self._http = sdk.DefaultAsyncHttpxClient()
        return sdk.AsyncOpenAI(api_key=key, base_url=self.settings.base_url, http_client=self._http,
                                  timeout=self.settings.timeout_seconds, max_retries=0)


def summarizer_from_settings(settings: LlmSettings | Settings) -> Summarizer:
    """The OpenAI summarizer when the llm settings are usable, else the deterministic one."""
    llm = settings.llm if isinstance(settings, Settings) else settings
    if llm.model and (os.environ.get(llm.api_key_env) or llm.base_url):
        return OpenAISummarizer(llm)
    return DeterministicSummarizer()


def _detail(error: Any) -> str:
    body = getattr(error, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else None
        if isinstance(message, str) and message:
            return message[:300]
    return str(getattr(error, "message", "") or "no details")[:300]


def _error_data(error: Any, detail: str, status: int | None) -> dict[str, Any]:
    """-32010's data: the endpoint's HTTP status, error code and message."""
    body = getattr(error, "body", None)
    inner = body.get("error", body) if isinstance(body, dict) else None
    code = inner.get("code") if isinstance(inner, dict) else None
    return {"status": status, "code": code if isinstance(code, (str, int)) else None, "message": detail}


def _cause(error: BaseException) -> str:
    cause = error.__cause__ or error.__context__
    text = f"{error}" + (f" ({type(cause).__name__}: {cause})" if cause and str(cause) else "")
    return text[:300]


def _retry_after(error: Any) -> float | None:
    try:
        return float(error.response.headers.get("retry-after", ""))
    except (AttributeError, TypeError, ValueError):
        return None


def _redact(text: str, key: str) -> str:
    return text.replace(key, "***") if key and key != PLACEHOLDER_API_KEY else text


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP library's transport errors, which can surface while a stream is read."""
    errors: list[type[BaseException]] = []
    for name in ("httpx2", "httpx"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "TransportError"):
            errors.append(module.TransportError)
    return tuple(errors)
