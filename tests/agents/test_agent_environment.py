"""The agents start ``context-sidecar mcp`` with their own idea of the environment: Codex 0.169 passes an MCP server
HOME, PATH, LANG, SHELL and TERM only, so ``setup codex`` has it pass on, by name, the variables that say where the
database, its host's socket and the agents' transcripts are; Claude Code 2.1.197 passes its whole environment to MCP
servers and hooks. A user who moved those directories still gets one memory, the one their editor uses."""

from __future__ import annotations

import tomllib

from sidecar.client import SidecarClient
from sidecar.testing import reference_policy
from tests.agents.runners import Claude, Codex
from tests.agents.world import AgentWorld

FACT = "the staging database lives on port 6543"


async def editor_sessions(world: AgentWorld, env: dict[str, str]) -> list[str]:
    """The ids of the workspace's sessions an editor in this environment sees, on the default database."""
    editor = await SidecarClient.spawn(command=[str(world.sidecar)], env=world.env(env))
    async with editor:
        sessions = (await editor.sessions()).sessions
    return [s.session_id for s in sessions if s.workspace == str(world.workspace.resolve())]


async def test_codex_with_moved_data_and_codex_homes_uses_the_database_the_editor_uses(
        codex: Codex, agent_world: AgentWorld) -> None:
    data = agent_world.root / "elsewhere" / "data"
    codex.home = agent_world.root / "elsewhere" / "codex"
    moved = {"XDG_DATA_HOME": str(data), **codex.env()}  # CODEX_HOME included
    agent_world.run([agent_world.sidecar, "setup", "codex"], env=moved).check()
    codex.config = tomllib.loads((codex.home / "config.toml").read_text())  # each run writes base + this
    agent_world.provider.responder = reference_policy()
    codex.run(f"Remember this for later: {FACT}.", env=moved).check()
    [earlier] = codex.sessions()
    agent_world.provider.responder = reference_policy(tool="memory_grep", arguments={"pattern": "6543"})
    second = codex.run("USE_TOOL: which port does the staging database use?", env=moved).check()

    result = second.requests[-1].tool_result or ""
    assert FACT in result and "(earlier;" in result, result  # the earlier rollout, found under the moved CODEX_HOME
    assert earlier.stem.split("-", 6)[-1] in result
    assert (data / "context-sidecar" / "memory.duckdb").is_file()
    assert not (agent_world.home / ".local" / "share" / "context-sidecar").exists(), "no second database"
    # The session the server found the fact in is in the database an editor of the user's opens by default.
    assert earlier.stem.split("-", 6)[-1] in await editor_sessions(agent_world, moved)


async def test_claude_code_with_moved_data_and_config_dirs_uses_the_database_the_editor_uses(
        claude: Claude, agent_world: AgentWorld) -> None:
    data = agent_world.root / "elsewhere" / "data"
    moved = {"XDG_DATA_HOME": str(data), "CLAUDE_CONFIG_DIR": str(agent_world.root / "elsewhere" / "claude")}
    agent_world.run([agent_world.sidecar, "setup", "claude-code"], env=moved).check()
    agent_world.provider.responder = reference_policy()
    first = claude.run(f"Remember this for later: {FACT}.", env=moved).check()
    agent_world.provider.responder = reference_policy(tool="mcp__context-sidecar__memory_grep",
                                                      arguments={"pattern": "6543"})
    second = claude.run("USE_TOOL: which port does the staging database use?", env=moved).check()

    result = second.requests[-1].tool_result or ""
    assert FACT in result and f"In session {first.output['session_id']} (earlier;" in result, result
    assert (data / "context-sidecar" / "memory.duckdb").is_file()
    assert not (agent_world.home / ".local" / "share" / "context-sidecar").exists(), "no second database"
    assert first.output["session_id"] in await editor_sessions(agent_world, moved)
