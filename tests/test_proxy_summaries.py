"""Summaries by the agent's own model through the proxy: the official SDKs as the agent, a fake provider upstream.

The proxy runs the sidecar's summary calls (``context/summarize``) on the agent's provider, in the agent's API, with
the agent's latest credentials and model; the agent's own requests never wait for them.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anthropic
import attrs
import httpx2
import openai
import pytest

from sidecar.client import SidecarClient
from sidecar.testing.provider import FakeProvider, RecordedRequest
from sidecar.testing.proxy_process import proxy_process
from sidecar.testing.replies import Reply
from tests.helpers.hosts import WAIT
from tests.helpers.proxy import is_summary_call

MODEL = "claude-fake-1"
RULE = "Never commit the vendored directory."
SETTINGS = {"contextWindow": 8000, "llm": {"timeoutSeconds": 5},
            "compaction": {"maxTokens": 3000, "reserveTokens": 1500, "freshTail": 4, "keepRecentTokens": 800}}
SUMMARY_TEXT = "AGENT MODEL SUMMARY: the parser work so far"
KEYS = ("sk-agent-secret-0001-aaaa", "sk-agent-secret-0002-bbbb")
"""The agent's key changes mid-session; neither may land anywhere."""



def key_of(request: RecordedRequest) -> str:
    return request.headers.get("x-api-key") or request.headers.get("authorization", "").removeprefix("Bearer ")


@attrs.define
class HeldSummary:
    """Answers summary calls; holds the first one until the agent has made ``agent_requests`` more requests."""

    agent_requests: int = 2
    answer: Callable[[], Reply] = lambda: Reply(text=SUMMARY_TEXT)
    arrived: float | None = None
    released: float | None = None
    during: int = 0
    opened: threading.Event = attrs.field(factory=threading.Event)

    def __call__(self, request: RecordedRequest) -> Reply:
        if is_summary_call(request):
            if self.arrived is None:
                self.arrived = time.monotonic()
                self.opened.wait(WAIT)
                self.released = time.monotonic()
            return self.answer()
        if self.arrived is not None and not self.opened.is_set():
            self.during += 1
            if self.during >= self.agent_requests:
                self.opened.set()
        return Reply(text=f"Done. {RULE} " + "The parser now keeps its last token. " * 12)


@contextlib.asynccontextmanager
async def proxy(tmp_path: Path, runtime: Path, upstream: str, *args: str, settings: dict[str, Any] | None = None,
                db: str | None = None) -> AsyncIterator[tuple[str, str, Path]]:
    """The proxy on ``db`` (default a fresh DuckDB file); its URL, database and log."""
    db, log = db or str(tmp_path / "proxy.duckdb"), tmp_path / "proxy.log"
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(settings or SETTINGS))
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "XDG_RUNTIME_DIR": str(runtime)}
    argv = ["--db", str(db), "--log-file", str(log), "-v", "--settings", str(path), "--anthropic-upstream",
            upstream, "--openai-upstream", f"{upstream}/v1", *args]
    async with proxy_process(argv, env) as (url, _):
        yield url, db, log


