"""context/assemble with pruning of old tool outputs on and off (issue 4)."""

from __future__ import annotations

from bench.core import BUDGET, Bench, ingest_all, percentile, timed


async def pruning(bench: Bench) -> None:
    """Assemble at budget 128k with prune true and false, interleaved, on the pi session and the grep session."""
    client = bench.live
    await ingest_all(client, "pi", bench.pi_messages(), bench.sizes.batch)
    sessions = (("pi", "pi", len(bench.pi_messages())), ("generated", "grep", bench.sizes.grep))
    for name, session_id, count in sessions:
        times: dict[bool, list[float]] = {True: [], False: []}
        for prune in (True, False):  # warm-up, not counted
            first = await client.assemble(session_id, budget=BUDGET, prune=prune)
            state = "on" if prune else "off"
            bench.info[f"prune_{name}_{state}_messages"] = len(first.messages)
            bench.info[f"prune_{name}_{state}_tokens"] = first.tokens
            bench.info[f"prune_{name}_{state}_pruned"] = sum(1 for item in first.items if item.pruned)
        for _ in range(bench.sizes.prune_runs):
            for prune in (True, False):  # alternated, so drift hits both alike
                times[prune].append(await timed(
                    lambda s=session_id, p=prune: client.assemble(s, budget=BUDGET, prune=p)))  # type: ignore[misc]
        for prune, state in ((True, "on"), (False, "off")):
            for p in (50, 99):
                bench.record(f"prune_{name}_{state}_p{p}_ms", f"assemble prune {state} p{p}, {name} {count:,} items",
                             percentile(times[prune], p), "ms")
        ratio = percentile(times[True], 50) / percentile(times[False], 50)
        bench.record(f"prune_{name}_ratio", f"assemble p50 prune on / off, {name}", ratio, "x")
        # Pruned outputs shrink to placeholders, so the same budget holds more messages with pruning on.
        shares = bench.info[f"prune_{name}_off_messages"] / max(bench.info[f"prune_{name}_on_messages"], 1)
        bench.info[f"prune_{name}_ratio_per_message"] = round(ratio * shares, 3)
