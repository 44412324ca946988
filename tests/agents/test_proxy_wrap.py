"""`context-sidecar wrap` runs the real Claude Code and Codex through the proxy, offline, against the fake provider.

The shell commands compute their answer (``$((6*7))``), so only a tool that really ran can put it in the
result; the session must then be in memory under the agent's own session id, its tool result stored once.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path

import pytest

from sidecar.client import SidecarClient
from sidecar.testing import reference_policy
from tests.agents.runners import Claude, Codex
from tests.agents.world import AgentWorld

COMPUTED = "echo wrapped-$((6*7))"


def stored(world: AgentWorld, db: Path, session: str, text: str) -> tuple[list[str], int]:
    """The database's session ids, and how many messages of ``session`` hold ``text`` (through its host)."""

    async def read() -> tuple[list[str], int]:
        client = await SidecarClient.spawn(db=str(db), env=world.env())  # the world's runtime dir: its host
        try:
            sessions = [s.session_id for s in (await client.sessions()).sessions]
            found = await client.grep(session, text, scope="messages") if session in sessions else None
            return sessions, len(found.matches) if found else 0
        finally:
            await client.close()

    return asyncio.run(read())


def test_wrap_claude_completes_a_tool_round_trip_through_the_proxy(claude: Claude, agent_world: AgentWorld,
                                                                    tmp_path: Path) -> None:
    agent_world.provider.responder = reference_policy(tool="Bash", arguments={"command": COMPUTED})
    db = tmp_path / "wrap.duckdb"
    env = {**claude.env(), "ANTHROPIC_BASE_URL": None,
           "PATH": os.pathsep.join([str(claude.binary.parent), agent_world.env()["PATH"]])}
    run = agent_world.run([agent_world.sidecar, "wrap", "--port", "0", "--db", db, "--log-file",
                           tmp_path / "proxy.log", "--anthropic-upstream", agent_world.provider.url, "claude", "--",
                           "-p", "USE_TOOL please", "--allowedTools", "Bash", "--output-format", "json"],
                          env=env, parse=Claude._parse).check()
    assert run.text == "FINAL: tool said: wrapped-42"
    assert run.requests[-1].tool_result == "wrapped-42"
    session = run.output["session_id"]
    sessions, results = stored(agent_world, db, session, "wrapped-42")
    assert session in sessions and results >= 1
    assert "dummy" not in (tmp_path / "proxy.log").read_text()  # the API key is never logged


def test_wrap_codex_completes_a_tool_round_trip_through_the_proxy(codex: Codex, agent_world: AgentWorld,
                                                                   tmp_path: Path) -> None:
    agent_world.provider.responder = reference_policy(tool="exec_command", arguments={"cmd": COMPUTED})
    config = codex.write_config()
    before = config.read_bytes()
    db = tmp_path / "wrap.duckdb"
    env = {**codex.env(), "PATH": os.pathsep.join([str(codex.binary.parent), agent_world.env()["PATH"]])}
    run = agent_world.run([agent_world.sidecar, "wrap", "--port", "0", "--db", db, "--log-file",
                           tmp_path / "proxy.log", "codex", "--", "exec", "--json", "--skip-git-repo-check",
                           "USE_TOOL please"], env=env, parse=Codex._parse).check()
    assert "wrapped-42" in (run.requests[-1].tool_result or "") and run.text.startswith("FINAL: tool said:")
    assert config.read_bytes() == before  # the user's config.toml is not touched
    thread = next(e["thread_id"] for e in run.output if e.get("type") == "thread.started")
    assert run.requests[-1].headers.get("session-id") == thread
    sessions, results = stored(agent_world, db, thread, "wrapped-42")
    assert thread in sessions and results >= 1


def test_claude_code_s_title_call_goes_upstream_but_not_into_its_session(claude: Claude, agent_world: AgentWorld,
                                                                         tmp_path: Path) -> None:
    agent_world.provider.responder = lambda request: "The parser keeps the last token."
    db = tmp_path / "wrap.duckdb"
    env = {**claude.env(), "ANTHROPIC_BASE_URL": None, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": None,
           "PATH": os.pathsep.join([str(claude.binary.parent), agent_world.env()["PATH"]])}
    run = agent_world.run([agent_world.sidecar, "wrap", "--port", "0", "--db", db, "--log-file",
                           tmp_path / "proxy.log", "--anthropic-upstream", agent_world.provider.url, "claude", "--",
                           "-p", "How does the parser pick a token?", "--output-format", "json"],
                          env=env, parse=Claude._parse).check()
    agent_world.proxy.take()  # with its nonessential traffic on, Claude Code also calls api.anthropic.com itself
    titled = [r for r in run.requests if not r.body.get("tools")]
    assert titled and "title" in json.dumps(titled[0].body["system"]).lower()  # the side call reached the model
    session = run.output["session_id"]
    sessions, asks = stored(agent_world, db, session, "How does the parser pick a token?")
    assert sessions == [session] and asks == 1  # the conversation, once; the title call is not in it


