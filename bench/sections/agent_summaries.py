"""Summaries by the agent's own model through the proxy, against a real local model (issue 26).

One scripted coding session (a Chat Completions agent: a first request naming what to build, standing rules, a file
edited per turn) goes through `context-sidecar proxy` twice: with `--summarizer deterministic`, and with the agent's
model writing the summaries (`--summarizer agent`). The agent's own requests are answered at once by the kit's
`FakeProvider`; the proxy's summary calls, which reach the same upstream with the agent's key, are passed on to a
real model behind an OpenAI-compatible endpoint: `CONTEXT_SIDECAR_BENCH_MODEL_URL` (e.g. llama.cpp's
`llama-server` or Ollama, `http://127.0.0.1:8080/v1`), `CONTEXT_SIDECAR_BENCH_MODEL` (its model name). Without it
the section records nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time
import urllib.request
from typing import Any

import httpx2

from bench.core import Bench, percentile, progress
from sidecar.testing import FakeProvider, Reply, ToolCall
from sidecar.testing.provider import RecordedRequest
from sidecar.testing.proxy_process import proxy_process
from sidecar.testing.replies import Usage
from tests.helpers.proxy import is_summary_call

MODEL_URL = "CONTEXT_SIDECAR_BENCH_MODEL_URL"
MODEL_NAME = "CONTEXT_SIDECAR_BENCH_MODEL"
FIRST = ("Implement a token-bucket rate limiter named TokenBucket in src/limiter/bucket.py. It must use "
         "time.monotonic, refill at rate_per_second, and expose try_acquire(cost); raise QuotaExceeded from "
         "src/limiter/errors.py when the bucket is empty.")
TERMS = ("TokenBucket", "src/limiter/bucket.py", "time.monotonic", "rate_per_second", "try_acquire", "QuotaExceeded")
"""What the first request names, which a summary of it should keep."""
RULES = ("Never commit anything under vendor/ in this repository.",
         "Always run pytest -q before you report a change as done.",
         "Do not add runtime dependencies without asking first.",
         "You must keep the public API of the limiter package unchanged.")
TURNS = 20
SETTINGS = {"contextWindow": 32_000, "llm": {"timeoutSeconds": 900, "maxConcurrency": 1, "contextWindow": 2048},
            "compaction": {"maxTokens": 2_500, "freshTail": 4, "keepRecentTokens": 600, "summarizeAhead": 0.7}}
"""A threshold reached a few times in the session; each summary call is planned to fit 2,048 tokens, so that a
small model on a CPU answers it in minutes."""
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")


def path_of(turn: int) -> str:
    return "src/limiter/bucket.py" if turn == 0 else f"src/limiter/step_{turn}.py"


def user_text(turn: int) -> str:
    if turn == 0:
        return FIRST
    rule = f" {RULES[turn % len(RULES)]}" if turn % 7 == 1 else ""
    return (f"Turn {turn}: extend {path_of(turn)} so that the limiter handles case {turn}.{rule} "
            + "Keep the change small and explain it. " * 12)


class Upstream:
    """Answers the agent at once (an edit per turn, then a short report) and passes summary calls to the model."""

    def __init__(self, url: str | None, model: str) -> None:
        self.url, self.model = url, model
        self.calls: list[tuple[float, float, int, int]] = []
        """Per summary call: (start, end, input tokens, output tokens)."""
        self.lock = threading.Lock()

    def __call__(self, request: RecordedRequest) -> Reply:
        body = request.body
        if is_summary_call(request):
            return self.summarize(body)
        last = body["messages"][-1]
        if last["role"] == "user":
            found = re.search(r"Turn (\d+)", str(last["content"]))
            turn = int(found.group(1)) if found else 0
            return Reply(tool_calls=(ToolCall("edit", {"path": path_of(turn), "change": f"case {turn}"}),))
        return Reply(text="Done: the change is in place and the tests pass.")

    def summarize(self, body: dict[str, Any]) -> Reply:
        started = time.monotonic()
        if self.url is None:
            return Reply(status=500)
        request = urllib.request.Request(
            f"{self.url.rstrip('/')}/chat/completions", method="POST", headers={"content-type": "application/json"},
            data=json.dumps({"model": self.model, "messages": body["messages"], "temperature": 0.2,
                             "max_tokens": body.get("max_tokens") or body.get("max_completion_tokens")}).encode())
        with urllib.request.urlopen(request, timeout=600) as response:
            answer = json.loads(response.read())
        usage = answer.get("usage") or {}
        text = answer["choices"][0]["message"]["content"] or ""
        with self.lock:
            self.calls.append((started, time.monotonic(), int(usage.get("prompt_tokens") or 0),
                               int(usage.get("completion_tokens") or 0)))
        return Reply(text=text, usage=Usage(input=usage.get("prompt_tokens"), output=usage.get("completion_tokens")))


async def session(bench: Bench, upstream: Upstream, summarizer: str) -> dict[str, Any]:
    """The scripted session through a proxy of its own; what it kept and how long each request took."""
    workdir = bench.workdir / f"summaries-{summarizer}"
    workdir.mkdir(exist_ok=True)
    (workdir / "settings.json").write_text(json.dumps(SETTINGS))
    log = workdir / "proxy.log"
    with FakeProvider(responder=upstream) as fake:
        argv = ["--db", str(workdir / "db.duckdb"), "--log-file", str(log), "-v", "--settings",
                str(workdir / "settings.json"), "--openai-upstream", fake.base_url, "--summarizer", summarizer,
                "--no-share"]
        async with proxy_process(argv, {**os.environ, "NO_PROXY": "127.0.0.1,localhost"}) as (url, _):
            latencies: list[tuple[float, float]] = []
            history: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful coding agent."}]
            headers = {"authorization": "Bearer bench-agent-key", "x-context-sidecar-session": f"bench-{summarizer}"}
            async with httpx2.AsyncClient(timeout=900) as http:
                for turn in range(TURNS + 1):
                    if turn == TURNS:
                        # The last turn once the compactions begun meanwhile have landed (a small model on a CPU
                        # may take minutes per summary call): its prompt is what the session kept.
                        await settled(http, url, f"bench-{summarizer}", upstream)
                    history.append({"role": "user", "content": user_text(turn)})
                    for _ in range(2):
                        started = time.monotonic()
                        reply = (await http.post(f"{url}/v1/chat/completions", headers=headers,
                                                 json={"model": "agent-model", "messages": history})).json()
                        latencies.append((started, time.monotonic()))
                        message = reply["choices"][0]["message"]
                        history.append({k: v for k, v in message.items() if v is not None})
                        if not message.get("tool_calls"):
                            break
                        call = message["tool_calls"][0]
                        history.append({"role": "tool", "tool_call_id": call["id"],
                                        "content": f"edited {json.loads(call['function']['arguments'])['path']}\n"
                                                   + "    return self.tokens  # unchanged\n" * 12})
                stats = (await http.get(f"{url}/stats")).json()
        last = [r for r in fake.model_requests if not is_summary_call(r)][-1]
    prompt = json.dumps(last.body["messages"], ensure_ascii=False)
    entry = next(s for s in stats["sessions"] if s["sessionId"] == f"bench-{summarizer}")
    summaries = [m["content"] for m in last.body["messages"] if m["role"] == "user"
                 and str(m["content"]).startswith("<summary")]
    return {"prompt": prompt, "latencies": latencies, "stats": entry, "log": log.read_text(encoding="utf-8"),
            "summaries": summaries}


async def settled(http: httpx2.AsyncClient, url: str, session: str, upstream: Upstream) -> None:
    """Wait (up to the summary calls' deadline) until no summary call is in flight and a compaction landed."""
    deadline = time.monotonic() + float(SETTINGS["llm"]["timeoutSeconds"])  # type: ignore[index]
    while time.monotonic() < deadline:
        entry = next((s for s in (await http.get(f"{url}/stats")).json()["sessions"] if s["sessionId"] == session),
                     None)
        calls = entry["summaries"]["calls"] if entry else 0
        if entry and entry["compactions"] and len(upstream.calls) + entry["summaries"]["failed"] >= calls:
            return
        if entry and not calls and entry["compactions"]:
            return
        await asyncio.sleep(1)


def kept(run: dict[str, Any]) -> dict[str, float]:
    """Shares of the edited files, the rules and the first request's terms in the session's last prompt."""
    prompt = run["prompt"]
    edited = [path_of(turn) for turn in range(TURNS)]
    return {"files": sum(p in prompt for p in edited) / len(edited),
            "rules": sum(rule in prompt for rule in RULES) / len(RULES),
            "terms": sum(term in prompt for term in TERMS) / len(TERMS)}


def stamps(log: str, text: str) -> list[float]:
    """Times (seconds, from the log's clock) of the log lines that contain ``text``."""
    out = []
    for line in log.splitlines():
        found = STAMP.match(line)
        if found and text in line:
            clock = time.strptime(found.group(1)[:19], "%Y-%m-%d %H:%M:%S")
            out.append(time.mktime(clock) + int(found.group(1)[20:]) / 1000)
    return out


async def agent_summaries(bench: Bench) -> None:
    """The session with deterministic and model-written summaries: what each kept, latency, summary tokens."""
    url, model = os.environ.get(MODEL_URL), os.environ.get(MODEL_NAME, "local")
    if not url:
        why = f"no local model: set {MODEL_URL} (see bench/README.md)"
        progress(f"agent summaries skipped: {why}")
        bench.record_missing("summaries_model_terms", "first-request terms kept, model-written", "share", why)
        return
    progress("agent summaries: deterministic")
    det = await session(bench, Upstream(None, model), "deterministic")
    progress(f"agent summaries: the agent's model ({model} at {url})")
    upstream = Upstream(url, model)
    written = await session(bench, upstream, "agent")
    for key, run in (("det", det), ("model", written)):
        shares = kept(run)
        name = "deterministic" if key == "det" else "model-written"
        bench.record(f"summaries_{key}_files", f"edited files kept, {name}", shares["files"], "share")
        bench.record(f"summaries_{key}_rules", f"rules kept, {name}", shares["rules"], "share")
        bench.record(f"summaries_{key}_terms", f"first-request terms kept, {name}", shares["terms"], "share")
        bench.info[f"summaries_{key}_compactions"] = run["stats"]["compactions"]
        bench.info[f"summaries_{key}_written_by"] = run["stats"]["summaries"]["writtenBy"]
        bench.info[f"summaries_{key}_first_summary"] = (run["summaries"] or [""])[0][:1500]
    crossed = stamps(written["log"], "reached its threshold")
    landed = stamps(written["log"], "the summaries written ahead replace the history now")
    began = stamps(written["log"], "its summaries are written ahead")
    ready = stamps(written["log"], "summaries written ahead, waiting for the threshold")
    # Threshold to summary ready: 0 when it was written before the threshold (it lands with the crossing).
    gaps = [max(0.0, next((a for a in landed if a >= c), c) - c) for c in crossed]
    bench.record("summaries_threshold_to_ready_max_s", "threshold to summary ready, worst", max(gaps, default=0), "s")
    bench.info["summaries_ahead"] = {"begun": len(began), "writtenBeforeThreshold": len(ready),
                                     "crossed": len(crossed), "landed": len(landed), "gapsSeconds": gaps,
                                     "writingSeconds": [round(b - a, 2) for a, b in zip(began, ready, strict=False)]}
    during = [(end - start) * 1000 for start, end in written["latencies"]
              if any(s <= start <= e or s <= end <= e for s, e, _, _ in upstream.calls)]
    calm = [(end - start) * 1000 for start, end in written["latencies"]
            if not any(s <= start <= e or s <= end <= e for s, e, _, _ in upstream.calls)]
    none = [(end - start) * 1000 for start, end in det["latencies"]]
    for key, values in (("during", during), ("calm", calm), ("deterministic", none)):
        if values:
            bench.record(f"summaries_latency_{key}_p50_ms", f"agent request latency, {key}, p50",
                         percentile(values, 50), "ms")
            bench.record(f"summaries_latency_{key}_p99_ms", f"agent request latency, {key}, p99",
                         percentile(values, 99), "ms")
    bench.info["summaries_latency_counts"] = {"during": len(during), "calm": len(calm), "deterministic": len(none)}
    spent = written["stats"]["summaries"]
    session_tokens = sum(written["stats"][k] for k in ("inputTokens", "cacheReadTokens", "cacheWriteTokens",
                                                       "outputTokens"))
    bench.record("summaries_call_tokens", "summary calls' tokens (in + out)",
                 spent["inputTokens"] + spent["outputTokens"], "tok")
    bench.record("summaries_session_tokens", "the session's own tokens (in + out)", session_tokens, "tok")
    bench.record("summaries_token_share", "summary calls' tokens / the session's",
                 (spent["inputTokens"] + spent["outputTokens"]) / max(session_tokens, 1), "share")
    bench.info["summaries_calls"] = {"calls": spent["calls"], "failed": spent["failed"], "model": spent["model"],
                                     "wallSeconds": [round(e - s, 2) for s, e, _, _ in upstream.calls]}
    print(side_by_side(det, written), flush=True)


def side_by_side(det: dict[str, Any], written: dict[str, Any]) -> str:
    """The two runs' retention in two columns."""
    a, b = kept(det), kept(written)
    rows = [("kept in the last prompt", "deterministic", "model-written")]
    rows += [(label, f"{a[key]:.0%}", f"{b[key]:.0%}") for key, label in
             (("files", "edited files"), ("rules", "standing rules"), ("terms", "first-request terms"))]
    return "\n".join(f"{r[0]:<26}{r[1]:>15}{r[2]:>15}" for r in rows)


