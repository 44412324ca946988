"""The proxy: its overhead per request against the fake upstream called directly, and the pi session's input cost.

Overhead: a conversation of about 100k tokens (10k with --tiny) in the Anthropic format, one step (an answer and a
new user message) appended per request, as an agent resends it; the same requests to the fake directly and through
the proxy (a process of its own, as users run it; auto-compaction off, so both send the same history), the paths
taking turns in blocks, non-streamed (whole reply) and streamed (time to the first byte). A third path, through
the proxy but left untouched (an agent's side call: its session header and no tools), is the HTTP hop and the
read of the body: what the proxy's own work adds is the managed path's time less that one. Cost: the pi
session replayed as a Chat Completions agent, one request per model call of the transcript, through the proxy with
default settings (it compacts), priced with the prompt-cache model of `context-sidecar replay`; against the same
requests sent straight to the upstream, and against what the original agent paid as its transcript records it.
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bench.core as core
from bench.core import Bench, percentile, progress
from sidecar.cli.prompt_cache import PromptCache
from sidecar.cli.proxy_command import ProxyOptions, running
from sidecar.testing import FakeProvider, Reply, ToolCall
from sidecar.testing.proxy_process import proxy_process
from tests.helpers.proxy import is_summary_call

HEADERS = {"x-api-key": "bench", "anthropic-version": "2023-06-01", "content-type": "application/json"}
OVERHEAD_SETTINGS = {"contextWindow": 1_000_000, "compaction": {"auto": False, "maxTokens": -1},
                     "prune": {"enabled": False}}
"""Both paths send the whole history: no compaction, no pruning."""
BLOCK = 25
"""Requests per block; the paths take turns block by block."""
UNTOUCHED = {"x-claude-code-session-id": "bench-side-call"}
"""An agent's session header and no tools in the body: the proxy forwards such a request as it is (a side call)."""


