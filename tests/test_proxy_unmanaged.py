"""The provider judges what the agent sends: what the proxy cannot read, or what the provider refuses of the proxy's
rewriting, goes upstream as the agent sent it (counted unmanaged, the log saying why), never answered by the proxy."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest

from sidecar.testing.provider import FakeProvider
from sidecar.testing.replies import Reply
from tests.helpers.proxy import WAIT, agent_requests, reader, running_proxy


def stats_of(url: str, session: str) -> dict[str, Any]:
    return next(s for s in httpx2.get(f"{url}/stats", timeout=WAIT).json()["sessions"] if s["sessionId"] == session)


async def test_a_compressed_body_goes_upstream_unchanged_and_the_provider_answers_it(tmp_path: Path) -> None:
    body = json.dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "<<zipped>>"}]})
    zipped = gzip.compress(body.encode())
    with FakeProvider() as fake:
        async with running_proxy(tmp_path, fake.url) as proxy:
            async with httpx2.AsyncClient(timeout=WAIT) as http:
                response = await http.post(f"{proxy.url}/v1/messages", content=zipped, headers={
                    "content-type": "application/json", "content-encoding": "gzip",
                    "x-context-sidecar-session": "zipped"})
            figures = stats_of(proxy.url, "zipped")
            async with reader(proxy.db) as sidecar:
                listed = await sidecar.sessions()
            log = proxy.log_text()
    [sent] = fake.requests
    assert sent.raw == zipped and sent.headers["content-encoding"] == "gzip"  # as the agent sent it
    assert response.status_code == 400 and "not valid JSON" in response.text  # the provider's answer (it unzips not)
    assert (figures["requests"], figures["unmanaged"]) == (1, 1) and listed.sessions == []
    assert "content-encoding gzip" in log


@pytest.mark.parametrize("body", [
    b"{not json",
    b'{"model": "m", "max_tokens": 5}',
    b'{"model": "m", "max_tokens": 5, "messages": {"role": "user"}}',
    b'{"model": "m", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}',
    b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [1]}]}',
])
async def test_a_body_the_proxy_cannot_read_goes_upstream_as_it_is_and_nothing_is_stored(tmp_path: Path,
                                                                                       body: bytes) -> None:
    with FakeProvider(responder=lambda request: "the provider's answer") as fake:
        async with running_proxy(tmp_path, fake.url) as proxy:
            async with httpx2.AsyncClient(timeout=WAIT) as http:
                response = await http.post(f"{proxy.url}/v1/messages", content=body, headers={
                    "content-type": "application/json", "x-context-sidecar-session": "odd"})
            figures = stats_of(proxy.url, "odd")
            async with reader(proxy.db) as sidecar:
                listed = await sidecar.sessions()
    [sent] = fake.requests
    assert sent.raw == body
    assert response.status_code == (400 if sent.body is None else 200)  # the provider's verdict, whatever it is
    assert figures["unmanaged"] == 1 and listed.sessions == []


def refusing_all_but(history: list[dict[str, Any]]) -> Any:
    """A provider that refuses any conversation but the agent's own (what the proxy made of it among them)."""

    def respond(request: Any) -> Reply | str:
        if request.body["messages"] != history:
            return Reply(status=400, error_message="messages.0.content: this provider wants the opening")
        return "answered from the agent's own body"

    return respond


async def test_a_rewritten_body_the_provider_refuses_is_sent_again_as_the_agent_sent_it(tmp_path: Path) -> None:
    settings = {"contextWindow": 8000, "compaction": {"maxTokens": 4000, "reserveTokens": 1500, "freshTail": 2,
                                                      "keepRecentTokens": 1000}}
    history = [{"role": "user" if index % 2 == 0 else "assistant",
                "content": f"<<{index}>> " + "the parser keeps the last token. " * 150} for index in range(11)]
    with FakeProvider(responder=refusing_all_but(history)) as fake:
        async with running_proxy(tmp_path, fake.url, settings) as proxy:
            client = anthropic.AsyncAnthropic(api_key="k", base_url=proxy.url, max_retries=0)
            for stream in (False, True):
                arguments: dict[str, Any] = {"model": "m", "max_tokens": 5, "messages": history,
                                             "extra_headers": {"x-context-sidecar-session": "refused"}}
                if stream:
                    async with client.messages.stream(**arguments) as streamed:
                        reply = await streamed.get_final_message()
                else:
                    reply = await client.messages.create(**arguments)
                assert reply.content[0].text == "answered from the agent's own body"  # type: ignore[union-attr]
            figures = stats_of(proxy.url, "refused")
            log = proxy.log_text()
    requests = agent_requests(fake)  # without the summary calls the proxy makes on the agent's model (refused too)
    assert len(requests) == 4  # each request: the proxy's body, refused, then the agent's
    for rewritten, retried in (requests[0:2], requests[2:4]):
        assert rewritten.body["messages"] != history  # the sidecar's context, within the window
        assert retried.body["messages"] == history  # the agent's own
    assert figures["unmanaged"] == 2
    assert log.count("the provider refused the sidecar's context (400: messages.0.content: this provider wants") == 2
