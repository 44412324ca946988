"""What ``context-sidecar setup`` writes, read back by the real agents: their own config commands list the server."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

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
    command, args = server["transport"]["command"], server["transport"]["args"]
    assert command == "/bin/sh" and args[2] == str(agent_world.sidecar) and args[4:] == ["mcp"]
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


@pytest.mark.parametrize("breakage", ["moved checkout", "broken venv", "unusable database", "none"])
def test_codex_starts_and_answers_whatever_became_of_the_install(codex: Codex, agent_world: AgentWorld,
                                                                 tmp_path: Path, breakage: str) -> None:
    install = tmp_path / "install"
    (install / "bin").mkdir(parents=True)
    command = install / "bin" / "context-sidecar"  # an install of its own, to break
    shutil.copy2(agent_world.sidecar, command)
    folder = tmp_path / "data"
    folder.mkdir()
    db = ["--db", str(folder / "memory.duckdb")] if breakage == "unusable database" else []
    codex.write_config()
    agent_world.run([command, "setup", "codex", *db], env=codex.env()).check()
    if breakage == "unusable database":
        folder.rmdir()
        folder.write_text("")  # a file where the database's folder was
    elif breakage == "moved checkout":
        install.rename(tmp_path / "moved")
    elif breakage == "broken venv":
        lines = command.read_text().splitlines(keepends=True)
        command.write_text(f"#!{tmp_path / 'gone' / 'python3'}\n" + "".join(lines[1:]))  # its Python uninstalled
    agent_world.provider.responder = lambda request: "answered"
    run = agent_world.run([codex.binary, "exec", "--json", "--skip-git-repo-check", "hello"], env=codex.env(),
                          parse=Codex._parse).check()
    assert run.text == "answered"
    offered = ["mcp__context_sidecar" in [tool.get("name") for tool in request.body.get("tools") or []]
               for request in run.requests]
    assert offered == [breakage in ("none", "unusable database")]  # the tools, whenever the server runs
