"""Per-workspace files of earlier versions are merged into the per-user database, losing no message."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from unittest.mock import patch

from lsprotocol import types as lsp

from protocol import methods
from sidecar.config.paths import legacy_workspace_path
from tests.conftest import call, ingest, running_sidecar, settings_for


def chat(prefix: str, count: int) -> list[dict[str, Any]]:
    return [{"id": f"{prefix}{n}", "role": "user" if n % 2 == 0 else "assistant",
             "content": f"{prefix} message {n} " + "word " * 60} for n in range(count)]


async def fill(db: Path, sessions: dict[str, int], compact: str | None = None) -> dict[str, Any]:
    """Store the sessions in ``db`` (one process of its own); returns each one's assembled context."""
    async with running_sidecar(settings=settings_for(db, compaction={"auto": False})) as client:
        for session_id, count in sessions.items():
            await ingest(client, session_id, chat(session_id, count))
        if compact:
            done = await call(client, methods.CONTEXT_COMPACT, {"sessionId": compact, "mode": "full"})
            assert done["compacted"]
        await ingest(client, compact or next(iter(sessions)), chat("late", 3))  # live messages after it
        return {s: await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": s}) for s in sessions}


async def open_workspace(data: Path, root: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Initialize with ``root`` and the default database; (memory/sessions, assembled contexts)."""
    env = {**os.environ, "XDG_DATA_HOME": str(data)}
    async with running_sidecar(initialize=False, env=env) as client:
        await client.initialize_session(lsp.InitializeParams(
            capabilities=lsp.ClientCapabilities(), root_uri=root.as_uri(),
            initialization_options={"compaction": {"auto": False}}))
        listed = await call(client, methods.MEMORY_SESSIONS, {})
        contexts = {s["sessionId"]: await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": s["sessionId"]})
                    for s in listed["sessions"]}
        await client.shutdown_session()
    return listed, contexts


def strip(assembled: dict[str, Any]) -> Any:
    return [(item["id"], item["kind"]) for item in assembled["items"]], assembled["messages"]


def layout(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """The data directory, a workspace root, the root's per-workspace file of before (its directory made) and the
    per-user database."""
    data = tmp_path / "data"
    root = tmp_path / "proj"
    root.mkdir()
    legacy = Path(legacy_workspace_path_for(data, root))
    legacy.parent.mkdir(parents=True)
    return data, root, legacy, data / "context-sidecar" / "memory.duckdb"


async def test_a_workspace_file_is_merged_whole_and_then_set_aside(tmp_path: Path) -> None:
    data, root, legacy, user_db = layout(tmp_path)
    before_user = await fill(user_db, {"agent": 12})
    before_legacy = await fill(legacy, {"edit": 40, "other": 5}, compact="edit")
    listed, after = await open_workspace(data, root)
    by_id = {s["sessionId"]: s for s in listed["sessions"]}
    assert set(by_id) == {"agent", "edit", "other"}
    assert by_id["edit"]["workspace"] == by_id["other"]["workspace"] == os.path.realpath(root)
    assert by_id["agent"]["workspace"] == os.path.realpath(os.getcwd())  # a client naming no root: its directory
    for session_id, assembled in {**before_user, **before_legacy}.items():
        assert strip(after[session_id]) == strip(assembled), session_id
    assert not legacy.exists() and Path(f"{legacy}.merged").exists()
    # Ingest goes on after the merge, at positions past every merged one.
    async with running_sidecar(settings=settings_for(user_db)) as client:
        await ingest(client, "edit", chat("new", 2))
        assembled = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "edit"})
        assert [item["id"] for item in assembled["items"]][-2:] == ["new0", "new1"]
        assert strip(assembled)[0][:-2] == strip(before_legacy["edit"])[0]


async def test_a_session_in_both_files_keeps_the_workspace_file(tmp_path: Path) -> None:
    data, root, legacy, user_db = layout(tmp_path)
    await fill(user_db, {"same": 4})
    await fill(legacy, {"same": 6, "fresh": 3})
    listed, _ = await open_workspace(data, root)
    by_id = {s["sessionId"]: s["messages"] for s in listed["sessions"]}
    assert by_id == {"same": 4 + 3, "fresh": 3}  # the per-user one's own "same" (with its 3 late messages)
    assert legacy.exists()  # what could not be merged stays where it was


def legacy_workspace_path_for(data: Path, root: Path) -> str:
    with patch.dict(os.environ, {"XDG_DATA_HOME": str(data)}):
        return legacy_workspace_path(str(root))
