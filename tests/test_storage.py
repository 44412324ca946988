"""Storage on real DuckDB files: persistence across restarts, the lock, migrations, the default path."""

from __future__ import annotations

import asyncio
import os

import duckdb
import pytest
from pygls.exceptions import JsonRpcException

from protocol import errors, methods
from sidecar.cli.synthetic import coding_session
from sidecar.config.paths import default_storage_path, legacy_workspace_path
from sidecar.config.settings import size_in_bytes
from sidecar.engine.messages import message_row
from sidecar.rows import StorageLocked
from sidecar.storage import Storage, database
from sidecar.storage.connection import ROW_GROUP_SIZE, SCAN_MEMORY_LIMIT
from sidecar.storage.migrations import MIGRATIONS
from tests.conftest import call, ingest, running_sidecar, settings_for


async def test_history_survives_a_restart(store_target):
    session = coding_session(80)
    async with running_sidecar(settings=settings_for(store_target)) as client:
        await ingest(client, "s", session, title="persisted", contextWindow=64000)
        before = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "budget": 5000})
    async with running_sidecar(settings=settings_for(store_target)) as client:
        after = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s", "budget": 5000})
        assert after["messages"] == before["messages"]
        assert after["items"] == before["items"]
        listed = (await call(client, methods.MEMORY_SESSIONS, {}))["sessions"]
        assert listed[0]["title"] == "persisted" and listed[0]["contextWindow"] == 64000
        again = await ingest(client, "s", [*session[-5:], {"id": "new", "role": "user", "content": "more"}])
        assert again["duplicates"] == 5
        assert again["usage"]["messages"] == len(session) + 1


async def test_a_second_sidecar_on_the_same_file_gets_32020_with_the_pid(db_path):
    async with running_sidecar(settings=settings_for(db_path)) as first:
        await ingest(first, "s", [{"role": "user", "content": "mine"}])
        holder_pid = first._server.pid
        async with running_sidecar(settings=settings_for(db_path)) as second:
            with pytest.raises(JsonRpcException) as caught:
                await call(second, methods.MEMORY_SESSIONS, {})
            async with asyncio.timeout(30):  # the open after initialize reports the lock with window/showMessage
                while not any("locked" in m.message for m in second.messages):
                    await asyncio.sleep(0.02)
            assert caught.value.code == errors.STORAGE_LOCKED
            assert str(db_path) in caught.value.message
            assert caught.value.data["pid"] == holder_pid
        assert (await call(first, methods.MEMORY_SESSIONS, {}))["sessions"][0]["messages"] == 1


async def test_the_lock_is_retried_once_the_holder_is_gone(db_path):
    async with running_sidecar(settings=settings_for(db_path)) as first:
        await ingest(first, "s", [{"role": "user", "content": "mine"}])
        async with running_sidecar(settings=settings_for(db_path)) as second:
            with pytest.raises(JsonRpcException):
                await call(second, methods.MEMORY_SESSIONS, {})
            await first.shutdown_session()
            await first._server.wait()
            sessions = (await call(second, methods.MEMORY_SESSIONS, {}))["sessions"]
            assert [s["sessionId"] for s in sessions] == ["s"]


