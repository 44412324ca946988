"""Figures a user can see, per session: what the agent sent against what went upstream, the cache, compactions."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import attrs

from protocol.types import SummaryCallUsage
from sidecar.proxy.adapters.base import Recorded

BYTES_PER_TOKEN = 4
"""The sidecar's estimate (sidecar/engine/tokens.py): UTF-8 bytes / 4."""
CACHE_MARKER = b'"cache_control"'
WHITESPACE = frozenset(b" \t\r\n")
COMMA = ord(",")


def prompt_tokens(body: bytes) -> int:
    """Estimated tokens of a request body, its cache markers left out.

    A marker (``"cache_control": {…}``, with the comma that joins it) only steers the provider's cache, which bills
    no token for it; and the proxy puts its own markers where the agent had others. Counted, they made a
    conversation forwarded whole look larger than the agent's request.
    """
    size = len(body)
    start = body.find(CACHE_MARKER)
    while start != -1:
        end = body.find(b"}", start) + 1  # a marker's value is a flat object
        if end == 0:
            break
        before = start  # scanned, not sliced: a copy of the body before each marker cost ms per request
        while before and body[before - 1] in WHITESPACE:
            before -= 1
        if before and body[before - 1] == COMMA:
            start = before - 1
        else:  # the object's first member: the comma after it goes with it
            after = end
            while after < len(body) and body[after] in WHITESPACE:
                after += 1
            end = after + 1 if body[after:after + 1] == b"," else end
        size -= end - start
        start = body.find(CACHE_MARKER, end)
    return math.ceil(size / BYTES_PER_TOKEN)


@attrs.define
class SessionStats:
    """One sidecar session's figures since the proxy started."""

    session_id: str
    agent_session: str
    provider: str = ""
    model: str | None = None
    requests: int = 0
    unmanaged: int = 0
    """Requests forwarded as the agent sent them (the host failed them, the proxy could not read them, the provider
    refused the sidecar's context, or the API keeps the conversation)."""
    side: int = 0
    """The agent's side calls (no tools: Claude Code's titles, topics), forwarded as they are, not stored."""
    agent_tokens: int = 0
    """Estimated tokens of the bodies the agent sent (``prompt_tokens``)."""
    forwarded_tokens: int = 0
    """Estimated tokens of the bodies forwarded upstream, counted alike."""
    input_tokens: int = 0
    """The provider's figures, summed over its answers: uncached input, cache reads and writes, output."""
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    answers: int = 0
    compactions: int = 0
    compacted_tokens: int = 0
    """Tokens the compactions took off the context (before - after)."""
    summarizers: dict[str, int] = attrs.field(factory=dict)
    """The compactions' new summaries by who wrote them: ``client`` (the agent's model, through the proxy),
    ``openai`` (the sidecar's ``llm`` setting), ``deterministic``."""
    summary_model: str | None = None
    summary_calls: int = 0
    """Summary calls the proxy made on the agent's model for this session, and how many of them failed."""
    summary_failures: int = 0
    summary_input_tokens: int = 0
    summary_output_tokens: int = 0
    summary_cache_read_tokens: int = 0
    last_request: float = 0.0

    def cache_hit_rate(self) -> float | None:
        """Cache reads over all prompt tokens the provider counted; None before any."""
        prompt = self.input_tokens + self.cache_read_tokens + self.cache_write_tokens
        return round(self.cache_read_tokens / prompt, 4) if prompt else None

    def as_json(self) -> dict[str, Any]:
        """The figures as /stats shows them (camelCase)."""
        return {
            "sessionId": self.session_id, "agentSession": self.agent_session, "provider": self.provider,
            "model": self.model, "requests": self.requests, "unmanaged": self.unmanaged, "sideRequests": self.side,
            "agentTokens": self.agent_tokens, "forwardedTokens": self.forwarded_tokens,
            "forwardedShare": round(self.forwarded_tokens / self.agent_tokens, 4) if self.agent_tokens else None,
            "inputTokens": self.input_tokens, "cacheReadTokens": self.cache_read_tokens,
            "cacheWriteTokens": self.cache_write_tokens, "outputTokens": self.output_tokens,
            "cacheHitRate": self.cache_hit_rate(), "compactions": self.compactions,
            "compactedTokens": self.compacted_tokens,
            "summaries": {"writtenBy": dict(self.summarizers), "model": self.summary_model,
                          "calls": self.summary_calls, "failed": self.summary_failures,
                          "inputTokens": self.summary_input_tokens, "outputTokens": self.summary_output_tokens,
                          "cacheReadTokens": self.summary_cache_read_tokens},
            "lastRequestAt": _iso(self.last_request),
        }


@attrs.define
class Problem:
    """Why the sidecar could not take the agent's requests, which went upstream as the agent sent them."""

    message: str
    since: float
    last: float
    requests: int = 0
    """Requests it sent upstream unmanaged."""
    resolved: float | None = None
    """When a request was managed again (None: not yet)."""

    def as_json(self) -> dict[str, Any]:
        """As /stats shows it."""
        return {"message": self.message, "requests": self.requests, "since": _iso(self.since),
                "last": _iso(self.last), "resolvedAt": _iso(self.resolved) if self.resolved is not None else None}


