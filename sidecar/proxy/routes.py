"""Where a request goes: the provider it is for (never a guess) and the adapter that assembles it, if any.

A request under ``/anthropic`` or ``/openai`` (the base URLs ``wrap`` gives the agents) is that provider's, whatever
its path: it goes there with the prefix taken off. Without a prefix, a route of one API only (``/v1/messages…``,
``/v1/responses…``, ``/v1/chat/completions…``) is that API's; any other has no upstream and is answered 404, so that
an agent's key never goes to a company it was not meant for.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import attrs

from sidecar.proxy.adapters.anthropic import AnthropicAdapter
from sidecar.proxy.adapters.base import Adapter
from sidecar.proxy.adapters.chat import ChatAdapter
from sidecar.proxy.adapters.responses import ResponsesAdapter
from sidecar.proxy.http import HttpRequest

ANTHROPIC, OPENAI = "anthropic", "openai"
PREFIXES = (ANTHROPIC, OPENAI)
"""``/<provider>/…``: everything under it goes to that provider."""
FAMILIES = {ANTHROPIC: ("/v1/messages",), OPENAI: ("/v1/responses", "/v1/chat/completions")}
"""Routes of one API only, and below them: without a prefix, a request there goes to that API's upstream."""
JSON = [("content-type", "application/json")]


def default_adapters() -> dict[str, Adapter]:
    """The routes the proxy assembles: ``METHOD path`` → the adapter of that API."""
    anthropic = AnthropicAdapter()
    return {"POST /v1/messages": anthropic, "POST /v1/messages/count_tokens": anthropic,
            "POST /v1/responses": ResponsesAdapter(), "POST /v1/chat/completions": ChatAdapter()}


def provider_of(adapter: Adapter) -> str:
    """The provider whose API an adapter speaks."""
    return ANTHROPIC if adapter.name == ANTHROPIC else OPENAI


@attrs.define
class Route:
    """A request's destination."""

    provider: str | None
    """``anthropic`` or ``openai``; None when the request is for no upstream (answered 404)."""
    target: str
    """The request target as the provider is asked it (a prefix taken off)."""
    adapter: Adapter | None
    """The adapter that assembles it; None when it passes through untouched."""
    prefixed: bool = False

    @property
    def path(self) -> str:
        """The target without its query."""
        return self.target.partition("?")[0]


class Routes:
    """The route table, and errors in the shape of the API a request is for."""

    def __init__(self, adapters: Mapping[str, Adapter]) -> None:
        self.adapters = dict(adapters)
        shapes = {provider_of(adapter): adapter for adapter in self.adapters.values()}
        self._anthropic, self._openai = shapes.get(ANTHROPIC), shapes.get(OPENAI)

    def route(self, method: str, target: str) -> Route:
        """Where ``method target`` goes."""
        provider, prefixed = None, False
        for name in PREFIXES:
            prefix = f"/{name}"
            if target == prefix or target.startswith((f"{prefix}/", f"{prefix}?")):
                rest = target[len(prefix):]
                provider, target, prefixed = name, rest if rest.startswith("/") else f"/{rest}", True
                break
        path = target.partition("?")[0]
        adapter = self.adapters.get(f"{method} {path}")
        if adapter is not None and provider is not None and provider_of(adapter) != provider:
            adapter = None  # another API's route under this provider's prefix: it goes there as it is
        if provider is None:
            provider = provider_of(adapter) if adapter is not None else next(
                (name for name, roots in FAMILIES.items() if any(path == root or path.startswith(f"{root}/")
                                                                 for root in roots)), None)
        return Route(provider, target, adapter, prefixed)

    def error_body(self, request: HttpRequest, route: Route | None, status: int, message: str) -> bytes:
        """An error in the shape of the API the request is for (Anthropic's when it says so by its headers)."""
        if route is not None and route.adapter is not None:
            return route.adapter.error_body(status, message)
        provider = route.provider if route is not None else None
        if provider is None:
            provider = ANTHROPIC if request.header("anthropic-version") or request.header("x-api-key") else OPENAI
        shape = self._anthropic if provider == ANTHROPIC else self._openai
        if shape is None:
            return json.dumps({"error": {"message": message, "type": "proxy_error"}}).encode()
        return shape.error_body(status, message)

    def failure(self, request: HttpRequest, message: str) -> tuple[list[tuple[str, str]], bytes]:
        """The 502 for an error nobody foresaw (``http.serve``'s last resort)."""
        try:
            route: Route | None = self.route(request.method, request.target)
        except Exception:  # the route itself failing: the shape by the headers
            route = None
        return JSON, self.error_body(request, route, 502, message)
