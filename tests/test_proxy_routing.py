"""Where the proxy sends what it does not assemble, and what of a request or an answer never passes it.

Two fake providers stand for two companies: a request meant for one must never reach the other, least of all with
the agent's key.
"""

from __future__ import annotations

from pathlib import Path

import anthropic
import httpx2
import openai
import pytest

from sidecar.testing.provider import FakeProvider
from sidecar.testing.replies import Reply
from tests.helpers.proxy import WAIT, running_proxy


async def test_a_route_the_proxy_does_not_know_is_a_404_in_the_api_s_shape_and_goes_nowhere(tmp_path: Path) -> None:
    with FakeProvider() as anthropic_side, FakeProvider() as openai_side:
        async with running_proxy(tmp_path, anthropic_side.url, openai=openai_side.url) as proxy:
            async with httpx2.AsyncClient(timeout=WAIT) as http:
                # An Anthropic key on a path of no one API, without anthropic-version: once guessed to be OpenAI's.
                keyed = await http.get(f"{proxy.url}/v1/files", headers={"x-api-key": "sk-ant-secret"})
            with pytest.raises(anthropic.NotFoundError) as by_anthropic:
                await anthropic.AsyncAnthropic(api_key="sk-ant-secret", base_url=proxy.url,
                                               max_retries=0).models.list()
            with pytest.raises(openai.NotFoundError) as by_openai:
                await openai.AsyncOpenAI(api_key="sk-openai-secret", base_url=f"{proxy.url}/v1",
                                         max_retries=0).models.list()
    assert anthropic_side.requests == [] and openai_side.requests == []
    assert keyed.status_code == 404 and keyed.json()["error"]["type"] == "not_found_error"
    assert by_anthropic.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert "/v1/models" in by_openai.value.body["message"]  # type: ignore[index]  # OpenAI's shape: error.message


async def test_under_a_provider_s_prefix_everything_goes_to_that_provider_and_only_there(tmp_path: Path) -> None:
    with FakeProvider(responder=lambda request: "from anthropic") as anthropic_side, \
            FakeProvider(responder=lambda request: "from openai") as openai_side:
        async with running_proxy(tmp_path, anthropic_side.url, openai=openai_side.url) as proxy:
            claude = anthropic.AsyncAnthropic(api_key="sk-ant-secret", base_url=f"{proxy.url}/anthropic",
                                              max_retries=0)
            models = await claude.models.list()
            reply = await claude.messages.create(model="m", max_tokens=5,
                                                 messages=[{"role": "user", "content": "hi"}])
            async with httpx2.AsyncClient(timeout=WAIT) as http:
                # Not an Anthropic route, no anthropic-version: under /anthropic it is still Anthropic's.
                files = await http.get(f"{proxy.url}/anthropic/v1/files?limit=1",
                                       headers={"x-api-key": "sk-ant-secret"})
            codex = openai.AsyncOpenAI(api_key="sk-openai-secret", base_url=f"{proxy.url}/openai/v1", max_retries=0)
            listed = await codex.models.list()
            answer = await codex.responses.create(model="m", input=[{"role": "user", "content": "hi"}])
    assert [m.id for m in models.data] == ["fake-model"] and [m.id for m in listed.data] == ["fake-model"]
    assert reply.content[0].text == "from anthropic"  # type: ignore[union-attr]
    assert answer.output_text == "from openai"
    assert files.status_code == 404  # the fake's own answer: it was asked
    assert [(r.method, r.path, r.query) for r in anthropic_side.requests] == [
        ("GET", "/v1/models", {}), ("POST", "/v1/messages", {}), ("GET", "/v1/files", {"limit": ["1"]})]
    assert [(r.method, r.path) for r in openai_side.requests] == [("GET", "/v1/models"), ("POST", "/v1/responses")]
    assert all("sk-ant-secret" in str(r.headers) for r in anthropic_side.requests)  # its key went with it
    assert all("sk-ant" not in str(r.headers) for r in openai_side.requests)
    assert all("sk-openai" not in str(r.headers) for r in anthropic_side.requests)


async def test_a_cookie_one_agent_was_given_never_goes_with_another_agent_s_request(tmp_path: Path) -> None:
    with FakeProvider(responder=lambda request: "ok") as fake:
        fake.script(Reply(text="first", headers=(("set-cookie", "session=agent-one; Path=/"),)))
        async with running_proxy(tmp_path, fake.url) as proxy:
            for agent in ("one", "two"):  # two agents: two clients, each with its own cookies (none sent)
                client = anthropic.AsyncAnthropic(api_key=f"key-{agent}", base_url=proxy.url, max_retries=0)
                await client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": agent}],
                                             extra_headers={"x-context-sidecar-session": agent})
    assert len(fake.model_requests) == 2
    assert "cookie" not in fake.model_requests[1].headers


async def test_the_session_header_and_every_hop_by_hop_header_stay_with_the_proxy(tmp_path: Path) -> None:
    hop = (("connection", "x-upstream-hop"), ("x-upstream-hop", "upstream's own"), ("x-kept", "kept"))
    with FakeProvider() as fake:
        fake.script(Reply(text="ok", headers=hop))
        async with running_proxy(tmp_path, fake.url) as proxy, httpx2.AsyncClient(timeout=WAIT) as http:
            response = await http.post(f"{proxy.url}/v1/messages", json={
                "model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}, headers={
                "x-context-sidecar-session": "mine", "connection": "keep-alive, x-agent-hop",
                "x-agent-hop": "the agent's own", "keep-alive": "timeout=5", "x-api-key": "k"})
    [sent] = fake.model_requests
    assert response.status_code == 200
    assert not {"x-context-sidecar-session", "x-agent-hop", "keep-alive"} & set(sent.headers)
    assert sent.headers["x-api-key"] == "k"
    assert "x-upstream-hop" not in response.headers and response.headers["x-kept"] == "kept"


async def test_headers_that_are_not_ascii_pass_both_ways_as_their_bytes(tmp_path: Path) -> None:
    with FakeProvider() as fake:
        fake.script(Reply(text="ok", headers=(("x-note", "café"),)))  # sent as latin-1, as http.server does
        async with running_proxy(tmp_path, fake.url) as proxy, httpx2.AsyncClient(timeout=WAIT) as http:
            response = await http.post(f"{proxy.url}/v1/messages", json={
                "model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
                headers={"x-title": "projet été".encode()})
    [sent] = fake.model_requests
    assert response.status_code == 200
    assert sent.headers["x-title"] == "projet été".encode().decode("latin-1")  # the agent's bytes
    assert response.headers.raw[[k for k, _ in response.headers.raw].index(b"x-note")][1] == "café".encode("latin-1")