class Stats:
    """Every session's figures, in the proxy's memory."""

    def __init__(self) -> None:
        self.sessions: dict[str, SessionStats] = {}
        self.started = time.time()
        self.problem: Problem | None = None
        """The latest reason the sidecar could not take requests."""
        self.on_problem: Callable[[Problem], None] | None = None
        """Told of each new problem (``wrap`` says the first on the terminal)."""

    def failed(self, message: str, requests: int = 1) -> None:
        """The sidecar could not take ``requests`` requests (0: a check found it so), for this reason."""
        now = time.time()
        problem = self.problem
        if problem is None or problem.resolved is not None or problem.message != message:
            problem = self.problem = Problem(message, now, now)
            if self.on_problem is not None:
                self.on_problem(problem)
        problem.requests += requests
        problem.last = now

    def _session(self, session_id: str, agent_session: str | None = None) -> SessionStats:
        found = self.sessions.get(session_id)
        if found is None:
            found = self.sessions[session_id] = SessionStats(session_id, agent_session or session_id.split("~")[0])
        return found

    def request(self, session_id: str, agent_session: str, provider: str, model: str | None, sent: bytes,
                forwarded: bytes) -> None:
        """A request forwarded with the assembled context: the body the agent ``sent`` and the one ``forwarded``."""
        entry = self._session(session_id, agent_session)
        entry.provider, entry.model = provider, model
        entry.requests += 1
        if self.problem is not None and self.problem.resolved is None:
            self.problem.resolved = time.time()
        entry.agent_tokens += prompt_tokens(sent)
        entry.forwarded_tokens += prompt_tokens(forwarded)
        entry.last_request = time.time()

    def unmanaged(self, agent_session: str, sent: bytes) -> None:
        """A request forwarded as the agent sent it."""
        entry = self._session(agent_session, agent_session)
        entry.requests += 1
        entry.unmanaged += 1
        tokens = prompt_tokens(sent)
        entry.agent_tokens += tokens
        entry.forwarded_tokens += tokens
        entry.last_request = time.time()

    def refused(self, session_id: str, sent: bytes, forwarded: bytes) -> None:
        """A request forwarded with the assembled context that the provider refused, sent again as the agent sent it
        (``sent``; ``forwarded``: the refused body)."""
        entry = self._session(session_id)
        entry.unmanaged += 1
        entry.forwarded_tokens += prompt_tokens(sent) - prompt_tokens(forwarded)

    def side(self, agent_session: str) -> None:
        """An agent's side call forwarded as it is (not counted in ``requests``)."""
        entry = self._session(agent_session, agent_session)
        entry.side += 1
        entry.last_request = time.time()

    def usage(self, session_id: str, recorded: Recorded) -> None:
        """The provider's usage of one answer."""
        entry = self._session(session_id)
        entry.answers += 1
        entry.input_tokens += recorded.input_tokens or 0
        entry.output_tokens += recorded.output_tokens or 0
        entry.cache_read_tokens += recorded.cache_read_tokens or 0
        entry.cache_write_tokens += recorded.cache_write_tokens or 0

    def compacted(self, session_id: str, before: int, after: int, summarizers: dict[str, int] | None = None) -> None:
        """A compaction of a session this proxy works on (context/didCompact), and who wrote its summaries."""
        if session_id not in self.sessions:
            return
        entry = self.sessions[session_id]
        entry.compactions += 1
        entry.compacted_tokens += max(0, before - after)
        for name, count in (summarizers or {}).items():
            entry.summarizers[name] = entry.summarizers.get(name, 0) + count

    def summary_call(self, session_id: str, model: str) -> SessionStats:
        """A summary call on the agent's model, made for the session; its entry, to count a failure on."""
        entry = self._session(session_id)
        entry.summary_calls += 1
        entry.summary_model = model
        return entry

    def summary_usage(self, session_id: str, usage: SummaryCallUsage) -> None:
        """What an answered summary call cost, as the provider reported it."""
        entry = self._session(session_id)
        entry.summary_input_tokens += usage.input_tokens
        entry.summary_output_tokens += usage.output_tokens
        entry.summary_cache_read_tokens += usage.cache_read_tokens or 0

    def as_json(self) -> list[dict[str, Any]]:
        """Every session, the most recently used first."""
        ordered = sorted(self.sessions.values(), key=lambda entry: entry.last_request, reverse=True)
        return [entry.as_json() for entry in ordered]


def _iso(when: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


WRITERS = {"client": "the agent's model", "openai": "the llm setting's model", "deterministic": "deterministic"}


def summaries_line(entry: dict[str, Any]) -> str:
    """Who wrote a session's summaries and what its summary calls cost; "" before any."""
    summaries = entry.get("summaries") or {}
    written = summaries.get("writtenBy") or {}
    calls = summaries.get("calls") or 0
    if not written and not calls:
        return ""
    model = summaries.get("model")
    names = [f"{WRITERS.get(name, name)}{f' ({model})' if name == 'client' and model else ''} {count:,}"
             for name, count in sorted(written.items())]
    text = f"summaries by {', '.join(names) or 'none yet'}"
    if calls:
        text += (f"; summary calls {calls:,} ({summaries.get('failed', 0):,} failed): "
                 f"{summaries.get('inputTokens', 0):,} tokens in, {summaries.get('outputTokens', 0):,} out, "
                 f"{summaries.get('cacheReadTokens', 0):,} cache reads")
    return text
