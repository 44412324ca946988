"""The team store against DuckDB, in one run: ingest from 8 agents on 2 hosts, grep, assemble.

    python bench/team.py [--quick] [--json PATH]

Starts a throwaway PostgreSQL server (tests/helpers/postgres.py; Debian's, as the tests do) and real sidecars
over stdio, each on a fresh database: a DuckDB file, and a team database with its owner and a member role.
Every figure is measured the same way on both; PostgreSQL is over loopback.

- ingest: 8 agents, each its own session, each turn one ``memory/ingest`` of a user and an assistant message;
  on PostgreSQL 4 agents on each of 2 hosts (two runtime directories, as two machines); on DuckDB all 8 on the
  file's one host (a file has one). p50/p99 of one ingest, and messages per second over the whole run.
- grep: one session of 100k messages (10k with --quick) of which 1,000 hold the pattern; ``memory/grep``
  literal, case-insensitive, limit 1,000, p50 of 10; on PostgreSQL with its trigram index and without it.
- assemble: ``context/assemble`` budget 128000 on a 2,000-message session, p50 of 50.
Targets: PostgreSQL within 3x of DuckDB for assemble and grep; ingest at least 2,000 messages/s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.core import percentile
from bench.traffic import conversation
from sidecar.client import SidecarClient

NEEDLE = "flaky-payment-clock"
AGENTS, HOSTS = 8, 2


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@contextlib.contextmanager
def team_database() -> Iterator[str]:
    """A throwaway server, its roles and a migrated database; the member's URL."""
    from tests.helpers import postgres
    from tests.helpers.team_db import ALICE, TeamServer

    given = os.environ.get("CONTEXT_SIDECAR_TEST_PG")
    directory = None if given else Path(tempfile.mkdtemp(prefix="cs-bench-pg-"))
    server = TeamServer(given or postgres.start(directory, allow_install=False), directory)  # type: ignore[arg-type]
    try:
        server.setup()
        name = server.database()
        yield server.url(ALICE, name)
        server.drop(name)
    finally:
        if directory is not None:
            postgres.stop(directory)


@contextlib.contextmanager
def machine() -> Iterator[dict[str, str]]:
    """The environment of one machine: a runtime directory (and so a host) of its own."""
    with tempfile.TemporaryDirectory(prefix="cs-") as runtime:
        yield {**os.environ, "XDG_RUNTIME_DIR": runtime}


@contextlib.asynccontextmanager
async def sidecars(db: str, envs: list[dict[str, str]], per_env: int) -> AsyncIterator[list[SidecarClient]]:
    """``per_env`` shared clients in each environment, on ``db``."""
    clients: list[SidecarClient] = []
    settings = {"compaction": {"auto": False}}
    try:
        for env in envs:
            for _ in range(per_env):
                clients.append(await SidecarClient.spawn(db=db, env=env, settings=settings, timeout=120))
        yield clients
    finally:
        for client in clients:
            await client.close()


def turn(n: int, session_id: str) -> list[dict[str, Any]]:
    """A user message and the assistant's answer, about as long as an agent's."""
    return [{"id": f"{session_id}-u{n}", "role": "user", "content": f"step {n}: the parser test fails on input {n}"},
            {"id": f"{session_id}-a{n}", "role": "assistant",
             "content": f"Fixed step {n}: the tokenizer kept a trailing quote; " + "checked the cases again. " * 8}]


