"""Two Claude Code sessions at once in one workspace, after ``setup``, while an editor follows the workspace.

Each Claude Code run starts ``context-sidecar mcp``, which asks the shared host to watch the workspace while the
run lasts; the editor (a client of the same host) follows the workspace, and watches it too or not. Every
session's transcript must end up in its own session, whole, in order, once, and in no other.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from protocol import methods
from sidecar.client import SidecarClient
from sidecar.importers import parse_transcript
from sidecar.testing import Reply
from tests.agents.runners import Claude
from tests.agents.world import AgentWorld

WAIT = 60.0


async def stored_ids(client: SidecarClient, session_id: str) -> list[str]:
    """The session's stored messages, in context order."""
    return [item.id for item in (await client.assemble(session_id, budget=10_000_000, prune=False)).items]


async def imported(client: SidecarClient, session_id: str, count: int) -> None:
    """Return once the session holds ``count`` messages (the waiter is set before the first look)."""
    heard = client.wait_for_notification(
        methods.CONTEXT_DID_CHANGE_USAGE, lambda usage: usage.session_id == session_id and usage.messages == count,
        timeout=WAIT)
    known = {s.session_id for s in (await client.sessions()).sessions}
    if session_id in known and (await client.usage(session_id)).messages == count:
        heard.cancel()
        return
    await heard


@pytest.mark.parametrize("editor_watches", [True, False], ids=["editor-watches", "only-the-agents-watch"])
async def test_two_claude_sessions_at_once_are_stored_apart_whole_and_once(
        claude: Claude, agent_world: AgentWorld, editor_watches: bool) -> None:
    """Without the editor's watch, each run's MCP server watches only while its run lasts: what the run wrote
    last, just before Claude Code stops the server, must be stored all the same."""
    agent_world.run([agent_world.sidecar, "setup", "claude-code"]).check()
    agent_world.provider.responder = lambda request: Reply(text="Noted.", delay=1.0)  # a model takes a while
    workspace = str(agent_world.workspace)

    def session(word: str) -> str:
        first = claude.run(f"Remember the {word} code.").check()
        session_id: str = first.output["session_id"]
        for turn in range(1):
            claude.run(f"{word}, turn {turn}.", resume=session_id).check()
        return session_id

    async with await SidecarClient.spawn([str(agent_world.sidecar)], env=agent_world.env(), timeout=WAIT) as editor:
        await editor.follow(workspace=workspace)
        if editor_watches:
            await editor.watch(workspace, env={"HOME": str(agent_world.home)})
        sessions = await asyncio.gather(asyncio.to_thread(session, "ALPACA"), asyncio.to_thread(session, "BADGER"))
        files = {path.stem: path for path in claude.transcripts().glob("*.jsonl")}
        assert sorted(files) == sorted(sessions)
        written = {sid: [m["id"] for m in parse_transcript(files[sid]).messages] for sid in sessions}
        for sid in sessions:
            await asyncio.wait_for(imported(editor, sid, len(written[sid])), WAIT)
        stored = {sid: await stored_ids(editor, sid) for sid in sessions}
        listed = (await editor.sessions()).sessions
        found = {(sid, word): bool((await editor.grep(sid, word)).matches)
                 for sid in sessions for word in ("ALPACA", "BADGER")}

    assert stored == written, "each session holds its own transcript, in order, each message once"
    assert sorted(s.session_id for s in listed) == sorted(sessions)
    assert {s.workspace for s in listed} == {str(Path(workspace).resolve())}
    assert found == {(sessions[0], "ALPACA"): True, (sessions[0], "BADGER"): False,
                     (sessions[1], "ALPACA"): False, (sessions[1], "BADGER"): True}
