"""The kit itself: an agent world's environment, the Codex config it writes, and what happens without the agents."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.agents.install import REQUIRE_ENV, SKIP_ENV, agent_binary
from tests.agents.runners import Codex, merged
from tests.agents.world import AgentWorld

ROOT = Path(__file__).resolve().parents[2]


def test_a_world_runs_processes_in_a_clean_env_of_its_own(agent_world: AgentWorld,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-leak")
    script = 'command -v context-sidecar; echo "$HOME"; echo "${OPENAI_API_KEY:-unset}"; echo "$HTTPS_PROXY"; pwd'
    run = agent_world.run(["sh", "-c", script]).check()
    sidecar, home, key, proxy, cwd = run.stdout.splitlines()
    assert Path(sidecar) == agent_world.sidecar and agent_world.sidecar.exists()
    assert (home, key, proxy) == (str(agent_world.home), "unset", agent_world.proxy.url)
    assert Path(cwd).resolve() == agent_world.workspace.resolve()
    assert run.requests == []


def test_the_codex_config_is_toml_with_the_tests_additions(agent_world: AgentWorld) -> None:
    codex = Codex(agent_world, Path("codex"))
    codex.config = {"mcp_servers": {"stand-in": {"command": sys.executable, "args": ["-u", "x y.py"],
                                                 "required": True}},
                    "features": {"apps": True}}
    written = tomllib.loads(codex.write_config().read_text())
    assert written == merged(codex.base_config(), codex.config)
    assert written["features"] == {"plugins": False, "remote_plugin": False, "apps": True, "in_app_updates": False}
    assert written["projects"][os.path.realpath(agent_world.workspace)] == {"trust_level": "trusted"}


def test_a_missing_agent_skips_with_the_reason_or_fails_when_required(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for name in (SKIP_ENV, REQUIRE_ENV):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"is not installed in .*python -m tests.agents.install pi"):
        agent_binary("pi")
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=f"{REQUIRE_ENV} is set and .* is not installed"):
        agent_binary("pi")
    monkeypatch.setenv(SKIP_ENV, "1")
    with pytest.raises(pytest.skip.Exception, match=f"{SKIP_ENV} is set"):
        agent_binary("pi")


def test_the_installer_reports_what_is_missing(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    check = subprocess.run([sys.executable, "-m", "tests.agents.install", "--check"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=60, check=False)
    assert check.returncode == 1
    assert [line.split(": ")[1] for line in check.stdout.splitlines()] == ["not installed"] * 3
    wrong = subprocess.run([sys.executable, "-m", "tests.agents.install", "claude", "gemini"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=60, check=False)
    assert wrong.returncode == 2 and "unknown agent gemini" in wrong.stderr
    assert not (tmp_path / "context-sidecar" / "agents").exists() or not any(
        (tmp_path / "context-sidecar" / "agents").iterdir())
