"""context/assemble with pruning of old tool outputs on and off (issue 4)."""

from __future__ import annotations

from bench.core import BUDGET, Bench, ingest_all, percentile, timed

CASES = ("on", "off", "off_equal")
"""Prune on at 128k; prune off at 128k; prune off at a budget that returns as many messages as prune on."""


async def pruning(bench: Bench) -> None:
    """Assemble with prune true and false, interleaved, on the pi session and the grep session."""
    client = bench.live
    await ingest_all(client, "pi", bench.pi_messages(), bench.sizes.batch)
    sessions = (("pi", "pi", len(bench.pi_messages())), ("generated", "grep", bench.sizes.grep))
    for name, session_id, count in sessions:
        # Pruned outputs shrink to placeholders, so with pruning on the same budget holds more messages;
        # off_equal scales the budget so that prune off returns about as many, to compare like with like.
        on = await client.assemble(session_id, budget=BUDGET, prune=True)
        off = await client.assemble(session_id, budget=BUDGET, prune=False)
        calls = {"on": (True, BUDGET), "off": (False, BUDGET),
                 "off_equal": (False, round(BUDGET * len(on.messages) / max(len(off.messages), 1)))}
        for case, (prune, budget) in calls.items():
            first = await client.assemble(session_id, budget=budget, prune=prune)  # warm-up, not counted
            bench.info[f"prune_{name}_{case}_budget"] = budget
            bench.info[f"prune_{name}_{case}_messages"] = len(first.messages)
            bench.info[f"prune_{name}_{case}_tokens"] = first.tokens
            bench.info[f"prune_{name}_{case}_pruned"] = sum(1 for item in first.items if item.pruned)
        times: dict[str, list[float]] = {case: [] for case in CASES}
        for _ in range(bench.sizes.prune_runs):
            for case, (prune, budget) in calls.items():  # alternated, so drift hits every case alike
                times[case].append(await timed(
                    lambda s=session_id, b=budget, p=prune: client.assemble(s, budget=b, prune=p)))  # type: ignore[misc]
        p50 = {case: percentile(times[case], 50) for case in CASES}
        for case in ("on", "off"):
            for p in (50, 99):
                bench.record(f"prune_{name}_{case}_p{p}_ms", f"assemble prune {case} p{p}, {name} {count:,} items",
                             percentile(times[case], p), "ms")
        bench.record(f"prune_{name}_ratio", f"assemble p50 prune on / off, {name}", p50["on"] / p50["off"], "x")
        messages = bench.info[f"prune_{name}_off_equal_messages"]
        bench.record(f"prune_{name}_off_equal_p50_ms", f"  prune off p50 at {messages:,} messages (as many as on)",
                     p50["off_equal"], "ms")
        bench.record(f"prune_{name}_ratio_equal", f"  p50 prune on / off at as many messages, {name}",
                     p50["on"] / p50["off_equal"], "x")
