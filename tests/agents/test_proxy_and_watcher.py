"""The proxy and a watcher of the agent's transcripts (memory/watch) on one real Claude Code session, in both orders.

The conversation is stored once by whoever came first: a session the proxy writes is not imported from the
transcript; a session imported first is never written into by the proxy, which stores the conversation as a branch
of it, and the watcher then stops following the transcript.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from protocol import methods
from sidecar.client import SidecarClient
from sidecar.testing import RecordedRequest, Reply
from tests.agents.runners import Claude
from tests.agents.world import AgentWorld

WAIT = 60.0


def answer(request: RecordedRequest) -> Reply:
    return Reply(text="BADGER noted." if "BADGER" in request.last_user_text else "OTTER noted.")


def wrap(claude: Claude, world: AgentWorld, db: Path, prompt: str, resume: str | None = None) -> Any:
    """``context-sidecar wrap claude -- -p PROMPT``: Claude Code through a proxy of its own on ``db``."""
    env = {**claude.env(), "ANTHROPIC_BASE_URL": None,
           "PATH": os.pathsep.join([str(claude.binary.parent), world.env()["PATH"]])}
    argv: list[Any] = [world.sidecar, "wrap", "--port", "0", "--db", db, "--log-file", db.with_suffix(".log"),
                       "--anthropic-upstream", world.provider.url, "claude", "--", "-p", prompt, "--output-format",
                       "json", *(["--resume", resume] if resume else [])]
    return world.run(argv, env=env, parse=Claude._parse).check()


@contextlib.asynccontextmanager
async def watching(world: AgentWorld, db: Path) -> AsyncIterator[SidecarClient]:
    """A client of the database's shared host that follows the workspace and watches its agents' transcripts."""
    async with await SidecarClient.spawn(db=str(db), env=world.env(), timeout=WAIT) as client:
        await client.follow(workspace=str(world.workspace))
        await client.watch(str(world.workspace), env={"HOME": str(world.home)})
        yield client


async def transcript_state(client: SidecarClient, world: AgentWorld, session: str, state: str) -> str | None:
    """The problem the watcher gives for the session's transcript, once it is in ``state``."""
    deadline = time.monotonic() + WAIT
    while True:
        watched = await client.watch(str(world.workspace), env={"HOME": str(world.home)})
        found = next((t for t in watched.transcripts if Path(t.path).stem == session), None)
        if found is not None and found.state == state:
            return found.problem
        assert time.monotonic() < deadline, f"the transcript of {session} never got to {state}: {watched}"
        await asyncio.sleep(0.1)


async def ids_with(client: SidecarClient, session: str, text: str) -> list[str]:
    return [match.id for match in (await client.grep(session, text, scope="messages")).matches]


async def test_watcher_first_the_proxy_stores_the_conversation_as_a_branch(
        claude: Claude, agent_world: AgentWorld, tmp_path: Path) -> None:
    agent_world.provider.responder = answer
    db = tmp_path / "shared.duckdb"
    async with watching(agent_world, db) as watcher:
        imported = watcher.wait_for_notification(methods.CONTEXT_DID_CHANGE_USAGE,
                                                 lambda usage: usage.messages >= 2, timeout=WAIT)
        first = (await asyncio.to_thread(claude.run, "Remember the OTTER code 3141.")).check()
        session = first.output["session_id"]
        assert (await imported).session_id == session
        await asyncio.to_thread(wrap, claude, agent_world, db, "Now the BADGER code 2718.", session)
        problem = await transcript_state(watcher, agent_world, session, "skipped")
        sessions = {s.session_id for s in (await watcher.sessions()).sessions}
        branches = sorted(name for name in sessions if name.startswith(session + "~"))
        assert len(branches) == 1 and problem and branches[0] in problem
        assert await ids_with(watcher, session, "OTTER noted")  # what the watcher imported stays
        assert await ids_with(watcher, session, "BADGER noted") == []  # the proxy never wrote into it
        whole = [*await ids_with(watcher, branches[0], "OTTER code"), *await ids_with(watcher, branches[0],
                                                                                       "BADGER noted")]
        assert len(whole) == 2 and all(found.startswith("px-") for found in whole)


async def test_proxy_first_the_watcher_leaves_the_session_to_it(
        claude: Claude, agent_world: AgentWorld, tmp_path: Path) -> None:
    agent_world.provider.responder = answer
    db = tmp_path / "shared.duckdb"
    first = await asyncio.to_thread(wrap, claude, agent_world, db, "Remember the OTTER code 3141.")
    session = first.output["session_id"]
    async with watching(agent_world, db) as watcher:
        problem = await transcript_state(watcher, agent_world, session, "skipped")
        assert problem and "proxy" in problem
        await asyncio.to_thread(wrap, claude, agent_world, db, "Now the BADGER code 2718.", session)
        sessions = [s.session_id for s in (await watcher.sessions()).sessions]
        found = [*await ids_with(watcher, session, "OTTER code"), *await ids_with(watcher, session, "BADGER noted")]
    assert sessions == [session]  # one session, no branch: the second proxy found the first one's path
    assert len(found) == 2 and all(message.startswith("px-") for message in found)
