"""A database DuckDB invalidated is opened again, with every committed message; checkpoints get headroom."""

from __future__ import annotations

import json
import os
import random
import string
from pathlib import Path

import duckdb
import pytest

from protocol.types import AssembleParams, IngestParams, SessionInfo
from sidecar.config.settings import read_settings
from sidecar.engine.messages import message_row
from sidecar.services.context import assemble_context
from sidecar.services.errors import SidecarError
from sidecar.services.memory import ingest
from sidecar.services.state import Sidecar
from sidecar.storage import Storage
from sidecar.storage.connection import invalidating

BLOB = "".join(random.Random(0).choice(string.ascii_letters + " ") for _ in range(400_000))


def pasted_log(n: int) -> dict:
    """A user message of 200 KB (the most one part may count) that compresses about as badly as real logs."""
    return {"id": f"log-{n}", "role": "user", "content": f"{n} " + BLOB[n * 37 % 200_000:][:200_000]}


def count(store: Storage) -> int:
    return store._db.execute("SELECT count(*) FROM messages").fetchall()[0][0]


def test_checkpoints_of_large_outputs_under_64mb_do_not_invalidate_the_database(tmp_path: Path):
    # Before checkpoints ran under DuckDB's default limit, the one after about 390 of these failed
    # ("failed to pin block") and every later statement answered "database has been invalidated".
    path = str(tmp_path / "big.duckdb")
    store = Storage.open(path, "64MB")
    for start in range(0, 480, 10):
        rows = [message_row(pasted_log(n), 10**6, {}) for n in range(start, start + 10)]
        store.ingest("s", rows, {}, [False] * 10, "0:")
    assert not store.invalidated
    assert count(store) == 480
    store.close()
    store = Storage.open(path, "64MB")
    assert count(store) == 480
    assert store._db.execute("SELECT current_setting('memory_limit')").fetchall()[0][0] in ("61.0 MiB", "64.0 MB")
    store.close()


def test_an_invalidated_database_is_opened_again_on_the_next_request(tmp_path: Path):
    settings, problems = read_settings({"compaction": {"auto": False}})
    assert not problems
    sidecar = Sidecar(settings=settings, storage_path=str(tmp_path / "db.duckdb"))
    ingest(sidecar, IngestParams(session_id="s", messages=[{"id": "q", "role": "user", "content": "read the logs"}]))
    for start in range(0, 60, 10):  # 12 MB: checkpointed along the way
        ingest(sidecar, IngestParams(session_id="s", messages=[pasted_log(n) for n in range(start, start + 10)]))
    ingest(sidecar, IngestParams(session_id="s", messages=[pasted_log(n) for n in range(60, 63)]))
    store = sidecar.store()
    assert store.dirty
    # The failure DuckDB cannot come back from: a checkpoint that runs out of memory.
    store._db.execute("SET memory_limit = '16MB'")
    with pytest.raises(duckdb.Error) as failure:
        store._db.execute("CHECKPOINT")
    store._db.execute(f"SET memory_limit = '{store.memory_limit}'")
    with pytest.raises(duckdb.Error) as refused:
        store._db.execute("SELECT count(*) FROM messages").fetchall()
    assert invalidating(refused.value) and not invalidating(ValueError("other"))

    sidecar.noticed(SidecarError(-32021, "storage error"))  # a failure that says nothing of it changes nothing
    assert not store.invalidated
    sidecar.noticed(failure.value)  # as the server does with every failed request
    assert store.invalidated
    assert sidecar.store() is store and not store.invalidated  # opened again
    # The replayed WAL is not folded in by opening: it waits, as any write does, for the next checkpoint.
    assert store.dirty and os.path.getsize(store.path + ".wal") > 0
    after = {"id": "after", "role": "user", "content": "go on"}
    result = ingest(sidecar, IngestParams(session_id="s", messages=[after]))
    assert result.ids == ["after"] and result.duplicates == 0 and not store.invalidated
    store.checkpoint()
    assert not os.path.exists(store.path + ".wal") or os.path.getsize(store.path + ".wal") == 0
    assert count(store) == 65  # every committed message came back from the WAL
    context = json.loads(assemble_context(sidecar, AssembleParams(session_id="s", budget=10**8)))
    assert [item["id"] for item in context["items"]][-2:] == ["log-62", "after"]
    assert context["messages"][0]["content"] == "read the logs" and len(context["messages"]) == 65
    sidecar.close()
    reopened = Storage.open(str(tmp_path / "db.duckdb"))
    assert count(reopened) == 65
    reopened.close()


def test_an_error_that_only_quotes_the_phrase_leaves_the_database_alone(tmp_path: Path):
    settings, _ = read_settings({})
    sidecar = Sidecar(settings=settings, storage_path=str(tmp_path / "db.duckdb"))
    ingest(sidecar, IngestParams(session_id="s", messages=[{"id": "a", "role": "user", "content": "hello"}]))
    store = sidecar.store()
    with pytest.raises(duckdb.Error) as quoted:  # e.g. memory/grep with this regex
        store._db.execute("SELECT regexp_matches('x', '(has been invalidated')").fetchall()
    assert invalidating(quoted.value)  # the words are there ...
    sidecar.noticed(quoted.value)
    assert not store.invalidated  # ... but the database answers
    assert not invalidating(SidecarError(-32001, "session 'has been invalidated' not found"))
    # A duplicate key quotes the id in DuckDB's constraint error, inside a write's transaction.
    quoting = {"id": "x has been invalidated", "role": "user", "content": "again"}
    ingest(sidecar, IngestParams(session_id="s", messages=[quoting]))
    again = ingest(sidecar, IngestParams(session_id="s", messages=[quoting], session=SessionInfo(title="renamed")))
    assert again.duplicates == 1 and not store.invalidated
    sidecar.close()
