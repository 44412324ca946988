"""Calls to the provider: the agent's headers passed through (its API key among them, never stored or logged)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
                        "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length"})
"""Headers of one connection, not of the request (RFC 9110, 7.6.1), and those the client library sets itself."""
DROPPED_REQUEST = HOP_BY_HOP | {"accept-encoding"}
"""The upstream is asked for an uncompressed answer, which the proxy both forwards and reads."""
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 600.0
"""Between two chunks of an answer: a model may think for minutes."""


def join(base: str, target: str, strip_version: bool) -> str:
    """The upstream URL of an agent's request target; ``strip_version`` drops its leading /v1 (the OpenAI base
    URL carries its own, as OPENAI_BASE_URL does)."""
    if strip_version and (target == "/v1" or target.startswith(("/v1/", "/v1?"))):
        target = target[3:]
    return base.rstrip("/") + target


def request_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The agent's headers to send upstream (the client library frames the body itself)."""
    return [*((name, value) for name, value in headers if name not in DROPPED_REQUEST), ("accept-encoding", "identity")]


def response_headers(headers: Any) -> list[tuple[str, str]]:
    """The upstream's response headers to pass to the agent (the body is re-framed for this connection)."""
    return [(name, value) for name, value in headers.multi_items() if name.lower() not in HOP_BY_HOP]


class Upstream:
    """One pooled HTTP client for every request; connections kept alive."""

    def __init__(self) -> None:
        import httpx2  # imported here so that `context-sidecar --help` stays quick

        for name in ("httpx2", "httpcore2"):  # their debug logs show requests' headers: API keys stay out of logs
            logging.getLogger(name).setLevel(logging.WARNING)
        self._httpx = httpx2
        timeout = httpx2.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT)
        self._client = httpx2.AsyncClient(timeout=timeout, follow_redirects=False,
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
