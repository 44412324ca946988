"""Calls to the provider: the agent's headers passed through (its API key among them, never stored or logged)."""

from __future__ import annotations

import http.cookiejar
import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
                        "te", "trailer", "transfer-encoding", "upgrade"})
"""Headers of one connection, not of the message (RFC 9110, 7.6.1); so are those a ``Connection`` header names."""
FRAMED = frozenset({"host", "content-length"})
"""Set again for the next hop (the client library frames the body itself, the server re-frames the answer)."""
DROPPED_REQUEST = HOP_BY_HOP | FRAMED | {"accept-encoding", "x-context-sidecar-session"}
"""Also: the upstream is asked for an uncompressed answer, which the proxy both forwards and reads; the session
header is the proxy's own."""
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 600.0
"""Between two chunks of an answer: a model may think for minutes."""


def join(base: str, target: str, strip_version: bool) -> str:
    """The upstream URL of an agent's request target; ``strip_version`` drops its leading /v1 (the OpenAI base
    URL carries its own, as OPENAI_BASE_URL does)."""
    if strip_version and (target == "/v1" or target.startswith(("/v1/", "/v1?"))):
        target = target[3:]
    return base.rstrip("/") + target


def _named(values: Iterable[str]) -> set[str]:
    """The header names the ``Connection`` header values list."""
    return {name.strip().lower() for value in values for name in value.split(",") if name.strip()}


def request_headers(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    """The agent's headers to send upstream, as the bytes it sent (read as latin-1)."""
    dropped = DROPPED_REQUEST | _named(value for name, value in headers if name == "connection")
    kept = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers if name not in dropped]
    return [*kept, (b"accept-encoding", b"identity")]


def response_headers(headers: Any) -> list[tuple[bytes, bytes]]:
    """The upstream's response headers (an httpx ``Headers``) to pass to the agent, as the bytes they came in."""
    raw: list[tuple[bytes, bytes]] = headers.raw
    named = _named(value.decode("latin-1") for name, value in raw if name.lower() == b"connection")
    dropped = HOP_BY_HOP | FRAMED | named
    return [(name, value) for name, value in raw if name.decode("latin-1").lower() not in dropped]


class _NoCookies(http.cookiejar.DefaultCookiePolicy):
    """Keeps no cookie and sends none: the client serves every agent, and a cookie is one agent's."""

    def set_ok(self, cookie: http.cookiejar.Cookie, request: Any) -> bool:
        return False

    def return_ok(self, cookie: http.cookiejar.Cookie, request: Any) -> bool:
        return False


class Upstream:
    """One pooled HTTP client for every request; connections kept alive, no cookie jar."""

    def __init__(self) -> None:
        import httpx2  # imported here so that `context-sidecar --help` stays quick

        for name in ("httpx2", "httpcore2"):  # their debug logs show requests' headers: API keys stay out of logs
            logging.getLogger(name).setLevel(logging.WARNING)
        self._httpx = httpx2
        timeout = httpx2.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT)
        self._client = httpx2.AsyncClient(timeout=timeout, follow_redirects=False,
                                          cookies=http.cookiejar.CookieJar(_NoCookies()),
                                          limits=httpx2.Limits(max_connections=64, max_keepalive_connections=16))
        self.errors: tuple[type[BaseException], ...] = (httpx2.TransportError,)

    @asynccontextmanager
    async def send(self, method: str, url: str, headers: list[tuple[str, str]], body: bytes) -> AsyncIterator[Any]:
        """A streamed response (``status_code``, ``headers``, ``aiter_raw()``); raises ``errors`` when unreachable."""
        request = self._client.build_request(method, url, headers=request_headers(headers), content=body)
        response = await self._client.send(request, stream=True)
        try:
            yield response
        finally:
            await response.aclose()

    async def close(self) -> None:
        """Close every connection."""
        await self._client.aclose()
