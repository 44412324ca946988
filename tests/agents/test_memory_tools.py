"""The memory tools inside the real agents: after ``setup``, the model searches an earlier session of the workspace.

A first run of the agent tells it a fact; a second run, a new session in the same workspace, has the fake model
call ``memory_grep`` for it through ``context-sidecar mcp``. Only the earlier session holds the fact, so only a
server that imported the workspace's earlier transcripts can put it in the tool result the agent sends back.
"""

from __future__ import annotations

import asyncio
import tomllib

from sidecar.client import SidecarClient
from sidecar.testing import reference_policy
from tests.agents.runners import Claude, Codex
from tests.agents.world import AgentWorld

FACT = "the deploy password hint is QUOKKA-314"


def test_claude_code_finds_what_an_earlier_session_of_the_workspace_was_told(
        claude: Claude, agent_world: AgentWorld) -> None:
    claude_code_finds_the_fact(claude, agent_world, [])


def test_claude_code_finds_it_in_a_team_database(claude: Claude, agent_world: AgentWorld, pg_url: str) -> None:
    """The same through a team's PostgreSQL database: setup --db URL, the transcripts imported into it."""
    claude_code_finds_the_fact(claude, agent_world, ["--db", pg_url])


def claude_code_finds_the_fact(claude: Claude, agent_world: AgentWorld, db: list[str]) -> None:
    agent_world.run([agent_world.sidecar, "setup", "claude-code", *db]).check()
    agent_world.provider.responder = reference_policy()
    first = claude.run(f"Remember this for later: {FACT}.").check()
    agent_world.provider.responder = reference_policy(tool="mcp__context-sidecar__memory_grep",
                                                      arguments={"pattern": "QUOKKA"})
    second = claude.run("USE_TOOL: what was the deploy password hint?").check()

    earlier, current = first.output["session_id"], second.output["session_id"]
    assert earlier != current
    offered = [tool.name for tool in second.requests[0].tools]
    assert {"mcp__context-sidecar__memory_grep", "mcp__context-sidecar__memory_query"} <= set(offered)
    result = second.requests[-1].tool_result or ""
    assert FACT in result, result
    assert f"In session {earlier} (earlier;" in result and "Claude Code 2.1.197" in result
    assert f"In session {current}" not in result, "the model's own call is not history"
    assert second.text == "FINAL: tool said: " + result[:300], "the model's answer, made of the tool's result"


async def test_codex_finds_what_an_earlier_session_of_the_workspace_was_told_while_an_editor_shares_the_memory(
        codex: Codex, agent_world: AgentWorld) -> None:
    agent_world.run([agent_world.sidecar, "setup", "codex"], env=codex.env(), stdin="").check()
    codex.config = tomllib.loads((codex.home / "config.toml").read_text())  # each run writes base + this
    assert codex.config["mcp_servers"]["context-sidecar"]["required"] is True
    agent_world.provider.responder = reference_policy()
    (await asyncio.to_thread(codex.run, f"Remember this for later: {FACT}.")).check()
    earlier = codex.sessions()
    agent_world.provider.responder = reference_policy(tool="memory_grep", arguments={"pattern": "QUOKKA"})
    # An editor holds the database's host meanwhile: Codex starts its MCP server with a few variables only, and
    # the server must still find that host (its socket is under the user's XDG_RUNTIME_DIR), not open the
    # database itself.
    async with await SidecarClient.spawn([str(agent_world.sidecar)], env=agent_world.env(codex.env()),
                                         timeout=60) as editor:
        await editor.sessions()
        second = (await asyncio.to_thread(codex.run, "USE_TOOL: what was the deploy password hint?")).check()

    offered = [(tool.namespace, tool.name) for tool in second.requests[0].tools]
    assert ("mcp__context_sidecar", "memory_grep") in offered
    result = second.requests[-1].tool_result or ""
    assert FACT in result, result
    assert len(earlier) == 1 and "(earlier;" in result and "Codex 0.169.0" in result
    assert earlier[0].stem.split("-", 6)[-1] in result, "the earlier session is named by its id"