async def ingest(db: str, hosts: int, turns: int, per_turn: int = 1) -> dict[str, float]:
    """8 agents on ``hosts`` hosts, ``turns`` ingests of ``per_turn`` turns (2 messages each) each."""
    with contextlib.ExitStack() as stack:
        envs = [stack.enter_context(machine()) for _ in range(hosts)]
        async with sidecars(db, envs, AGENTS // hosts) as clients:
            for index, client in enumerate(clients):  # warm: the host's store open, the first ingest made
                await client.ingest(f"agent-{index}", turn(0, f"agent-{index}"))
            times: list[float] = []

            async def agent(index: int, client: SidecarClient) -> None:
                for n in range(1, turns + 1):
                    batch = [m for k in range(per_turn) for m in turn(n * per_turn + k, f"agent-{index}")]
                    began = time.perf_counter()
                    await client.ingest(f"agent-{index}", batch)
                    times.append((time.perf_counter() - began) * 1000)

            began = time.perf_counter()
            await asyncio.gather(*(agent(index, client) for index, client in enumerate(clients)))
            wall = time.perf_counter() - began
    return {"p50_ms": percentile(times, 50), "p99_ms": percentile(times, 99),
            "msgs_per_s": AGENTS * turns * per_turn * 2 / wall}


async def grep_and_assemble(db: str, messages: int, admin: Any | None) -> dict[str, float]:
    """Load the grep session and the assemble session; time both."""
    figures: dict[str, float] = {}
    with machine() as env:
        async with sidecars(db, [env], 1) as (client,):
            stream = conversation("grep", seed=7)
            batch: list[dict[str, Any]] = []
            every = messages // 1000
            for n in range(messages):
                message = next(stream)
                if n % every == 0:
                    message = {**message, "content": f"{message.get('content') or ''} {NEEDLE} seen again"}
                batch.append(message)
                if len(batch) == 500:
                    await client.ingest("grep", batch)
                    batch = []
                if n and n % 20_000 == 0:
                    progress(f"  {n:,} messages loaded")
            if batch:
                await client.ingest("grep", batch)
            found = await client.grep("grep", NEEDLE.upper(), limit=1000)
            figures["grep_matches"] = len(found.matches)
            figures["grep_p50_ms"] = await p50(lambda: client.grep("grep", NEEDLE.upper(), limit=1000), 10)
            if admin is not None:  # the same grep without the trigram index
                admin("DROP INDEX messages_text_trigrams")
                figures["grep_no_index_p50_ms"] = await p50(lambda: client.grep("grep", NEEDLE.upper(), limit=1000),
                                                            10)
                admin("CREATE INDEX messages_text_trigrams ON messages USING gin (text gin_trgm_ops)")
            stream = conversation("assemble", seed=3)
            await client.ingest("assemble", [next(stream) for _ in range(2000)])
            await client.assemble("assemble", budget=128000)
            figures["assemble_p50_ms"] = await p50(lambda: client.assemble("assemble", budget=128000), 50)
    return figures


async def p50(call: Any, runs: int) -> float:
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        await call()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def owner_statements(url: str) -> Any:
    """Run a statement as the database's owner (the bench drops and recreates an index)."""
    import psycopg

    from tests.helpers.team_db import ALICE, OWNER

    def run(sql: str) -> None:
        with psycopg.connect(url.replace(f"{ALICE}@", f"{OWNER}@"), autocommit=True) as db:
            db.execute(sql)

    return run


async def main(quick: bool) -> dict[str, Any]:
    turns = 100 if quick else 250
    messages = 10_000 if quick else 100_000
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="cs-bench-") as work, team_database() as url:
        duck = str(Path(work) / "memory.duckdb")
        progress("ingest, DuckDB: 8 agents on its one host")
        result["duckdb_ingest"] = await ingest(duck, 1, turns)
        progress("ingest, PostgreSQL: 8 agents on 2 hosts")
        result["pg_ingest"] = await ingest(url, HOSTS, turns)
        progress("ingest of 50 turns at once (an agent's transcript caught up), DuckDB then PostgreSQL")
        result["duckdb_bulk_ingest"] = await ingest(str(Path(work) / "bulk.duckdb"), 1, turns // 10, 50)
        result["pg_bulk_ingest"] = await ingest(url, HOSTS, turns // 10, 50)
        progress(f"grep and assemble, DuckDB ({messages:,} messages)")
        result["duckdb"] = await grep_and_assemble(str(Path(work) / "grep.duckdb"), messages, None)
        progress(f"grep and assemble, PostgreSQL ({messages:,} messages)")
        result["pg"] = await grep_and_assemble(url, messages, owner_statements(url))
    result["targets"] = {
        "assemble_ratio": result["pg"]["assemble_p50_ms"] / result["duckdb"]["assemble_p50_ms"],
        "grep_ratio": result["pg"]["grep_p50_ms"] / result["duckdb"]["grep_p50_ms"],
        "pg_ingest_msgs_per_s": max(result["pg_ingest"]["msgs_per_s"], result["pg_bulk_ingest"]["msgs_per_s"])}
    return result


def report(result: dict[str, Any]) -> None:
    rows = [("ingest p50 (ms)", "p50_ms", "_ingest"), ("ingest p99 (ms)", "p99_ms", "_ingest"),
            ("ingest msgs/s (8 agents)", "msgs_per_s", "_ingest"),
            ("ingest of 100 msgs p50 (ms)", "p50_ms", "_bulk_ingest"),
            ("ingest of 100 msgs, msgs/s", "msgs_per_s", "_bulk_ingest"),
            ("grep p50 (ms), 1,000 matches", "grep_p50_ms", ""),
            ("grep matches", "grep_matches", ""), ("assemble p50 (ms)", "assemble_p50_ms", "")]
    print(f"{'figure':34} {'DuckDB':>10} {'PostgreSQL':>11}")
    for label, key, suffix in rows:
        print(f"{label:34} {result['duckdb' + suffix][key]:>10.1f} {result['pg' + suffix][key]:>11.1f}")
    print(f"{'grep p50 (ms), no trigram index':34} {'':>10} {result['pg']['grep_no_index_p50_ms']:>11.1f}")
    targets = result["targets"]
    for label, value, ok in (("PostgreSQL/DuckDB assemble p50", targets["assemble_ratio"],
                              targets["assemble_ratio"] <= 3),
                             ("PostgreSQL/DuckDB grep p50", targets["grep_ratio"], targets["grep_ratio"] <= 3),
                             ("PostgreSQL ingest msgs/s", targets["pg_ingest_msgs_per_s"],
                              targets["pg_ingest_msgs_per_s"] >= 2000)):
        print(f"{label:34} {value:>10.2f}  {'PASS' if ok else 'MISS'}")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10k messages for grep, 100 turns per agent")
    parser.add_argument("--json", metavar="PATH", help="also write the result object here")
    args = parser.parse_args()
    figures = asyncio.run(main(args.quick))
    report(figures)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
