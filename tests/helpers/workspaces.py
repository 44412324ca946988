"""A database with the sessions of two workspaces, as agents leave them, for the workspace-scoped memory tools."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lsprotocol import types as lsp

from protocol import methods
from sidecar.cli.synthetic import coding_session
from tests.conftest import call, ingest, running_sidecar, settings_for

OLD_FACT = "The staging password hint is PLATYPUS-7, rotated on Tuesdays."
NEW_FACT = "The parser fix touched PLATYPUS-8 handling in src/parse.py."
OTHER_FACT = "Workspace B keeps its own PLATYPUS-9 and the WOMBAT-3 key."
SHARED_ID = "msg-shared"
"""A message id that both sessions of workspace A use (Codex-style ids repeat across sessions)."""


def dated(messages: list[dict[str, Any]], day: str) -> list[dict[str, Any]]:
    """The messages with transcript timestamps on ``day``, a minute apart."""
    for index, message in enumerate(messages):
        metadata = message.setdefault("metadata", {})
        metadata["timestamp"] = f"{day}T{10 + index // 60:02d}:{index % 60:02d}:00.000Z"
    return messages


async def store_workspace(db: Path | str, workspace: Path,
                          sessions: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]],
                          compact: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Ingest sessions as a client rooted at ``workspace`` does; compact some in full; their summary ids."""
    workspace.mkdir(parents=True, exist_ok=True)
    summaries: dict[str, list[str]] = {}
    async with running_sidecar(initialize=False) as client:
        await client.initialize_session(lsp.InitializeParams(
            capabilities=lsp.ClientCapabilities(), root_uri=workspace.as_uri(),
            initialization_options=settings_for(db, compaction={"auto": False, "freshTail": 4})))
        for session_id, (messages, info) in sessions.items():
            await ingest(client, session_id, messages, **info)
        for session_id in compact:
            result = await call(client, methods.CONTEXT_COMPACT, {"sessionId": session_id, "mode": "full"})
            assert result["compacted"], result
            summaries[session_id] = result["summaryIds"]
        await client.shutdown_session()
    return summaries


async def two_workspaces(db: Path | str, root: Path) -> dict[str, list[str]]:
    """Workspace ``root/ws-a``: an older Claude Code session (compacted) and a newer Codex one; ``root/ws-b``: one.

    Returns the summary ids of the compacted session, ``a-old``.
    """
    old = coding_session(60)
    old[5] = {"id": "fact-old", "role": "user", "content": f"Note for later: {OLD_FACT}"}
    old[6] = {"id": SHARED_ID, "role": "user", "content": "collide: the OLD session's message"}
    new = [{"id": "n1", "role": "user", "content": "Fix the parser"},
           {"id": SHARED_ID, "role": "user", "content": "collide: the NEW session's message"},
           {"id": "n3", "role": "assistant", "content": NEW_FACT}]
    summaries = await store_workspace(db, root / "ws-a", {
        "a-old": (dated(old, "2026-01-05"), {"title": "Set up the staging database",
                                             "metadata": {"claudeCodeVersion": "2.1.197"}}),
        "a-new": (dated(new, "2026-03-02"), {"title": "Fix the parser", "metadata": {"cliVersion": "0.169.0"}}),
    }, compact=("a-old",))
    await store_workspace(db, root / "ws-b", {
        "b-only": (dated([{"id": "b1", "role": "user", "content": OTHER_FACT}], "2026-04-01"), {}),
    })
    return summaries
