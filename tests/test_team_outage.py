"""The team database going away loses nothing: ingests answer at once, kept in a spool, sent exactly once, in order."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import psycopg
import pytest

from protocol import errors as codes
from sidecar.client import SidecarClient, SidecarRequestError
from tests.helpers.hosts import short_runtime
from tests.helpers.team_db import ALICE, TeamServer, stopped

OUTAGE_SECONDS = 30.0
"""How long the server stays stopped while the agent goes on (the scenario of the issue, not a wait)."""
WAIT = 60.0


def message(n: int) -> dict[str, str]:
    return {"id": f"m{n:04d}", "role": "user" if n % 2 == 0 else "assistant", "content": f"step {n}: edited the parser"}


async def test_a_stopped_server_loses_no_message_and_stores_none_twice(team_server: TeamServer, team_database: str,
                                                                       tmp_path: Path) -> None:
    url = team_server.url(ALICE, team_database)
    with short_runtime() as runtime:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("PG")}, "XDG_RUNTIME_DIR": str(runtime),
               "XDG_DATA_HOME": str(tmp_path / "data")}
        log_file = tmp_path / "sidecar.log"
        client = await SidecarClient.spawn(db=url, env=env, timeout=WAIT, command=[
            sys.executable, "-P", "-m", "sidecar", "-v", "--log-file", str(log_file)])
        slowest = {"before": 0.0, "during": 0.0, "after": 0.0}
        sent = 0

        async def send(count: int, phase: str) -> None:
            nonlocal sent
            for _ in range(count):
                began = time.monotonic()
                result = await client.ingest("s", [message(sent)])
                slowest[phase] = max(slowest[phase], time.monotonic() - began)
                assert result.ids == [f"m{sent:04d}"]
                sent += 1

        try:
            await send(20, "before")
            with stopped(team_server):
                ended = time.monotonic() + OUTAGE_SECONDS
                while time.monotonic() < ended:
                    await send(5, "during")
                    await asyncio.sleep(0.05)  # an agent's pace, not a wait for anything
                with pytest.raises(SidecarRequestError) as caught:  # a read answers at once, saying why
                    await client.grep("s", "parser")
                assert caught.value.code == codes.STORAGE_ERROR and "cannot be reached" in str(caught.value)
            during = sent
            await send(10, "after")  # after the restart, while the spool drains: still in order behind it
            try:
                async with asyncio.timeout(WAIT):
                    while (await _stored(url)) < sent:
                        await asyncio.sleep(0.2)
            except TimeoutError:
                pytest.fail(f"the spool did not reach the server: {await _stored(url)} of {sent} stored; the log:\n"
                            f"{log_file.read_text()[-5000:]}")
            usage = await client.usage("s")
            assert usage.messages == sent
        finally:
            await client.close()
    with psycopg.connect(url) as db:
        ids = [row[0] for row in db.execute("SELECT id FROM messages WHERE session_id = 's' ORDER BY seq")]
    assert ids == [f"m{n:04d}" for n in range(sent)]  # every one, once, in order
    assert not list((tmp_path / "data").rglob("*.jsonl"))  # the spool is empty and gone
    print(f"{sent} messages, {during - 20} ingested during a {OUTAGE_SECONDS:.0f} s outage; the slowest ingest "
          "answered in " + ", ".join(f"{1000 * seconds:.0f} ms {phase} it" for phase, seconds in slowest.items()))


async def _stored(url: str) -> int:
    try:
        async with await psycopg.AsyncConnection.connect(url) as db:
            cursor = await db.execute("SELECT count(*) FROM messages WHERE session_id = 's'")
            row = await cursor.fetchone()
            return int(row[0]) if row else 0
    except psycopg.OperationalError:
        return 0
