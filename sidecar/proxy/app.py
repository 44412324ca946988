"""The proxy's routes: which requests are assembled, which pass through, and /stats."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Any

import attrs

from sidecar import __version__
from sidecar.proxy.adapters.base import Adapter, BadRequest, Recorded, Recorder, Request
from sidecar.proxy.conversation import Conversation, Prepared
from sidecar.proxy.core import Proxy, forget, reason
from sidecar.proxy.http import ClientGone, HttpRequest, Responder
from sidecar.proxy.routes import ANTHROPIC, JSON, Route, Routes
from sidecar.proxy.seen import Seen
from sidecar.proxy.summary_calls import SummaryCalls
from sidecar.proxy.upstream import Upstream, join, response_headers

log = logging.getLogger(__name__)

ANTHROPIC_UPSTREAM = "https://api.anthropic.com"
OPENAI_UPSTREAM = "https://api.openai.com/v1"
SESSION_HEADERS = ("x-context-sidecar-session", "x-claude-code-session-id", "session_id", "session-id")
"""The agent's own session id: ours first, then Claude Code's, then Codex's (``session_id`` in its current source,
``session-id`` in 0.169, the version the agent tests pin)."""
AGENT_HEADERS = SESSION_HEADERS[1:]
"""Under these, a request without tools is an agent's side call (a title, a topic), forwarded as it is."""
UNKNOWN_SESSION = "(unknown)"
"""Where a request is counted whose session could not be told (its preparation failed)."""
PREPARE_TIMEOUT = 60.0
"""Seconds the sidecar may take over a request before it goes upstream as the agent sent it: a full compaction of a
long session by an LLM summarizer usually fits, and the agents' own timeouts (the SDKs' 10 minutes, Codex's 5
minutes of an idle stream) are far off."""
REFUSED = frozenset({400, 413, 422})
"""Statuses by which a provider refuses a body (not the key, the rate or the model): a managed request refused so is
sent again as the agent sent it."""
SERVER_NAME = "context-sidecar proxy"


@attrs.define
class Upstreams:
    """Where each provider's requests go: base URLs, as the agents' own base URL settings take them."""

    anthropic: str = ANTHROPIC_UPSTREAM
    openai: str = OPENAI_UPSTREAM
    """Carries its version (``…/v1``), as OPENAI_BASE_URL does: ``/v1/responses`` goes to ``<openai>/responses``."""


