"""The proxy's HTTP server: an error nobody foresaw is answered (a 502 in the API's shape), never a dropped line."""

from __future__ import annotations

import anthropic
import httpx2
import openai
import pytest

from sidecar.proxy.http import HttpRequest, Responder, start_server
from sidecar.proxy.routes import Routes, default_adapters
from tests.helpers.proxy import WAIT


async def broken(request: HttpRequest, responder: Responder) -> None:
    """A handler with a bug."""
    raise KeyError("a bug in the proxy")


async def test_an_unexpected_error_is_a_502_in_the_api_s_shape_and_the_connection_serves_on() -> None:
    server = await start_server(broken, "127.0.0.1", 0, failure=Routes(default_adapters()).failure)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        with pytest.raises(anthropic.InternalServerError) as by_anthropic:
            await anthropic.AsyncAnthropic(api_key="k", base_url=url, max_retries=0).messages.create(
                model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.InternalServerError) as by_openai:
            await openai.AsyncOpenAI(api_key="k", base_url=f"{url}/openai/v1", max_retries=0).responses.create(
                model="m", input="hi")
        async with httpx2.AsyncClient(timeout=WAIT) as http:  # one connection, kept alive across both
            first = await http.get(f"{url}/anything")
            second = await http.get(f"{url}/anything")
    finally:
        server.close()
        await server.wait_closed()
    assert by_anthropic.value.status_code == 502
    assert by_anthropic.value.body["error"]["type"] == "api_error"  # type: ignore[index]
    assert "KeyError" in by_anthropic.value.body["error"]["message"]  # type: ignore[index]
    assert by_openai.value.status_code == 502 and by_openai.value.body["type"] == "server_error"  # type: ignore[index]
    assert (first.status_code, second.status_code) == (502, 502)