def command_lines_holding(*secrets: bytes) -> list[str]:
    """Every process's command line (``/proc/PID/cmdline``) that holds one of ``secrets``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                line = (entry / "cmdline").read_bytes()
            except OSError:
                continue  # gone meanwhile
            if any(secret in line for secret in secrets):
                found.append(line.replace(b"\0", b" ").decode(errors="replace"))
    return found


def test_wrap_codex_puts_none_of_the_provider_s_secrets_on_a_command_line(codex: Codex, agent_world: AgentWorld,
                                                                          tmp_path: Path) -> None:
    secrets = (b"header-s3cret", b"query-s3cret")
    seen: list[list[str]] = []

    def respond(request: object) -> str:
        seen.append(command_lines_holding(*secrets))  # while Codex, wrap and the proxy's sidecar all run
        return "answered"

    agent_world.provider.responder = respond
    codex.config = {"model_providers": {"fake": {"http_headers": {"x-team-token": "header-s3cret"},
                                                 "query_params": {"key": "query-s3cret"}}}}
    codex.write_config()
    env = {**codex.env(), "PATH": os.pathsep.join([str(codex.binary.parent), agent_world.env()["PATH"]])}
    run = agent_world.run([agent_world.sidecar, "wrap", "--port", "0", "--db", tmp_path / "wrap.duckdb",
                           "--log-file", tmp_path / "proxy.log", "codex", "--", "exec", "--json",
                           "--skip-git-repo-check", "hello"], env=env, parse=Codex._parse).check()
    assert run.text == "answered"
    assert seen and all(lines == [] for lines in seen), seen
    request = run.requests[-1]  # the provider's settings still apply: Codex read them from its own config
    assert request.headers.get("x-team-token") == "header-s3cret" and request.query == {"key": ["query-s3cret"]}


def test_wrap_says_once_that_the_sidecar_cannot_store_the_session_and_claude_works_on(
        claude: Claude, agent_world: AgentWorld, tmp_path: Path) -> None:
    agent_world.provider.responder = reference_policy(tool="Bash", arguments={"command": COMPUTED})
    db = tmp_path / "wrap.duckdb"

    async def holding() -> tuple[SidecarClient, int]:
        holder = await SidecarClient.spawn(command=[sys.executable, "-m", "sidecar", "--no-share"], db=str(db),
                                           env=agent_world.env())
        await holder.sessions()  # it holds the file once this answers
        assert holder.process is not None
        return holder, holder.process.pid

    loop = asyncio.new_event_loop()
    holder, pid = loop.run_until_complete(holding())
    try:
        env = {**claude.env(), "ANTHROPIC_BASE_URL": None,
               "PATH": os.pathsep.join([str(claude.binary.parent), agent_world.env()["PATH"]])}
        run = agent_world.run([agent_world.sidecar, "wrap", "--port", "0", "--db", db, "--log-file",
                               tmp_path / "proxy.log", "--anthropic-upstream", agent_world.provider.url, "claude",
                               "--", "-p", "USE_TOOL please", "--allowedTools", "Bash", "--output-format", "json"],
                              env=env, parse=Claude._parse).check()
    finally:
        loop.run_until_complete(holder.close())
        loop.close()
    assert run.text == "FINAL: tool said: wrapped-42"  # the agent worked on, unmanaged
    said = [line for line in run.stderr.splitlines() if line.startswith("context-sidecar wrap:")]
    assert len(said) == 1 and "the sidecar cannot store this session" in said[0], run.stderr
    assert f"locked by process {pid}" in said[0]


@pytest.mark.parametrize("breakage", ["port taken", "no socket directory"])
def test_wrap_runs_claude_without_the_proxy_when_the_proxy_cannot_start_and_says_so(
        claude: Claude, agent_world: AgentWorld, tmp_path: Path, breakage: str) -> None:
    agent_world.provider.responder = reference_policy(tool="Bash", arguments={"command": COMPUTED})
    env: dict[str, str | None] = {**claude.env(),  # ANTHROPIC_BASE_URL at the provider, as without wrap
                                  "PATH": os.pathsep.join([str(claude.binary.parent), agent_world.env()["PATH"]])}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()  # something else (not a proxy) listens on the port asked for
        if breakage == "no socket directory":
            runtime = tmp_path / "runtime"
            runtime.mkdir()
            (runtime / "context-sidecar").write_text("")  # a file where its socket directory should be
            env["XDG_RUNTIME_DIR"] = str(runtime)  # the sidecar can neither reach nor start its host
            port = "0"
        else:
            port = str(taken.getsockname()[1])
        run = agent_world.run([agent_world.sidecar, "wrap", "--port", port, "--db", tmp_path / "wrap.duckdb",
                               "--log-file", tmp_path / "proxy.log", "claude", "--", "-p", "USE_TOOL please",
                               "--allowedTools", "Bash", "--output-format", "json"], env=env,
                              parse=Claude._parse).check()
    assert run.text == "FINAL: tool said: wrapped-42"
    said = [line for line in run.stderr.splitlines() if line.startswith("context-sidecar wrap:")]
    assert len(said) == 1 and "the proxy could not start (" in said[0], run.stderr
    assert said[0].endswith("running claude without it (nothing is stored)")
    assert "Traceback" not in run.stderr
