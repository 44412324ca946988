"""`wrap` runs the real Claude Code and Codex; their compacted history is summarized by their own model, through
the proxy, with their own key, offline against the fake provider."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

from sidecar.testing import RecordedRequest, Reply, ToolCall
from tests.agents.runners import Claude, Codex
from tests.agents.world import AgentWorld
from tests.helpers.proxy import is_summary_call

SUMMARY_TEXT = "AGENT MODEL SUMMARY: counted with seq, step by step"
SECRET = "sk-agent-own-secret-7f3a9c"
SETTINGS = {"compaction": {"maxTokens": 1500, "freshTail": 2, "leafChunkSize": 2, "keepRecentTokens": 0,
                           "minSavings": 0}, "llm": {"timeoutSeconds": 30}}
STEPS = 8



def policy(tool: str, argument: str) -> Callable[[RecordedRequest], Reply]:
    """Summary calls get the model's summary; the agent runs a long command STEPS times, then answers."""
    lock = threading.Lock()
    steps = [0]

    def respond(request: RecordedRequest) -> Reply:
        if is_summary_call(request):
            return Reply(text=SUMMARY_TEXT)
        if not request.tools:  # a side call (a title)
            return Reply(text="Counting")
        with lock:
            steps[0] += 1
            step = steps[0]
        if step <= STEPS:
            return Reply(tool_calls=(ToolCall(tool, {argument: f"seq 1 500; echo step-{step}"}),))
        return Reply(text="FINAL: counted")

    return respond


def check(world: AgentWorld, requests: list[RecordedRequest], db: Path, log: Path, key_header: str) -> None:
    summaries = [r for r in requests if is_summary_call(r)]
    agents = [r for r in requests if not is_summary_call(r) and r.tools]
    assert summaries, "no summary call reached the provider"
    for call in summaries:
        latest = [r for r in agents if r.at <= call.at][-1]
        assert call.headers.get(key_header, "").removeprefix("Bearer ") == SECRET
        assert call.body["model"] == latest.body["model"] and call.path == latest.path
    assert any(SUMMARY_TEXT in json.dumps(r.body) for r in agents), "no later request carries the summary"
    # The key never lands: not in the database (and its WAL), the logs, the sidecar's runtime directory.
    places = [*db.parent.glob(db.name + "*"), log, world.xdg["XDG_STATE_HOME"], world.xdg["XDG_RUNTIME_DIR"]]
    assert db.exists()
    for place in places:
        paths = [place] if place.is_file() else [p for p in place.rglob("*") if p.is_file()]
        assert not [str(p) for p in paths if SECRET.encode() in p.read_bytes()]


def test_wrap_claude_summaries_are_written_by_claude_s_model_with_its_key(claude: Claude, agent_world: AgentWorld,
                                                                           tmp_path: Path) -> None:
    agent_world.provider.responder = policy("Bash", "command")
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps(SETTINGS))
    log = tmp_path / "proxy.log"
    env = {**claude.env(), "ANTHROPIC_BASE_URL": None, "ANTHROPIC_API_KEY": SECRET,
           "PATH": os.pathsep.join([str(claude.binary.parent), agent_world.env()["PATH"]])}
    db = tmp_path / "wrap.duckdb"
    run = agent_world.run([agent_world.sidecar, "wrap", "--port", "0", "--db", db,
                           "--log-file", log, "--settings", settings, "--anthropic-upstream",
                           agent_world.provider.url, "claude", "--", "-p", "Count, please", "--allowedTools", "Bash",
                           "--output-format", "json"], env=env, parse=Claude._parse).check()
    assert run.text == "FINAL: counted"
    check(agent_world, agent_world.provider.requests, db, log, "x-api-key")
    assert "summaries by the agent's model" in run.stderr


def test_wrap_codex_summaries_are_written_by_codex_s_model_with_its_key(codex: Codex, agent_world: AgentWorld,
                                                                         tmp_path: Path) -> None:
    agent_world.provider.responder = policy("exec_command", "cmd")
    codex.write_config()
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps(SETTINGS))
    log = tmp_path / "proxy.log"
    env = {**codex.env(), "FAKE_API_KEY": SECRET,
           "PATH": os.pathsep.join([str(codex.binary.parent), agent_world.env()["PATH"]])}
    db = tmp_path / "wrap.duckdb"
    run = agent_world.run([agent_world.sidecar, "wrap", "--port", "0", "--db", db,
                           "--log-file", log, "--settings", settings, "codex", "--", "exec", "--json",
                           "--skip-git-repo-check", "Count, please"], env=env, parse=Codex._parse).check()
    assert run.text == "FINAL: counted"
    check(agent_world, agent_world.provider.requests, db, log, "authorization")
    assert "summaries by the agent's model" in run.stderr
