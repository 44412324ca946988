"""Summary calls (``context/summarize``) on the agent's own model, with the agent's own credentials.

For each agent session the proxy keeps, in memory only, how its latest request reached the provider: the API, the
upstream URL, the headers (its API key or OAuth token among them) and the model. A summary call goes the same way,
in the same API shape, with those headers: a key that changes mid-session is followed, and nothing of it is stored,
logged or sent to the sidecar.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import attrs

from protocol import errors as codes
from protocol import types as t
from sidecar.client import SidecarRequestError
from sidecar.proxy.stats import Stats
from sidecar.proxy.upstream import Upstream

log = logging.getLogger(__name__)

MAX_ANSWER_BYTES = 8 * 1024 * 1024
SECRET_HEADERS = ("x-api-key", "authorization", "api-key")
"""Headers whose values are redacted from any error text the provider echoes."""
OAUTH_PROMPT = "You are Claude Code"
"""Anthropic accepts a Claude subscription's OAuth token only with Claude Code's own first system block."""
BODY_HEADERS = frozenset({"content-encoding", "content-type", "content-length"})
"""Headers about the agent's body, not about the agent: a summary call has a body of its own."""
REASONING_ROOM = 4096
"""Output tokens added for a Responses model that reasons (its reasoning counts against max_output_tokens)."""


@attrs.define
class Route:
    """How a session's latest request reached its model: kept in the proxy's memory, never written anywhere."""

    api: str
    """The adapter's name: ``anthropic``, ``responses`` or ``chat``."""
    url: str
    headers: list[tuple[str, str]] = attrs.field(repr=False)
    """The agent's headers, credentials included (``repr`` leaves them out of any log line)."""
    model: str | None
    system_head: Any = attrs.field(default=None, repr=False)
    """Anthropic: the agent's first system block, repeated first when its credential is an OAuth token."""
    max_key: str = "max_tokens"
    """Chat Completions: the agent's own name of the answer's cap (``max_completion_tokens`` for newer models)."""
    reasoning: bool = False
    """Responses: the agent's requests ask for reasoning."""


class SummaryCalls:
    """Runs the host's summary calls as the agent's own requests, and counts what they cost per session."""

    def __init__(self, upstream: Upstream, stats: Stats, model: str | None = None) -> None:
        self.upstream = upstream
        self.stats = stats
        self.model = model
        """``--summary-model``: the model of every summary call; None for the agent's own."""
        self.routes: dict[str, Route] = {}

    def remember(self, agent_session: str, api: str, url: str, headers: list[tuple[str, str]],
                 values: dict[str, Any]) -> None:
        """The route of an agent session's latest request (its API key or token replaces the one kept)."""
        system = values.get("system")
        head = system[0] if isinstance(system, list) and system and isinstance(system[0], dict) else None
        model = values.get("model")
        self.routes[agent_session] = Route(
            api=api, url=url, headers=[(name, value) for name, value in headers if name not in BODY_HEADERS],
            model=model if isinstance(model, str) else None, system_head=head,
            max_key="max_completion_tokens" if "max_completion_tokens" in values else "max_tokens",
            reasoning=isinstance(values.get("reasoning"), dict))

    async def run(self, params: t.SummarizeParams) -> t.SummarizeResult:
        """One summary call on the session's model; SidecarRequestError (the host falls back) when it fails."""
        route = self.routes.get(params.session_id.split("~")[0])
        if route is None:
            raise SidecarRequestError(codes.SUMMARIZER_FAILED, "no request of this session reached the proxy yet")
        model = self.model or route.model
        if not model:
            raise SidecarRequestError(codes.SUMMARIZER_FAILED, "the session's requests name no model")
        entry = self.stats.summary_call(params.session_id, model)
        try:
            async with asyncio.timeout(params.deadline_seconds):
                status, data = await self._send(route, _body(route, model, params))
            if status != 200:
                raise SidecarRequestError(codes.SUMMARIZER_FAILED,
                                          f"the provider answered {status}: {_redact(_error_text(data), route)}")
            text, usage = _answer(route.api, data)
            if not text.strip():
                raise SidecarRequestError(codes.SUMMARIZER_FAILED, "the provider's answer has no text")
        except TimeoutError:
            entry.summary_failures += 1
            raise SidecarRequestError(codes.SUMMARIZER_FAILED,
                                      f"no answer within {params.deadline_seconds:g}s") from None
        except SidecarRequestError as error:
            entry.summary_failures += 1
            log.warning("summary call of %s on %s failed: %s", params.session_id, model, error.message)
            raise
        except self.upstream.errors as error:
            entry.summary_failures += 1
            raise SidecarRequestError(codes.SUMMARIZER_FAILED, f"the provider is unreachable: "
                                      f"{type(error).__name__}") from None
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            entry.summary_failures += 1
            raise SidecarRequestError(codes.SUMMARIZER_FAILED, f"the provider's answer is no summary: "
                                      f"{type(error).__name__}") from None
        self.stats.summary_usage(params.session_id, usage)
        log.info("summary call of %s on %s: %d tokens in, %d out, %d cache reads", params.session_id, model,
                 usage.input_tokens, usage.output_tokens, usage.cache_read_tokens or 0)
        return t.SummarizeResult(text=text, model=model, usage=usage)

    async def _send(self, route: Route, body: dict[str, Any]) -> tuple[int, Any]:
        """POST the body with the agent's headers; the status and the JSON answer (None when it is not JSON)."""
        raw = json.dumps(body).encode()
        headers = [*route.headers, ("content-type", "application/json")]
        async with self.upstream.send("POST", route.url, headers, raw) as response:
            chunks = bytearray()
            async for chunk in response.aiter_raw():
                chunks += chunk
                if len(chunks) > MAX_ANSWER_BYTES:
                    raise ValueError("answer too large")
            status = response.status_code
        try:
            return status, json.loads(chunks)
        except ValueError:
            if status == 200:
                raise
            return status, None