class App:
    """Serves the agent's requests."""

    def __init__(self, proxy: Proxy, upstream: Upstream, upstreams: Upstreams, routes: Routes,
                 storage: str | None = None, prepare_timeout: float = PREPARE_TIMEOUT,
                 summary_calls: SummaryCalls | None = None, summarizer: str = "agent") -> None:
        self.proxy = proxy
        self.upstream = upstream
        self.upstreams = upstreams
        self.routes = routes
        self.storage = storage
        self.prepare_timeout = prepare_timeout
        self.summary_calls = summary_calls
        """Runs the sidecar's summary calls on the agent's model (None: ``--summarizer`` says otherwise)."""
        self.summarizer = summarizer
        """``--summarizer``: ``agent``, ``settings`` or ``deterministic``."""
        self.port: int | None = None

    async def handle(self, request: HttpRequest, responder: Responder) -> None:
        """One request from the agent."""
        if request.method == "GET" and request.path == "/stats":
            await responder.whole(200, JSON, json.dumps(self.stats(), indent=2).encode())
            return
        route = self.routes.route(request.method, request.target)
        if request.method in ("GET", "HEAD") and route.path == "/":
            # Agents check that their base URL answers (Claude Code sends HEAD /): the proxy itself does.
            body = b"" if request.method == "HEAD" else f"{SERVER_NAME}: see GET /stats\n".encode()
            await responder.whole(200, [("content-type", "text/plain")], body)
            return
        if route.provider is None:
            log.info("%s %s: no such route, answered 404", request.method, route.path)
            message = (f"{SERVER_NAME}: no route {request.method} {route.path} (a base URL that ends in /anthropic "
                       "or /openai sends everything to that provider)")
            await responder.whole(404, JSON, self.routes.error_body(request, route, 404, message))
            return
        prepared: Prepared | None = None
        encoding = request.header("content-encoding")
        if route.adapter is None:
            pass  # not assembled: it passes through
        elif encoding and encoding.strip().lower() != "identity":
            self._unmanaged(request, f"content-encoding {encoding}")
        else:
            try:
                prepared = await self.prepare(route.adapter, route.path, request, self.upstream_url(route)[1])
            except BadRequest as error:  # the provider is the judge of what it accepts
                self._unmanaged(request, f"the proxy cannot read it ({error.message})")
            except Exception as error:  # the sidecar's failure, whatever it is, never the agent's
                log.warning("%s %s: forwarded as the agent sent it (%s: %s)", request.method, route.path,
                            type(error).__name__, error)
                self.proxy.stats.unmanaged(UNKNOWN_SESSION, request.body)
                self.proxy.stats.failed(reason(error))
        await self.forward(request, responder, route, prepared)

    def _unmanaged(self, request: HttpRequest, why: str) -> None:
        """A request the proxy leaves as it is: counted, and the log says why."""
        session = next((value for name in SESSION_HEADERS if (value := request.header(name))), UNKNOWN_SESSION)
        log.info("%s %s: forwarded as the agent sent it, unmanaged: %s", request.method, request.path, why)
        self.proxy.stats.unmanaged(session, request.body)

    async def prepare(self, adapter: Adapter, path: str, request: HttpRequest, url: str | None = None) -> Prepared:
        """Read the body and let the core store and assemble it, within ``prepare_timeout`` (else the request goes
        upstream as the agent sent it); ``url``, where it goes upstream, is where the session's summary calls go."""
        parsed, seen = self.proxy.reader.read(adapter, request.body)
        name, header = next(((name, value) for name in SESSION_HEADERS if (value := request.header(name))),
                            (None, None))
        conversation = self.proxy.conversations.get(header or self.proxy.session_of(adapter, parsed, seen))
        if name in AGENT_HEADERS and not parsed.values.get("tools"):
            # Claude Code's title and topic calls carry its session id but no tools: not the agent's conversation.
            self.proxy.stats.side(conversation.session_id)
            return Prepared(request.body, conversation, None, parsed.stream)
        if self.summary_calls is not None and url is not None and not path.endswith("/count_tokens"):
            # Before its messages reach the host: a compaction they start makes its summary calls this way.
            self.summary_calls.remember(conversation.session_id, adapter.name, url, request.headers, parsed.values)
        entered = asyncio.Event()
        work = asyncio.ensure_future(self._locked(adapter, path, parsed, seen, conversation, entered))
        stalled = asyncio.ensure_future(conversation.stalled.wait())
        done, _ = await asyncio.wait((work, stalled), timeout=self.prepare_timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        stalled.cancel()
        if work in done:
            return work.result()
        if entered.is_set():
            # Left to finish (the conversation's state stays whole); the answer to this request is not recorded.
            forget(work)
            conversation.stall(work)
            why = f"the sidecar took over {self.prepare_timeout:g}s (a long compaction?)"
        else:  # it waited for the conversation, held by a preparation left to finish: nothing of it was done
            work.cancel()
            forget(work)
            why = "an earlier request of the conversation is still at the sidecar (a long compaction?)"
        log.warning("session %s: forwarded as the agent sent it: %s", conversation.session_id, why)
        self.proxy.stats.unmanaged(conversation.session_id, request.body)
        return Prepared(request.body, conversation, None, parsed.stream)

    async def _locked(self, adapter: Adapter, path: str, parsed: Request, seen: Seen,
                      conversation: Conversation, entered: asyncio.Event) -> Prepared:
        """The core's preparation, the agent's conversation locked meanwhile (``entered`` set once it is)."""
        async with conversation.lock:
            entered.set()
            if path.endswith("/count_tokens"):
                return await self.proxy.count(adapter, parsed, seen, conversation)
            return await self.proxy.prepare(adapter, parsed, seen, conversation)

    async def forward(self, request: HttpRequest, responder: Responder, route: Route,
                      prepared: Prepared | None) -> None:
        """Send the request upstream and its answer back unchanged; record the answer when it is complete.

        Should the provider refuse the sidecar's context (its status says so before a byte goes back), the request
        is sent once more as the agent sent it, unmanaged.
        """
        base, url = self.upstream_url(route)
        while True:
            body = prepared.body if prepared is not None else request.body
            try:
                async with self.upstream.send(request.method, url, request.headers, body) as response:
                    if prepared is not None and _refused(prepared, request.body, response.status_code):
                        await self._refusal(prepared, request.body, response)
                        prepared = None
                        continue
                    await self._relay(response, responder, route.adapter, prepared)
            except self.upstream.errors as error:
                if responder.started:
                    # The upstream dropped the answer midway: the agent sees its connection dropped too.
                    log.warning("%s: the upstream's answer broke off: %s", url, error)
                    raise ClientGone(f"upstream broke off: {error}") from None
                log.warning("%s unreachable: %s", url, error)
                message = f"{SERVER_NAME}: the upstream {base} is unreachable ({type(error).__name__}: {error})"
                await responder.whole(502, JSON, self.routes.error_body(request, route, 502, message))
                return
            break
        await responder.end()

    async def _refusal(self, prepared: Prepared, sent: bytes, response: Any) -> None:
        """The provider refused the body the proxy made: counted unmanaged, and the log says why."""
        assert prepared.branch is not None
        reason = _error_message(await response.aread())
        log.warning("session %s: the provider refused the sidecar's context (%d: %s); sent again as the agent sent it",
                    prepared.branch.session_id, response.status_code, reason)
        self.proxy.stats.refused(prepared.branch.session_id, sent, prepared.body)

    async def _relay(self, response: Any, responder: Responder, adapter: Adapter | None,
                     prepared: Prepared | None) -> None:
        """The upstream's answer to the agent as it comes, recorded as it passes."""
        recorder = None
        if adapter is not None and prepared is not None and prepared.branch is not None \
                and response.status_code == 200 and "content-encoding" not in response.headers:
            recorder = adapter.recorder(prepared.stream)
        await responder.start(response.status_code, response_headers(response.headers))
        async for chunk in response.aiter_raw():
            if recorder is not None:
                recorder = _fed(recorder, chunk)
            await responder.send(chunk)
        recorded = _finished(recorder)
        if recorded is not None and adapter is not None and prepared is not None:
            # Sent to the host before the agent has the whole answer (never waiting for the host): a client that
            # reads the session once it has the answer finds it there.
            await self.proxy.answers.record(adapter, prepared, recorded)

    def upstream_url(self, route: Route) -> tuple[str, str]:
        """The upstream base URL of a route, and the URL its request goes to."""
        anthropic = route.provider == ANTHROPIC
        base = self.upstreams.anthropic if anthropic else self.upstreams.openai
        return base, join(base, route.target, strip_version=not anthropic)

    def stats(self) -> dict[str, Any]:
        """What GET /stats answers."""
        return {"server": SERVER_NAME, "version": __version__, "pid": os.getpid(), "port": self.port,
                "storage": self.storage, "upstreams": {"anthropic": self.upstreams.anthropic,
                                                       "openai": self.upstreams.openai},
                "summarizer": self.summarizer,
                "summaryModel": self.summary_calls.model if self.summary_calls is not None else None,
                "uptimeSeconds": round(time.time() - self.proxy.stats.started, 1),
                "problem": problem.as_json() if (problem := self.proxy.stats.problem) is not None else None,
                "sessions": self.proxy.stats.as_json()}


def _refused(prepared: Prepared, agent_body: bytes, status: int) -> bool:
    """Whether the provider refused a body the proxy made (one that differs from the agent's)."""
    return prepared.branch is not None and status in REFUSED and prepared.body != agent_body


def _error_message(body: bytes) -> str:
    """An API error's message (Anthropic and OpenAI both say it in ``error.message``), else the body's start."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, TypeError, KeyError):
        message = body.decode("utf-8", "replace")
    text = " ".join(str(message).split())
    return text if len(text) <= 200 else text[:199] + "…"


def _fed(recorder: Recorder, chunk: bytes) -> Recorder | None:
    """The recorder once it took ``chunk``; None (the answer not recorded) should it fail."""
    try:
        recorder.feed(chunk)
    except Exception as error:
        log.warning("the answer is not recorded: reading it failed (%s: %s)", type(error).__name__, error)
        return None
    return recorder


def _finished(recorder: Recorder | None) -> Recorded | None:
    """The recorder's answer; None should it fail."""
    try:
        return recorder.finish() if recorder is not None else None
    except Exception as error:
        log.warning("the answer is not recorded: reading it failed (%s: %s)", type(error).__name__, error)
        return None
