"""What ``context-sidecar setup`` writes, read back by the real agents: their own config commands list the server."""

from __future__ import annotations

import json

from tests.agents.runners import Claude, Codex
from tests.agents.world import AgentWorld


def test_codex_loads_the_server_setup_wrote_and_none_after_remove(codex: Codex, agent_world: AgentWorld):
    config = codex.write_config()
    before = config.read_bytes()
    setup = agent_world.run([agent_world.sidecar, "setup", "codex"], env=codex.env()).check()
    assert str(config) in setup.stdout
    listed = agent_world.run([codex.binary, "mcp", "list", "--json"], env=codex.env()).check()
    [server] = [entry for entry in json.loads(listed.stdout) if entry["name"] == "context-sidecar"]
    assert server["enabled"] is True
    assert server["transport"]["command"] == str(agent_world.sidecar) and server["transport"]["args"] == ["mcp"]
    assert config.read_bytes().startswith(before), "the config Codex had is kept, byte for byte"

    agent_world.run([agent_world.sidecar, "setup", "codex", "--remove"], env=codex.env()).check()
    assert config.read_bytes() == before
    listed = agent_world.run([codex.binary, "mcp", "list", "--json"], env=codex.env()).check()
    assert "context-sidecar" not in [entry["name"] for entry in json.loads(listed.stdout)]


def test_claude_code_lists_the_server_setup_wrote(claude: Claude, agent_world: AgentWorld):
    agent_world.run([agent_world.sidecar, "setup", "claude-code"]).check()
    listed = agent_world.run([claude.binary, "mcp", "list"], env=claude.env()).check()
    assert f"context-sidecar: {agent_world.sidecar} mcp" in listed.stdout
    agent_world.run([agent_world.sidecar, "setup", "claude-code", "--remove"]).check()
    listed = agent_world.run([claude.binary, "mcp", "list"], env=claude.env()).check()
    assert "context-sidecar" not in listed.stdout
