"""Live messages: ingest writes only the message row, and every read counts what it left out.

The session's counters and context are checked against the database after every step of random
sequences of ingests, compactions, usage reports, pruning-rule changes and restarts.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import duckdb
import pytest

from protocol.types import IngestParams, ReportUsageParams, SessionInfo
from sidecar.cli.synthetic import coding_session
from sidecar.config.settings import read_settings
from sidecar.engine.assembly import is_prunable
from sidecar.services.compaction.engine import Compaction
from sidecar.services.context import report_usage
from sidecar.services.memory import ingest
from sidecar.services.state import Sidecar
from sidecar.storage import Storage
from sidecar.storage.migrations import MIGRATIONS
from sidecar.summarizers.deterministic import DeterministicSummarizer


def make_sidecar(path: Path, protected: list[str]) -> Sidecar:
    settings, problems = read_settings({"compaction": {"auto": False, "freshTail": 6, "leafChunkSize": 6},
                                        "prune": {"protectedTools": protected}})
    assert not problems
    return Sidecar(settings=settings, storage_path=str(path))


def params(batch: list[dict], title: str | None = None) -> IngestParams:
    return IngestParams(session_id="s", messages=batch, session=SessionInfo(title=title) if title else None)


def check(sidecar: Sidecar) -> None:
    """The cached session equals the one read afresh, and both agree with the rows of the database."""
    store = sidecar.store()
    cached = sidecar.session("s")
    store._sessions.clear()
    store._tails.drop()
    fresh = sidecar.session("s")
    assert cached == fresh
    context = store.context(fresh)
    assert [item.position for item in context] == sorted({item.position for item in context})
    assert len(context) == fresh.context_count
    assert sum(item.tokens for item in context) == fresh.context_tokens
    count, tokens = sidecar.prune_totals(fresh)
    prunable = [item for item in context if is_prunable(item, sidecar.prune_rule())]
    assert (count, tokens) == (len(prunable), sum(item.tokens for item in prunable))
    db = store._db
    assert fresh.message_count == db.execute("SELECT count(*) FROM messages WHERE session_id = 's'").fetchone()[0]
    stored_ids = {row[0] for row in db.execute("SELECT ref_id FROM context_items WHERE session_id = 's'").fetchall()}
    live_ids = {row[0] for row in db.execute("SELECT id FROM messages WHERE session_id = 's' AND seq > ?",
                                             [fresh.live_after]).fetchall()}
    assert not stored_ids & live_ids  # no message is in the context twice
    assert fresh.live_count == len(live_ids)


@pytest.mark.parametrize("seed", range(6))
def test_counters_and_context_agree_with_the_database_through_random_histories(tmp_path, seed):
    rng = random.Random(seed)
    path = tmp_path / "db.duckdb"
    messages = coding_session(700, seed=seed)
    sent = 0
    protected = ["skill"]
    sidecar = make_sidecar(path, protected)
    for _ in range(40):
        step = rng.choice(["ingest", "ingest", "ingest", "resend", "compact", "report", "rule", "restart"])
        if step in ("ingest", "resend") and sent < len(messages):
            start = max(0, sent - rng.randint(1, 5)) if step == "resend" else sent
            batch = messages[start:sent + rng.choice([1, 1, 3, 40])]
            sent = max(sent, start + len(batch))
            title = rng.choice([None, None, "a title", "another"])
            ingest(sidecar, params(batch, title))
        elif sent == 0:
            continue
        elif step == "compact":
            asyncio.run(Compaction(sidecar, "s", rng.choice(["incremental", "full"]), None,
                                   DeterministicSummarizer()).run())
        elif step == "report":
            report_usage(sidecar, ReportUsageParams(session_id="s", input_tokens=rng.randint(1000, 9000),
                                                    output_tokens=10))
        elif step == "rule":
            protected = rng.choice([["skill"], ["read"], ["read", "grep"], []])
            sidecar.settings = make_sidecar(path, protected).settings
        elif step == "restart":
            sidecar.close()
            sidecar = make_sidecar(path, protected)
        check(sidecar)
    sidecar.close()


def test_a_report_after_a_restart_is_still_current_and_an_ingest_ends_it(tmp_path):
    path = tmp_path / "db.duckdb"
    sidecar = make_sidecar(path, ["skill"])
    messages = coding_session(60)
    ingest(sidecar, params(messages[:40], None))
    report_usage(sidecar, ReportUsageParams(session_id="s", input_tokens=5000, output_tokens=10))
    assert sidecar.usage(sidecar.session("s")).source == "provider"
    sidecar.close()
    sidecar = make_sidecar(path, ["skill"])
    assert sidecar.usage(sidecar.session("s")).source == "provider"
    ingest(sidecar, params(messages[40:41], None))
    assert sidecar.usage(sidecar.session("s")).source == "estimate"
    sidecar.close()


def test_a_database_from_before_live_messages_keeps_its_context(tmp_path):
    """Migration 003 on a file whose every message has its context item, as ingest wrote them before."""
    path = str(tmp_path / "old.duckdb")
    db = duckdb.connect(path)
    db.execute("CREATE TABLE schema_migrations (name VARCHAR PRIMARY KEY, applied_at TIMESTAMP)")
    for name, migration in MIGRATIONS[:2]:
        migration(db)
        db.execute("INSERT INTO schema_migrations VALUES (?, now())", [name])
    db.execute("INSERT INTO sessions (session_id, created_at, updated_at, message_count, context_tokens, "
               "context_count, first_position, last_position, revision, prunable_rule) "
               "VALUES ('s', now(), now(), 5, 50, 4, 1, 5, 7, '20:skill')")
    for seq in range(1, 6):
        db.execute("INSERT INTO messages VALUES ('s', ?, ?, 'user', '{}', 'x', NULL, NULL, NULL, 10, now(), now())",
                   [f"m{seq}", seq])
    # Messages 1 and 2 were compacted away; 3 to 5 are still in the context.
    for seq in range(3, 6):
        db.execute("INSERT INTO context_items VALUES ('s', ?, 'message', ?, 'user', 10, NULL, NULL, NULL)",
                   [seq, f"m{seq}"])
    db.execute("INSERT INTO context_items VALUES ('s', 1, 'summary', 'sum1', 'user', 20, NULL, NULL, NULL)")
    db.close()
    store = Storage.open(path)
    session = store.session("s")
    assert session.live_after == 5 and session.live_count == 0
    assert (session.message_count, session.context_count, session.context_tokens, session.revision) == (5, 4, 50, 7)
    assert [item.ref_id for item in store.context(session)] == ["sum1", "m3", "m4", "m5"]
    store.close()
