"""Per-turn context/assemble with ``since``: only the appended messages travel (issue 12)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from bench.core import BUDGET, Bench, percentile, timed
from bench.traffic import Message
from protocol import methods


def unit(stream: Iterator[Message]) -> list[Message]:
    """The next message with the tool results answering its calls: what an agent ingests before its next call."""
    messages = [next(stream)]
    waiting = {call["id"] for call in messages[0].get("tool_calls") or ()}
    while waiting:
        messages.append(next(stream))
        waiting.discard(messages[-1].get("tool_call_id"))
    return messages


async def delta(bench: Bench) -> None:
    """A turn ingests one unit, then assembles: alternately a delta (``since``) and a full reply, at budget 128k."""
    client = bench.live
    p50: dict[str, float] = {}
    for name, session_id, count in (("small", "small", bench.sizes.small),
                                    ("large", bench.info["large_session"], bench.sizes.large)):
        stream = bench.stream(session_id)
        params: dict[str, Any] = {"sessionId": session_id, "budget": BUDGET}
        revision = (await client.request(methods.CONTEXT_ASSEMBLE, params))["revision"]  # warm-up, not counted
        times: dict[str, list[float]] = {"delta": [], "full": []}
        kept: list[int] = []
        for turn in range(2 * bench.sizes.assemble_runs):
            await client.ingest(session_id, unit(stream))
            case = "delta" if turn % 2 else "full"
            call = {**params, "since": revision} if case == "delta" else params
            replies: list[dict[str, Any]] = []

            async def one(call: dict[str, Any] = call, replies: list[dict[str, Any]] = replies) -> None:
                replies.append(await client.request(methods.CONTEXT_ASSEMBLE, call))

            times[case].append(await timed(one))
            revision = replies[0]["revision"]
            if case == "delta":
                kept.append(1 if replies[0].get("delta") else 0)
        bench.info[f"assemble_delta_{name}_share"] = round(sum(kept) / max(1, len(kept)), 3)
        p50[name] = percentile(times["delta"], 50)
        bench.record(f"assemble_delta_{name}_p50_ms", f"per-turn delta assemble p50, {count:,} items", p50[name],
                     "ms")
        bench.record(f"assemble_turn_full_{name}_p50_ms", f"  per-turn full reply p50, {count:,} items",
                     percentile(times["full"], 50), "ms")
    bench.record("assemble_delta_ratio", "delta assemble p50 large / small", p50["large"] / p50["small"], "x")
