"""The real agents' transcripts, followed by a sidecar asked to watch their workspace (memory/watch).

What Claude Code, Codex and pi write where they keep their sessions is found, imported under the agents'
own session ids and searchable; Claude Code's own /compact is recorded with its session.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from protocol import methods
from sidecar.client import SidecarClient
from sidecar.testing import RecordedRequest, Reply
from tests.agents.runners import Claude, Codex, Pi
from tests.agents.world import AgentWorld

WAIT = 60.0
SUMMARY = "SUMMARY: the user gave the WALRUS code 4471 and asked for tests first."


def answer(request: RecordedRequest) -> Reply:
    """Compaction requests get a summary, everything else a short answer."""
    if "summar" in request.last_user_text.lower() or "TEXT ONLY" in request.last_user_text:
        return Reply(text=SUMMARY)
    return Reply(text="Noted.")


@pytest.fixture
async def sidecar(agent_world: AgentWorld, tmp_path: Path) -> AsyncIterator[SidecarClient]:
    """A sidecar in the agents' world that follows the workspace and watches its agents' transcripts."""
    agent_world.provider.responder = answer
    command = [str(agent_world.sidecar), "--no-share"]
    async with await SidecarClient.spawn(command, db=str(tmp_path / "memory.duckdb"), env=agent_world.env(),
                                         timeout=WAIT) as client:
        await client.follow(workspace=str(agent_world.workspace))
        yield client


async def watch(client: SidecarClient, world: AgentWorld, env: dict[str, Any]) -> None:
    """memory/watch the workspace with the agents' environment."""
    await client.watch(str(world.workspace), env={"HOME": str(world.home), **env})


def stored(client: SidecarClient, predicate: Any) -> asyncio.Future[Any]:
    return client.wait_for_notification(methods.CONTEXT_DID_CHANGE_USAGE, predicate, timeout=WAIT)


async def test_claude_codes_session_is_followed_and_its_own_compaction_recorded(
        sidecar: SidecarClient, claude: Claude, agent_world: AgentWorld) -> None:
    await watch(sidecar, agent_world, {})
    imported = stored(sidecar, lambda usage: usage.messages >= 2)  # the world's only session
    first = (await asyncio.to_thread(claude.run, "Remember the WALRUS code 4471.")).check()
    session = first.output["session_id"]
    assert (await imported).session_id == session
    hits = (await sidecar.grep(session, "WALRUS code 4471")).matches
    assert [hit.snippet for hit in hits] == ["Remember the WALRUS code 4471."]
    for turn in range(3):
        (await asyncio.to_thread(claude.run, f"Question {turn} about the parser.", resume=session)).check()
    compacted = sidecar.wait_for_notification(methods.CONTEXT_DID_COMPACT, timeout=WAIT)
    (await asyncio.to_thread(claude.run, "/compact", resume=session)).check()
    event = await compacted
    assert (event.session_id, event.source, event.mode) == (session, "claude-code", "handoff")
    described = await sidecar.describe(session, event.summary_ids[0])
    assert described.content.startswith(SUMMARY)
    assert (await sidecar.grep(session, "WALRUS code 4471")).matches  # the original is still there too
    again = await sidecar.record_compaction(session, SUMMARY, "claude-code", trigger="manual")
    assert (again.recorded, again.summary_id) == (False, event.summary_ids[0])  # the PostCompact hook's copy


async def test_a_codex_rollout_is_found_by_its_session_meta(sidecar: SidecarClient, codex: Codex,
                                                            agent_world: AgentWorld) -> None:
    await watch(sidecar, agent_world, {"CODEX_HOME": str(codex.home)})
    imported = stored(sidecar, lambda usage: usage.messages >= 2)
    (await asyncio.to_thread(codex.run, "Remember the HERON code 5512.")).check()
    session = (await imported).session_id
    assert [s.session_id for s in (await sidecar.sessions()).sessions] == [session]
    assert (await sidecar.grep(session, "HERON code 5512")).matches


async def test_codexs_own_automatic_compaction_is_recorded(sidecar: SidecarClient, codex: Codex,
                                                           agent_world: AgentWorld) -> None:
    codex.config = {"model_auto_compact_token_limit": 50}  # Codex compacts before its next turn
    await watch(sidecar, agent_world, {"CODEX_HOME": str(codex.home)})
    (await asyncio.to_thread(codex.run, "Remember the WALRUS code 4471.")).check()
    compacted = sidecar.wait_for_notification(methods.CONTEXT_DID_COMPACT, timeout=WAIT)
    (await asyncio.to_thread(codex.run, "And what next?", "resume", "--last")).check()
    event = await compacted
    assert event.source == "codex"
    described = await sidecar.describe(event.session_id, event.summary_ids[0])
    assert described.content.startswith(SUMMARY)  # Codex's own preface to the summary is taken off
    assert (await sidecar.grep(event.session_id, "WALRUS code 4471", scope="messages")).matches


async def test_a_pi_session_is_found_in_its_session_directory(sidecar: SidecarClient, pi: Pi,
                                                              agent_world: AgentWorld) -> None:
    await watch(sidecar, agent_world, {"PI_CODING_AGENT_DIR": str(pi.dir)})
    imported = stored(sidecar, lambda usage: usage.messages >= 2)
    (await asyncio.to_thread(pi.run, "Remember the PELICAN code 6623.")).check()
    session = (await imported).session_id
    assert (await sidecar.grep(session, "PELICAN code 6623")).matches
    assert [path.parent.name for path in pi.sessions()] == ["--" + str(agent_world.workspace).strip("/")
                                                            .replace("/", "-") + "--"]


async def test_pis_own_compact_is_recorded_keeping_what_pi_kept(sidecar: SidecarClient, pi: Pi,
                                                                agent_world: AgentWorld) -> None:
    pi.dir.mkdir(parents=True, exist_ok=True)  # pi keeps only the last turn verbatim when it compacts
    (pi.dir / "settings.json").write_text(json.dumps({"compaction": {"keepRecentTokens": 10}}), encoding="utf-8")
    await watch(sidecar, agent_world, {"PI_CODING_AGENT_DIR": str(pi.dir)})
    compacted = sidecar.wait_for_notification(methods.CONTEXT_DID_COMPACT, timeout=WAIT)
    with pi.rpc() as rpc:
        for turn in range(3):
            await asyncio.to_thread(rpc.prompt, f"Turn {turn}: remember the PELICAN code 66{turn}.")
        await asyncio.to_thread(rpc.request, {"type": "compact"})
    event = await compacted
    assert event.source == "pi"
    described = await sidecar.describe(event.session_id, event.summary_ids[0])
    assert described.content.startswith(SUMMARY)
    entry = next(json.loads(line) for path in pi.sessions() for line in path.read_text().splitlines()
                 if json.loads(line).get("type") == "compaction")
    kept = [item.id for item in (await sidecar.assemble(event.session_id)).items][1:]
    assert kept[0] == entry["firstKeptEntryId"]  # what pi kept verbatim after its summary stays a message