def _body(route: Route, model: str, params: t.SummarizeParams) -> dict[str, Any]:
    """The summary call in the API of the agent's requests."""
    system = "\n\n".join(str(m.get("content") or "") for m in params.messages if m.get("role") == "system")
    user = "\n\n".join(str(m.get("content") or "") for m in params.messages if m.get("role") != "system")
    if route.api == "anthropic":
        head = route.system_head
        oauth = any(name == "authorization" for name, _ in route.headers)
        if oauth and isinstance(head, dict) and str(head.get("text", "")).startswith(OAUTH_PROMPT):
            blocks: Any = [{"type": "text", "text": head["text"]}, {"type": "text", "text": system}]
        else:
            blocks = system
        return {"model": model, "max_tokens": params.max_tokens, "system": blocks,
                "messages": [{"role": "user", "content": user}]}
    if route.api == "responses":
        body: dict[str, Any] = {"model": model, "instructions": system, "store": False,
                                "input": [{"role": "user", "content": [{"type": "input_text", "text": user}]}],
                                "max_output_tokens": params.max_tokens}
        if route.reasoning:
            body["reasoning"] = {"effort": "low"}
            body["max_output_tokens"] += REASONING_ROOM
        return body
    return {"model": model, route.max_key: params.max_tokens,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}


def _answer(api: str, data: Any) -> tuple[str, t.SummaryCallUsage]:
    """The text and usage of a plain (not streamed) answer of the API."""
    if api == "anthropic":
        text = "".join(block.get("text", "") for block in data["content"] if block.get("type") == "text")
        usage = data.get("usage") or {}
        return text, t.SummaryCallUsage(
            input_tokens=_int(usage.get("input_tokens")) + _int(usage.get("cache_read_input_tokens"))
            + _int(usage.get("cache_creation_input_tokens")),
            output_tokens=_int(usage.get("output_tokens")),
            cache_read_tokens=_int(usage.get("cache_read_input_tokens")),
            cache_write_tokens=_int(usage.get("cache_creation_input_tokens")))
    if api == "responses":
        text = "".join(part.get("text", "") for item in data["output"] if item.get("type") == "message"
                       for part in item.get("content") or () if part.get("type") == "output_text")
        usage = data.get("usage") or {}
        return text, t.SummaryCallUsage(
            input_tokens=_int(usage.get("input_tokens")), output_tokens=_int(usage.get("output_tokens")),
            cache_read_tokens=_int((usage.get("input_tokens_details") or {}).get("cached_tokens")))
    choices = data["choices"]
    text = (choices[0]["message"].get("content") or "") if choices else ""
    usage = data.get("usage") or {}
    return text, t.SummaryCallUsage(
        input_tokens=_int(usage.get("prompt_tokens")), output_tokens=_int(usage.get("completion_tokens")),
        cache_read_tokens=_int((usage.get("prompt_tokens_details") or {}).get("cached_tokens")))


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _error_text(data: Any) -> str:
    error = data.get("error") if isinstance(data, dict) else None
    message = error.get("message") if isinstance(error, dict) else error if isinstance(error, str) else None
    return str(message or "no details")[:300]


def _redact(text: str, route: Route) -> str:
    """``text`` without any credential of the route (a provider may echo part of a key)."""
    for name, value in route.headers:
        if name in SECRET_HEADERS:
            for secret in (value, value.removeprefix("Bearer ").strip()):
                if len(secret) >= 8:
                    text = text.replace(secret, "***")
    return text
