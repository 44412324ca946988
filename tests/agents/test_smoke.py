"""Each pinned agent completes a tool round trip offline against the fake provider, built-in tool and MCP tool.

The shell commands compute their answer (``$((6*7))``), so only a tool that really ran can put it in the
result the agent sends back; the fake model only echoes what it was sent.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sidecar.testing import reference_policy
from tests.agents.runners import Claude, Codex, Pi
from tests.agents.world import QUIET, AgentWorld

STAND_IN = Path(__file__).with_name("stand_in_mcp.py")
COMPUTED = "echo kit-$((6*7))"


def test_claude_runs_bash_for_the_model_and_resumes_the_session(claude: Claude, agent_world: AgentWorld) -> None:
    agent_world.provider.responder = reference_policy(tool="Bash", arguments={"command": COMPUTED})
    first = claude.run("USE_TOOL please", allowed_tools=["Bash"]).check()
    assert first.text == "FINAL: tool said: kit-42"
    call, answer = first.requests
    assert call.tool_result is None and answer.tool_result == "kit-42"
    session = first.output["session_id"]
    assert (claude.transcripts() / f"{session}.jsonl").is_file(), "the transcript is in the test's HOME"

    again = claude.run("what did the tool say?", resume=session).check()
    assert again.output["session_id"] == session
    assert "kit-42" in json.dumps(again.requests[0].body["messages"]), "the resumed session carries the result"


def test_claude_calls_an_mcp_tool(claude: Claude, agent_world: AgentWorld) -> None:
    agent_world.provider.responder = reference_policy(arguments={"pattern": "platypus"})
    config = {"mcpServers": {"stand-in": {"type": "stdio", "command": sys.executable, "args": [str(STAND_IN)]}}}
    run = claude.run("USE_TOOL search", mcp_config=config, allowed_tools=["mcp__stand-in"]).check()
    assert "mcp__stand-in__memory_grep" in [t.name for t in run.requests[0].tools]
    assert run.text == "FINAL: tool said: MEMHIT stand-in matched 'platypus'"


def test_codex_runs_a_shell_command_for_the_model(codex: Codex, agent_world: AgentWorld) -> None:
    agent_world.provider.responder = reference_policy(tool="exec_command", arguments={"cmd": COMPUTED})
    run = codex.run("USE_TOOL please").check()
    result = run.requests[-1].tool_result
    assert result is not None and "kit-42" in result
    assert run.text.startswith("FINAL: tool said:") and "kit-42" in run.text
    assert codex.sessions(), "the rollout is under the test's CODEX_HOME"


def test_codex_calls_a_namespaced_mcp_tool(codex: Codex, agent_world: AgentWorld) -> None:
    agent_world.provider.responder = reference_policy(arguments={"pattern": "platypus"})
    codex.config = {"mcp_servers": {"stand-in": {"command": sys.executable, "args": [str(STAND_IN)],
                                                 "required": True}}}
    run = codex.run("USE_TOOL search").check()
    offered = [(t.namespace, t.name) for t in run.requests[0].tools]
    assert ("mcp__stand_in", "memory_grep") in offered
    assert "MEMHIT stand-in matched 'platypus'" in (run.requests[-1].tool_result or "")
    assert "MEMHIT stand-in matched" in run.text


def test_pi_reads_a_file_for_the_model(pi: Pi, agent_world: AgentWorld) -> None:
    (agent_world.workspace / "notes.txt").write_text("the deploy key hint is BLUE-HERON\n")
    agent_world.provider.responder = reference_policy(tool="read", arguments={"path": "notes.txt"})
    run = pi.run("USE_TOOL read the notes").check()
    assert "BLUE-HERON" in (run.requests[-1].tool_result or "")
    assert "FINAL: tool said:" in run.text and "BLUE-HERON" in run.text
    assert run.requests[0].body["stream"] is True and pi.sessions()


def test_pi_in_rpc_mode_runs_bash_and_reports_events(pi: Pi, agent_world: AgentWorld) -> None:
    agent_world.provider.responder = reference_policy(tool="bash", arguments={"command": COMPUTED})
    with pi.rpc() as rpc:
        events = rpc.prompt("USE_TOOL run it")
        ended = [e for e in events if e.get("type") == "tool_execution_end"]
        assert ended and "kit-42" in json.dumps(ended[0])
        last = rpc.request({"type": "get_last_assistant_text"})
        assert "kit-42" in json.dumps(last.get("data"))
    assert rpc.process.returncode == 0, rpc.stderr[-2000:]  # pi ends cleanly when its input closes


def test_the_refusing_proxy_sees_claude_code_when_its_quiet_switches_are_off(
        claude: Claude, agent_world: AgentWorld) -> None:
    loud = dict.fromkeys([*QUIET, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"])
    agent_world.provider.responder = reference_policy()
    run = claude.run("hello", env=loud).check()
    assert run.text == "Hello from the fake model."
    refused = agent_world.proxy.take()  # checked here, so the fixture's own check sees none
    assert refused and {(a.method, a.target) for a in refused} == {("CONNECT", "api.anthropic.com:443")}