class Agent:
    """An agent loop on one of the three APIs through an official SDK; its key can change between turns."""

    def __init__(self, api: str, url: str, session: str) -> None:
        self.api, self.url, self.session = api, url, session
        self.history: list[dict[str, Any]] = []
        self.key = KEYS[0]

    async def turn(self, number: int) -> str:
        ask = f"<<u{number}>> Fix parser bug {number} in src/parser.py. {RULE} " + "Keep the tests green. " * 60
        headers = {"x-context-sidecar-session": self.session}
        self.history.append({"role": "user", "content": ask})
        if self.api == "anthropic":
            async with anthropic.AsyncAnthropic(api_key=self.key, base_url=self.url, max_retries=0) as client:
                reply = await client.messages.create(model=MODEL, max_tokens=256, system="You are a coding agent.",
                                                     messages=self.history, extra_headers=headers)
            text = "".join(block.text for block in reply.content if block.type == "text")
            self.history.append({"role": "assistant", "content": text})
            return text
        async with openai.AsyncOpenAI(api_key=self.key, base_url=f"{self.url}/v1", max_retries=0) as sdk:
            return await self._openai(sdk, headers)

    async def _openai(self, sdk: openai.AsyncOpenAI, headers: dict[str, str]) -> str:
        if self.api == "responses":
            response = await sdk.responses.create(model="gpt-5", instructions="You are a coding agent.",
                                                  input=self.history, extra_headers=headers)  # type: ignore[arg-type]
            self.history += [item.model_dump(exclude_none=True) for item in response.output]
            return response.output_text
        completion = await sdk.chat.completions.create(
            model="gpt-5", messages=[{"role": "system", "content": "You are a coding agent."}, *self.history],
            extra_headers=headers)  # type: ignore[list-item]
        text = completion.choices[0].message.content or ""
        self.history.append({"role": "assistant", "content": text})
        return text


def stats_of(url: str, session: str) -> dict[str, Any]:
    stats = httpx2.get(f"{url}/stats").json()
    return next(entry for entry in stats["sessions"] if entry["sessionId"] == session)


def landed(key: str, *places: Path) -> list[str]:
    """Files under ``places`` whose bytes hold ``key``."""
    found = []
    for place in places:
        for path in [place] if place.is_file() else place.rglob("*"):
            if path.is_file() and key.encode() in path.read_bytes():
                found.append(str(path))
    return found


@pytest.mark.parametrize(("api", "store_target"), [
    ("anthropic", "duckdb"), ("responses", "duckdb"), ("chat", "duckdb"),
    ("anthropic", "postgresql"),  # a team database as the member ALICE: the summary written back through RLS
], indirect=["store_target"])
async def test_summaries_are_written_by_the_agents_model_with_its_latest_key(tmp_path: Path, runtime: Path,
                                                                             api: str, store_target: str) -> None:
    held = HeldSummary()
    session = f"s-{api}"
    with FakeProvider(responder=held) as fake:
        async with proxy(tmp_path, runtime, fake.url, db=store_target) as (url, db, _):
            agent = Agent(api, url, session)
            for number in range(40):
                agent.key = KEYS[(number // 3) % 2]  # the key changes every three turns
                await agent.turn(number)
                if held.opened.is_set() and any(SUMMARY_TEXT in json.dumps(r.body) for r in fake.model_requests
                                                if not is_summary_call(r)):
                    break
            entry = stats_of(url, session)
            sidecar = await SidecarClient.spawn(db=db, env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)})
            try:
                for key in KEYS:
                    assert not (await sidecar.grep(session, key, scope="both")).matches
            finally:
                await sidecar.close()
        summaries = [r for r in fake.model_requests if is_summary_call(r)]
        agents = [r for r in fake.model_requests if not is_summary_call(r)]
    assert summaries, "no summary call reached the provider"
    for call in summaries:
        # The agent's API, model and the credential of its latest request before the call.
        assert call.api == {"anthropic": "anthropic", "responses": "responses", "chat": "chat"}[api]
        assert call.body["model"] == (MODEL if api == "anthropic" else "gpt-5")
        latest = [r for r in agents if r.at <= call.at][-1]
        assert key_of(call) == key_of(latest)
    # The agent's requests went on while the first summary call was held, and none waited for it.
    assert held.arrived is not None and held.released is not None
    assert len([r for r in agents if held.arrived < r.at < held.released]) >= held.agent_requests
    # What the model wrote is what later requests carry.
    carrying = [index for index, r in enumerate(agents) if SUMMARY_TEXT in json.dumps(r.body)]
    assert carrying and carrying[-1] == len(agents) - 1
    assert entry["summaries"]["writtenBy"].get("client", 0) >= 1
    assert entry["summaries"]["calls"] == len(summaries) and entry["summaries"]["inputTokens"] > 0
    assert entry["summaries"]["model"] == call.body["model"]
    for key in KEYS:  # the files here (the team database was grepped above)
        assert landed(key, tmp_path, runtime) == []


