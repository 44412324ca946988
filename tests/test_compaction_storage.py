"""Compaction against the storage layer in-process: what it reads, and what its one transaction writes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from protocol.types import IngestParams
from sidecar.cli.synthetic import coding_session
from sidecar.config.settings import read_settings
from sidecar.engine.messages import message_text
from sidecar.rows import StorageFailure
from sidecar.services.compaction.engine import Compaction
from sidecar.services.memory import ingest
from sidecar.services.state import Sidecar
from sidecar.summarizers.base import SummaryRequest
from sidecar.summarizers.deterministic import DeterministicSummarizer
from tests.conftest import PI_SESSION


def make_sidecar(target: Path | str, **compaction: object) -> Sidecar:
    """A sidecar in this process on ``target``: a directory (a DuckDB file in it) or a team database's URL."""
    settings, problems = read_settings({"compaction": {"auto": False, **compaction}})
    assert not problems
    path = str(target / "db.duckdb") if isinstance(target, Path) else target
    return Sidecar(settings=settings, storage_path=path)


def add(sidecar: Sidecar, messages: list[dict]) -> None:
    ingest(sidecar, IngestParams(session_id="s", messages=messages))


def snapshot(sidecar: Sidecar) -> tuple[list, list, list, list]:
    """Every row of the session, straight from the database."""
    db = sidecar.store()._db
    tables = ("sessions", "context_items", "summaries", "summary_sources")
    return tuple(db.execute(f"SELECT * FROM {table} WHERE session_id = 's' ORDER BY ALL").fetchall()  # type: ignore
                 for table in tables)


def fresh_session(sidecar: Sidecar):
    """The session row as stored, not as cached (a team database caches none)."""
    getattr(sidecar.store(), "_sessions", {}).clear()
    return sidecar.session("s")


@pytest.mark.parametrize("mode", ["incremental", "full", "handoff"])
def test_the_cached_session_and_tokens_after_match_the_database(store_target, mode):
    sidecar = make_sidecar(store_target, maxTokens=3000, freshTail=6)
    add(sidecar, coding_session(300))
    outcome = asyncio.run(Compaction(sidecar, "s", mode, None, DeterministicSummarizer()).run())
    assert outcome.compacted
    cached = sidecar.session("s")
    stored = fresh_session(sidecar)
    assert cached == stored
    assert outcome.tokens_after == sidecar.estimated_tokens(stored)


def test_messages_ingested_during_a_compaction_are_counted_after_it(store_target):
    sidecar = make_sidecar(store_target, freshTail=6)
    session = coding_session(200)
    add(sidecar, session[:150])

    class Ingesting(DeterministicSummarizer):
        async def summarize(self, request: SummaryRequest) -> str:
            if session[150:]:
                late, session[150:] = session[150:], []
                add(sidecar, late)
            return await super().summarize(request)

    outcome = asyncio.run(Compaction(sidecar, "s", "incremental", None, Ingesting()).run())
    assert outcome.compacted
    stored = fresh_session(sidecar)
    assert outcome.tokens_after == sidecar.estimated_tokens(stored)
    assert sidecar.session("s").context_count == stored.context_count
    items = sidecar.store().items(sidecar.session("s"))
    assert [i.ref_id for i in items[-50:]] == [m["id"] for m in coding_session(200)[150:]]


def test_a_context_changed_under_a_compaction_fails_and_changes_nothing(tmp_path):
    sidecar = make_sidecar(tmp_path, freshTail=6)
    add(sidecar, coding_session(200))
    stale = Compaction(sidecar, "s", "incremental", None, DeterministicSummarizer())
    stale.load()
    assert asyncio.run(Compaction(sidecar, "s", "incremental", None, DeterministicSummarizer()).run()).compacted
    before = snapshot(sidecar)
    with pytest.raises(StorageFailure, match="changed during compaction"):
        asyncio.run(stale.run())
    assert snapshot(sidecar) == before
    assert sidecar.session("s") == fresh_session(sidecar)


@pytest.mark.skipif(not PI_SESSION.exists(), reason="shared/data is not beside the project")
def test_summarizers_read_the_stored_text_column_which_is_the_text_of_the_verbatim_message(tmp_path):
    from sidecar.importers import parse_transcript

    sidecar = make_sidecar(tmp_path)
    messages = parse_transcript(PI_SESSION, "pi").messages
    add(sidecar, messages)
    store = sidecar.store()
    items = store.items(sidecar.session("s"))
    seqs = [i.position for i in items]
    texts = {m.seq: m.text for m in store.source_messages("s", [(seqs[0], seqs[-1])])}
    raws = store.message_raws("s", seqs)
    assert len(texts) == len(messages)
    assert all(texts[seq] == message_text(json.loads(raws[seq])) for seq in seqs)


def test_the_context_from_the_tail_cache_is_the_context_in_the_database(tmp_path):
    sidecar = make_sidecar(tmp_path, freshTail=6)
    session = coding_session(300)
    add(sidecar, session[:200])
    assert asyncio.run(Compaction(sidecar, "s", "incremental", None, DeterministicSummarizer()).run()).compacted
    sidecar.store().tail(sidecar.session("s"), 10**9, 1)  # as assemble reads it: all of it, then cached
    add(sidecar, session[200:])
    store = sidecar.store()
    assert store._tails._entries["s"].complete  # so the first read below comes from memory
    cached = store.context(sidecar.session("s"))
    store._tails.drop()
    assert cached == store.context(sidecar.session("s"))
    assert [i.position for i in cached] == sorted(i.position for i in cached)
    assert len(cached) == sidecar.session("s").context_count


def test_a_compacted_context_is_read_whole_after_more_messages_arrive(store_target):
    # A team database once stored no first position for a context that was all live messages when compacted: once
    # the next message arrived, reads began at it, and the summary and the kept tail dropped out of every later
    # compaction and prompt.
    sidecar = make_sidecar(store_target, freshTail=6)
    session = coding_session(300)
    add(sidecar, session[:200])
    assert asyncio.run(Compaction(sidecar, "s", "incremental", None, DeterministicSummarizer()).run()).compacted
    compacted = [(i.kind, i.ref_id) for i in sidecar.store().context(fresh_session(sidecar))]
    assert ("summary" in {kind for kind, _ in compacted}) and len(compacted) < 200
    add(sidecar, session[200:])
    stored = fresh_session(sidecar)
    context = sidecar.store().context(stored)
    assert [(i.kind, i.ref_id) for i in context] == compacted + [("message", m["id"]) for m in session[200:]]
    assert len(context) == stored.context_count
    again = asyncio.run(Compaction(sidecar, "s", "full", None, DeterministicSummarizer()).run())
    assert again.compacted
    kept = {i.ref_id for i in sidecar.store().context(fresh_session(sidecar)) if i.kind == "message"}
    older = {i.ref_id for i in context[:len(compacted)] if i.kind == "message" and i.role != "system"}
    assert older and not kept & older, "the tail the first compaction kept is compacted by the full one"