def history(tokens: int) -> list[dict[str, Any]]:
    """An Anthropic conversation of about ``tokens`` tokens: tool calls and 1.2 kB outputs."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing parser tests."}]
    step = 0
    while sum(len(json.dumps(m, separators=(",", ":"))) for m in messages) < tokens * 4:
        call = f"toolu_{step:06d}"
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Reading module {step}."},
            {"type": "tool_use", "id": call, "name": "read", "input": {"path": f"src/module_{step}.py"}}]})
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call, "content":
                         f"# module {step}\n" + "def parse(tokens):\n    return tokens.pop()\n" * 28}]})
        step += 1
    messages.append({"role": "user", "content": "Now run the tests."})
    return messages


async def _steps(http: Any, paths: Sequence[tuple[str, dict[str, str]]], runs: int, stream: bool,
                 tokens: int) -> list[list[float]]:
    """Milliseconds per request (to the first byte when streamed) on each path (a URL and its headers), one step
    appended to each one's conversation per request: ``runs`` each, in blocks that take turns (so that all meet the
    machine's load alike), the first request of each block not counted (another path's work may still run then)."""
    histories = [history(tokens) for _ in paths]
    times: list[list[float]] = [[] for _ in paths]
    for index, (url, headers) in enumerate(paths):  # the first request stores the whole history
        await _step(http, url, headers, histories[index], stream)
    block = 0
    while min(len(path_times) for path_times in times) < runs:
        index = block % len(paths)
        url, headers = paths[index]
        for step in range(BLOCK + 1):
            took = await _step(http, url, headers, histories[index], stream)
            if step and len(times[index]) < runs:
                times[index].append(took)
        block += 1
    return times


async def _step(http: Any, url: str, headers: dict[str, str], messages: list[dict[str, Any]], stream: bool) -> float:
    """One request of the conversation (milliseconds, to the first byte when streamed); the agent's next step
    appended."""
    body = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": stream, "messages": messages},
                      separators=(",", ":")).encode()
    start = time.perf_counter()
    async with http.stream("POST", f"{url}/v1/messages", content=body,
                           headers={**HEADERS, **headers}) as response:
        first = None
        async for _ in response.aiter_raw():
            first = first or time.perf_counter()
        done = time.perf_counter()
    step = _step_number(messages[-1]["content"])
    messages.append({"role": "assistant", "content": [{"type": "text", "text": f"step {step} done"}]})
    messages.append({"role": "user", "content": f"Go on with step {step + 1}."})
    return (((first or done) if stream else done) - start) * 1000


async def overhead(bench: Bench, workdir: Path) -> None:
    """Proxy overhead per request, p50 and p99, plain and streamed."""
    import httpx2

    tokens = 10_000 if bench.sizes.large < 10_000 else 100_000
    runs = bench.sizes.single // 3 if bench.sizes.large < 10_000 else bench.sizes.single
    with FakeProvider(responder=lambda request: Reply(text=_step_text(request))) as fake:
        args = ["--no-share", "--db", str(workdir / "proxy-overhead.duckdb"), "--log-file",
                str(workdir / "proxy-overhead.log"), "--settings", json.dumps(OVERHEAD_SETTINGS),
                "--anthropic-upstream", fake.url, "--openai-upstream", fake.base_url]
        async with proxy_process(args) as (proxy, _), httpx2.AsyncClient(timeout=120) as http:
            for stream in (False, True):
                name = "ttfb" if stream else "request"
                progress(f"proxy: {runs} requests with {tokens:,} tokens of history, {name}, direct, through the "
                         f"proxy untouched and managed, in turns of {BLOCK}")
                managed = {"x-context-sidecar-session": f"bench-{name}"}
                direct, hop, proxied = await _steps(http, ((fake.url, {}), (proxy, UNTOUCHED), (proxy, managed)),
                                                    runs, stream, tokens)
                what = "time to first byte, streamed" if stream else "request, not streamed"
                bench.record(f"proxy_{name}_direct_p50_ms", f"{what}, {tokens // 1000}k history, direct p50",
                             percentile(direct, 50), "ms")
                bench.record(f"proxy_{name}_p50_ms", "  through the proxy p50", percentile(proxied, 50), "ms")
                bench.record(f"proxy_{name}_overhead_p50_ms", "  proxy overhead p50",
                             percentile(proxied, 50) - percentile(direct, 50), "ms")
                bench.record(f"proxy_{name}_overhead_p99_ms", "  proxy overhead p99",
                             percentile(proxied, 99) - percentile(direct, 99), "ms")
                bench.record(f"proxy_{name}_hop_p50_ms", "    of which untouched (HTTP hop, body read) p50",
                             percentile(hop, 50) - percentile(direct, 50), "ms")


def _step_text(request: Any) -> str:
    """The answer the agent loop expects: the step its newest message names."""
    return f"step {_step_number(request.body['messages'][-1]['content'])} done"


def _step_number(content: Any) -> int:
    """The step a user message asks for ("Go on with step N."), 0 for the opening."""
    return int(content.rsplit(" ", 1)[-1].rstrip(".")) if isinstance(content, str) and content.startswith("Go on") \
        else 0


def _chat(message: dict[str, Any]) -> dict[str, Any]:
    """A transcript message as a Chat Completions agent sends it."""
    kept = {key: message[key] for key in ("role", "content", "tool_calls", "tool_call_id", "name") if key in message}
    if isinstance(kept.get("content"), list) and all(p.get("type") == "text" for p in kept["content"]):
        kept["content"] = "\n".join(p["text"] for p in kept["content"])
    return kept


def _tokens(messages: list[dict[str, Any]]) -> list[int]:
    return [math.ceil(len(json.dumps(m, ensure_ascii=False, separators=(",", ":")).encode()) / 4) + 4
            for m in messages]


async def pi_cost(bench: Bench, workdir: Path) -> None:
    """The pi session through the proxy: input cost against straight to the upstream and the original agent's."""
    import httpx2

    from sidecar.importers import parse_transcript

    keys = ("proxy_pi_cost", "proxy_pi_direct_cost", "proxy_pi_original_cost", "proxy_pi_cost_ratio",
            "proxy_pi_hit_rate")
    if not core.PI_SESSION.exists():
        for key in keys:
            bench.record_missing(key, key.replace("_", " "), "", f"{core.PI_SESSION} not found")
        return
    parsed = parse_transcript(core.PI_SESSION, "pi")
    messages = parsed.messages[:bench.sizes.pi_messages] if bench.sizes.pi_messages else parsed.messages
    chat = [_chat(m) for m in messages]
    calls = [index for index, m in enumerate(chat) if m["role"] == "assistant" and index]
    answers = collections.deque(Reply(text=str(chat[i].get("content") or "") or None,
                                      tool_calls=tuple(ToolCall(c["function"]["name"], c["function"]["arguments"],
                                                                id=c["id"]) for c in chat[i].get("tool_calls") or ()))
                                for i in calls)
    original = 0.0
    for message in messages:
        usage = (message.get("metadata") or {}).get("usage") or {}
        original += usage.get("input", 0) + 0.1 * usage.get("cacheRead", 0) + 1.25 * usage.get("cacheWrite", 0)
    direct = PromptCache()
    proxied = PromptCache()
    progress(f"proxy: the pi session's {len(calls)} model calls through the proxy")
    def respond(request: Any) -> Reply:
        """The session's own answers in turn; the summary calls the proxy makes on the agent's model get a summary."""
        if is_summary_call(request):
            return Reply(text="Summary of the pi session so far: the files read and edited, the decisions taken.")
        return answers.popleft()

    with FakeProvider(responder=respond) as fake:
        options = ProxyOptions(port=0, db=str(workdir / "proxy-pi.duckdb"), anthropic_upstream=fake.url,
                               openai_upstream=fake.base_url, share=False,
                               settings={"models": {"pi-replay": {"contextWindow": 200_000}}})
        async with running(options) as app, httpx2.AsyncClient(timeout=120) as http:
            for index in calls:
                sent = chat[:index]
                direct.send(sent, _tokens(sent))
                body = {"model": "pi-replay", "messages": sent}
                reply = await http.post(f"http://127.0.0.1:{app.port}/v1/chat/completions", json=body,
                                        headers={"x-context-sidecar-session": "bench-pi", "authorization": "k"})
                reply.raise_for_status()
                forwarded = next(r for r in reversed(fake.model_requests) if not is_summary_call(r)).body["messages"]
                proxied.send(forwarded, _tokens(forwarded))
            stats = app.stats()["sessions"]
    bench.record("proxy_pi_cost", "pi session through the proxy: input cost (uncached-token units)", proxied.cost,
                 "tok")
    bench.record("proxy_pi_direct_cost", "  the same requests straight to the upstream", direct.cost, "tok")
    bench.record("proxy_pi_original_cost", "  what the original agent paid (its transcript's usage)", original, "tok")
    bench.record("proxy_pi_cost_ratio", "  input cost through the proxy / straight", proxied.cost / direct.cost, "x")
    bench.record("proxy_pi_hit_rate", "  prefix hit rate through the proxy", proxied.hit_rate, "share")
    bench.record("proxy_pi_branches", "  sessions the replay made (1: no branch)", len(stats), "")


async def proxy(bench: Bench) -> None:
    """Overhead and the pi session's cost, on databases of their own."""
    workdir = Path(tempfile.mkdtemp(prefix="cs-proxy-", dir=bench.workdir))
    await overhead(bench, workdir)
    await pi_cost(bench, workdir)
    await asyncio.sleep(0)