async def test_the_summary_model_option_picks_another_model(tmp_path: Path, runtime: Path) -> None:
    with FakeProvider(responder=HeldSummary(agent_requests=0)) as fake:
        async with proxy(tmp_path, runtime, fake.url, "--summary-model", "claude-haiku-4-5") as (url, _, _):
            agent = Agent("anthropic", url, "cheap")
            for number in range(30):
                await agent.turn(number)
                if any(is_summary_call(r) for r in fake.model_requests):
                    break
            fake.wait_for(is_summary_call)
    assert {r.body["model"] for r in fake.model_requests if is_summary_call(r)} == {"claude-haiku-4-5"}


FAILURES = {
    "500": lambda: Reply(status=500),
    "429": lambda: Reply(status=429, error_message="Rate limited", headers=(("retry-after", "1"),)),
    "timeout": lambda: Reply(delay=8, text=SUMMARY_TEXT),
    "garbage": lambda: Reply(malformed=True),
    "empty": lambda: Reply(empty=True),
}


@pytest.mark.parametrize("failure", FAILURES)
async def test_a_failing_summary_call_falls_back_and_the_agent_never_notices(tmp_path: Path, runtime: Path,
                                                                             failure: str) -> None:
    held = HeldSummary(agent_requests=0, answer=FAILURES[failure])
    with FakeProvider(responder=held) as fake:
        async with proxy(tmp_path, runtime, fake.url) as (url, _, _):
            agent = Agent("chat", url, "failing")
            compacted, number, deadline = False, 0, time.monotonic() + 4 * WAIT
            while not compacted and time.monotonic() < deadline:  # a timed-out call takes its timeout to fall back
                assert "The parser now keeps" in await agent.turn(number)  # every answer the agent gets is whole
                compacted = stats_of(url, "failing")["compactions"] > 0
                number += 1
            answer = await agent.turn(99)
            entry = stats_of(url, "failing")
    assert compacted and "The parser now keeps" in answer
    assert any(is_summary_call(r) for r in fake.model_requests)
    assert entry["summaries"]["writtenBy"] == {"deterministic": entry["summaries"]["writtenBy"]["deterministic"]}
    assert entry["summaries"]["failed"] >= 1 and entry["unmanaged"] == 0


async def test_summarizer_deterministic_makes_no_summary_call(tmp_path: Path, runtime: Path) -> None:
    settings = {**SETTINGS, "llm": {"model": "would-be-used", "baseUrl": "http://127.0.0.1:9/v1"}}
    with FakeProvider(responder=HeldSummary(agent_requests=0)) as fake:
        async with proxy(tmp_path, runtime, fake.url, "--summarizer", "deterministic",
                         settings=settings) as (url, _, _):
            agent = Agent("anthropic", url, "plain")
            for number in range(40):
                await agent.turn(number)
                if stats_of(url, "plain")["compactions"]:
                    break
            entry = stats_of(url, "plain")
            top = httpx2.get(f"{url}/stats").json()
    assert not any(is_summary_call(r) for r in fake.model_requests)
    assert entry["compactions"] and set(entry["summaries"]["writtenBy"]) == {"deterministic"}
    assert top["summarizer"] == "deterministic"


@pytest.mark.parametrize(("args", "message"), [
    (["--summarizer", "bogus"], "invalid choice: 'bogus'"),
    (["--summary-model", ""], "is not a model name"),
    (["--summary-model", " spaced "], "is not a model name"),
])
def test_bad_summarizer_options_are_refused(args: list[str], message: str) -> None:
    import subprocess

    for command in (["proxy"], ["wrap", *args, "claude", "--", "-p", "hi"]):
        argv = [*command, *args] if command == ["proxy"] else command
        done = subprocess.run([sys.executable, "-m", "sidecar", *argv], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and message in done.stderr, done.stderr