def test_migrations_are_recorded_once(tmp_path):
    path = str(tmp_path / "m.duckdb")
    store = Storage.open(path)
    assert store.migrations() == [name for name, _ in MIGRATIONS]
    store.close()
    store = Storage.open(path)
    assert store.migrations() == [name for name, _ in MIGRATIONS]
    store.close()
    db = duckdb.connect(path)
    assert db.execute("SELECT count(*) FROM schema_migrations").fetchall()[0][0] == len(MIGRATIONS)
    tables = {row[0] for row in db.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert {"sessions", "messages", "summaries", "context_items", "summary_sources"} <= tables
    db.close()


def test_a_file_gets_small_row_groups_and_keeps_its_spill_files_beside_it(tmp_path):
    path = str(tmp_path / "rows.duckdb")
    store = Storage.open(path)
    store._db.execute("CREATE TABLE t AS SELECT range AS i FROM range(?)", [3 * ROW_GROUP_SIZE])
    store.dirty = True
    store.checkpoint()
    groups = store._db.execute("SELECT count(DISTINCT row_group_id) FROM pragma_storage_info('t')").fetchall()[0][0]
    assert groups == 3
    assert store._db.execute("SELECT current_setting('temp_directory')").fetchall()[0][0] == path + ".tmp"
    store.close()


def limit_of(store: Storage) -> float:
    return size_in_bytes(store._db.execute("SELECT current_setting('memory_limit')").fetchall()[0][0])


def test_a_large_wal_is_checkpointed_after_the_write_and_the_cache_trimmed(tmp_path, monkeypatch):
    monkeypatch.setattr(database, "CHECKPOINT_WAL_BYTES", 256 << 10)  # the name Storage reads
    path = str(tmp_path / "wal.duckdb")
    store = Storage.open(path, "300MB")
    store.ingest("s", [message_row({"role": "user", "content": "small"}, 50_000, {})], {}, [False], "0:")
    assert os.path.getsize(path + ".wal") > 0  # under the threshold: left for the idle checkpoint
    # Tool outputs of 40 KB, which a 32MB DuckDB limit could not checkpoint (it invalidated the database).
    big = [message_row({"role": "tool", "tool_call_id": f"c{n}", "content": f"{n} " + "x" * 40_000}, 50_000, {})
           for n in range(400)]
    for start in range(0, len(big), 10):
        store.ingest("s", big[start:start + 10], {}, [False] * 10, "0:")
    assert not os.path.exists(path + ".wal") or os.path.getsize(path + ".wal") < 1 << 20  # 16 MB were written
    assert limit_of(store) == pytest.approx(300e6, rel=0.01)  # the trim restored it
    assert store.session("s").message_count == 401
    store.close()
    store = Storage.open(path, "300MB")
    assert store.session("s").message_count == 401
    assert store._db.execute("SELECT count(*) FROM messages").fetchall()[0][0] == 401
    store.close()


def test_sizes_compare_by_bytes():
    assert size_in_bytes("64MB") < size_in_bytes("512 MB") < size_in_bytes("1GiB")
    assert size_in_bytes("8MB") == 8e6 and size_in_bytes("2 GiB") == 2 << 30


def test_storage_locked_names_file_and_pid(tmp_path):
    import subprocess
    import sys

    path = str(tmp_path / "locked.duckdb")
    holder = subprocess.Popen([sys.executable, "-c", f"import duckdb,time; db = duckdb.connect({path!r}); "
                               "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(StorageLocked) as caught:
            Storage.open(path)
        assert caught.value.pid == holder.pid
        assert path in str(caught.value)
    finally:
        holder.kill()
        holder.wait()


def test_default_path_is_per_user_for_every_workspace(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_storage_path(None) == str(tmp_path / "context-sidecar" / "memory.duckdb")
    assert default_storage_path("/srv/me/projects/app") == default_storage_path(None)
    one = legacy_workspace_path("/srv/me/projects/app")
    two = legacy_workspace_path("/srv/me/other/app")
    assert one != two
    assert os.path.dirname(one) == str(tmp_path / "context-sidecar" / "workspaces")
    assert os.path.basename(one).startswith("app-")


async def test_workspace_root_uses_the_per_user_file_and_tags_sessions(tmp_path):
    from lsprotocol import types as lsp

    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")}
    async with running_sidecar(initialize=False, env=env) as client:
        result = await client.initialize_session(lsp.InitializeParams(
            capabilities=lsp.ClientCapabilities(), root_uri=(tmp_path / "proj").as_uri()))
        storage = result.capabilities.experimental["contextSidecar"]["storage"]
        assert storage == str(tmp_path / "data" / "context-sidecar" / "memory.duckdb")
        await ingest(client, "s", [{"role": "user", "content": "hi"}])
        listed = await call(client, methods.MEMORY_SESSIONS, {})
        assert listed["sessions"][0]["workspace"] == os.path.realpath(tmp_path / "proj")
        await client.shutdown_session()
    assert os.path.exists(storage)


def test_a_search_reads_under_the_scan_limit_and_falls_back_to_the_full_one(tmp_path):
    path = str(tmp_path / "scan.duckdb")
    store = Storage.open(path, "300MB")
    # 300 texts of 200 KB: one vector of them is 60 MB, more than the scan limit holds.
    rows = [message_row({"role": "tool", "tool_call_id": f"c{n}", "content": f"{n} needle{n} " + "y" * 200_000},
                        50_000, {}) for n in range(300)]
    for start in range(0, len(rows), 50):
        store.ingest("s", rows[start:start + 50], {}, [False] * 50, "0:")
    with pytest.raises(duckdb.OutOfMemoryException):  # why the fallback exists
        store._db.execute(f"SET memory_limit = '{SCAN_MEMORY_LIMIT}'")
        store._db.execute("SELECT count(*) FROM messages WHERE regexp_matches(text, 'needle299 ', 'i')").fetchall()
    store._db.execute("SET memory_limit = '300MB'")
    store.checkpoint()
    assert not store.dirty
    hits = store.search("s", "messages", "NEEDLE299 ", regex=False, case_sensitive=False, limit=5)
    assert len(hits) == 1 and hits[0].text.startswith("299 needle299 ")
    assert limit_of(store) == pytest.approx(300e6, rel=0.01)
    small = store.search("s", "messages", "needle7 ", regex=False, case_sensitive=True, limit=5)
    assert len(small) == 1 and small[0].text.startswith("7 needle7 ")
    store.close()
