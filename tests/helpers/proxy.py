"""Running `context-sidecar proxy` as a subprocess in front of a fake provider, and reading what it forwarded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs

from sidecar.client import SidecarClient
from sidecar.testing import FakeProvider, RecordedRequest
from sidecar.testing.proxy_process import proxy_process
from sidecar.testing.replies import Reply

WAIT = 120.0
"""Seconds a request through the proxy may take on a busy machine (httpx's default is 5)."""
MARKER = re.compile(r',"cache_control":\{[^{}]*\}')


@attrs.define
class RunningProxy:
    """A proxy process, its URL and database."""

    url: str
    db: str
    log: Path
    process: asyncio.subprocess.Process

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8") if self.log.exists() else ""


@contextlib.asynccontextmanager
async def running_proxy(tmp_path: Path, upstream: str, settings: dict[str, Any] | None = None,
                        args: tuple[str, ...] = (), openai: str | None = None,
                        env: dict[str, str] | None = None, db: str | None = None) -> AsyncIterator[RunningProxy]:
    """`context-sidecar proxy --port 0` with both upstreams at ``upstream`` (an origin; ``openai``: the OpenAI one
    elsewhere), on ``db`` (default a fresh DuckDB file), stopped with SIGINT."""
    db = db or str(tmp_path / "proxy.duckdb")
    log = tmp_path / "proxy.log"
    argv = ["--db", str(db), "--log-file", str(log), "-v", "--anthropic-upstream", upstream,
            "--openai-upstream", f"{openai or upstream}/v1", *args]
    if settings is not None:
        path = tmp_path / "settings.json"
        path.write_text(json.dumps(settings))
        argv += ["--settings", str(path)]
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", **(env or {})}
    async with proxy_process(argv, env) as (url, process):
        yield RunningProxy(url, db, log, process)


@attrs.define
class Stuck:
    """A proxy whose conversation ``history`` needs a full compaction first, by a summarizer that never answers."""

    proxy: RunningProxy
    provider: FakeProvider
    """The agent's provider: it answers "answered"."""
    summarizer: FakeProvider
    """The llm settings' model (the proxy is told to use it, not the agent's): it never answers."""
    history: list[dict[str, Any]]


@contextlib.asynccontextmanager
async def stuck_in_a_compaction(tmp_path: Path, prepare_timeout: float) -> AsyncIterator[Stuck]:
    """``Stuck``: its newest messages alone are over the budget, so the proxy asks for a full compaction first."""
    history = [{"role": "user", "content": f"<<{index}>> " + "a long tool output line. " * 400} if index % 2 == 0
               else {"role": "assistant", "content": f"<<{index}>> " + "a long answer. " * 600} for index in range(7)]
    with FakeProvider(responder=lambda request: Reply(hang=True)) as summarizer, \
            FakeProvider(responder=lambda request: "answered") as provider:
        settings = {"contextWindow": 4000, "compaction": {"reserveTokens": 500, "freshTail": 2, "leafChunkSize": 2},
                    "llm": {"baseUrl": summarizer.base_url, "model": "fake-model", "timeoutSeconds": 600}}
        args = ("--prepare-timeout", f"{prepare_timeout:g}", "--summarizer", "settings")
        async with running_proxy(tmp_path, provider.url, settings, args) as proxy:
            yield Stuck(proxy, provider, summarizer, history)


def children(pid: int) -> list[int]:
    """A process's children (the proxy's: the sidecar process it started), from /proc."""
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


async def until_dead(pid: int) -> None:
    """Wait until a process killed a moment ago has exited (a zombie, or reaped): a signal is delivered when the
    process next runs, which a busy machine can put off past the next request."""
    async with asyncio.timeout(WAIT):
        while True:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError):
                return
            if state in ("Z", "X"):
                return
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def reader(db: Path | str, env: dict[str, str] | None = None) -> AsyncIterator[SidecarClient]:
    """A client on the proxy's database (through its shared host; ``env``: the proxy's extra environment, such as
    its XDG_RUNTIME_DIR), to see what was stored."""
    client = await SidecarClient.spawn(db=str(db), env={**os.environ, **env} if env else None)
    try:
        yield client
    finally:
        await client.close()


def is_summary_call(request: RecordedRequest) -> bool:
    """Whether a request is one of the sidecar's own summary calls (its summarizer's prompt), made on the agent's
    model by the proxy or the pi extension, rather than an agent's request."""
    from sidecar.summarizers.prompts import SYSTEM_PROMPT

    return SYSTEM_PROMPT[:40] in json.dumps(request.body)


def agent_requests(fake: FakeProvider) -> list[RecordedRequest]:
    """The agent's requests the fake got, without the summary calls the proxy made on the agent's model."""
    return [r for r in fake.model_requests if not is_summary_call(r)]


def messages_of(raw: bytes, key: str = "messages") -> list[str]:
    """The JSON text of each message (``key``'s elements) of a forwarded body, cache markers taken out."""
    from sidecar.proxy.jsontext import array_elements, object_members

    text = raw.decode()
    _, spans, _ = object_members(text)
    elements, _, _ = array_elements(text, spans[key][0])
    return [MARKER.sub("", text[start:end]) for start, end in elements]


def markers(raw: bytes) -> int:
    """Cache markers in a body."""
    return raw.decode().count('"cache_control"')


def unpaired_tool_calls(messages: list[dict[str, Any]]) -> list[str]:
    """Tool calls without their results right after, and results without their call right before (Anthropic)."""
    problems = []
    for index, message in enumerate(messages):
        blocks = message["content"] if isinstance(message["content"], list) else []
        calls = {b["id"] for b in blocks if b.get("type") == "tool_use"}
        if calls:
            following = messages[index + 1]["content"] if index + 1 < len(messages) else []
            answered = {b.get("tool_use_id") for b in following if isinstance(b, dict)} if isinstance(following,
                                                                                                     list) else set()
            problems += [f"call {c} at {index} unanswered" for c in calls - answered]
        results = {b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"}
        if results:
            before = messages[index - 1]["content"] if index else []
            made = {b.get("id") for b in before if isinstance(b, dict)} if isinstance(before, list) else set()
            problems += [f"result {r} at {index} without its call" for r in results - made]
    return problems
