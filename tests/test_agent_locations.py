"""Where the agents keep a workspace's transcripts, as sidecar/agents finds them (no server needed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from sidecar.agents import locations
from sidecar.agents.discovery import Scanner, recorded_cwd, sources


def write(path: Path, *entries: dict[str, object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    return path


def found(workspace: Path, env: dict[str, str], directories: tuple[str, ...] = ()) -> dict[str, str]:
    scanner = Scanner(str(workspace), sources(str(workspace), env, directories))
    return {str(path.relative_to(env["HOME"])): agent for path, agent in scanner.scan().items()}


def claude_workspace(tmp_path: Path) -> tuple[Path, dict[str, str], Path]:
    """A workspace, a HOME for the agents, and its Claude Code project directory holding one session, s1."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    project = tmp_path / "home" / ".claude" / "projects" / locations.claude_project_name(str(workspace))
    write(project / "s1.jsonl", {"type": "user", "cwd": str(workspace)})
    return workspace, {"HOME": str(tmp_path / "home")}, project


def test_names_as_the_agents_write_them() -> None:
    assert locations.claude_project_name("/home/me/my_shop.v2") == "-home-me-my-shop-v2"
    assert locations.pi_project_name("/home/me/shop") == "--home-me-shop--"
    env = {"HOME": "/h", "CLAUDE_CONFIG_DIR": "~/claude-work", "CODEX_HOME": "/c", "PI_CODING_AGENT_DIR": "~/pi"}
    assert locations.claude_config_dir(env) == Path("/h/claude-work")
    assert locations.codex_sessions_dir(env) == Path("/c/sessions")
    assert locations.pi_agent_dir(env) == Path("/h/pi")
    assert locations.agent_env({"HOME": "/h", "PATH": "/bin", "CODEX_HOME": ""}) == {"HOME": "/h"}


def test_claude_code_sessions_and_subagents_but_nothing_else(tmp_path: Path) -> None:
    workspace, env, project = claude_workspace(tmp_path)
    write(project / "agent-a1.jsonl", {"type": "user", "cwd": str(workspace)})  # 1.x and 2.0 subagents
    write(project / "s1" / "subagents" / "agent-a2.jsonl", {"type": "user", "cwd": str(workspace)})  # 2.1
    write(project / "s1" / "subagents" / "workflows" / "agent-a3.jsonl", {"type": "user", "cwd": str(workspace)})
    write(project / "s1" / "tool-results" / "big.jsonl", {"not": "a transcript"})
    (project / "notes.txt").write_text("not a transcript")
    assert found(workspace, env) == {
        f".claude/projects/{project.name}/{name}": "claude-code"
        for name in ("s1.jsonl", "agent-a1.jsonl", "s1/subagents/agent-a2.jsonl",
                     "s1/subagents/workflows/agent-a3.jsonl")}


def test_a_long_workspace_path_is_told_apart_by_the_cwd_its_transcripts_record(tmp_path: Path) -> None:
    workspace = tmp_path / ("a-long-folder-name-" * 12) / "ws"
    workspace.mkdir(parents=True)
    env = {"HOME": str(tmp_path / "home")}
    name = locations.claude_project_name(str(workspace))
    assert len(name) > locations.CLAUDE_NAME_LIMIT
    projects = tmp_path / "home" / ".claude" / "projects"
    mine = write(projects / f"{name[:200]}-1x2y3z" / "s.jsonl", {"type": "queue-operation"},
                 {"type": "user", "cwd": str(workspace)})
    write(projects / f"{name[:200]}-9q8r7s" / "t.jsonl", {"type": "user", "cwd": str(workspace) + "-sibling"})
    assert found(workspace, env) == {str(mine.relative_to(env["HOME"])): "claude-code"}


def test_a_symlinked_workspace_finds_the_directory_named_after_either_path(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    env = {"HOME": str(tmp_path / "home")}
    project = tmp_path / "home" / ".claude" / "projects" / locations.claude_project_name(str(real))
    write(project / "s.jsonl", {"type": "user", "cwd": str(real)})
    assert list(found(link, env)) == [f".claude/projects/{project.name}/s.jsonl"]


def test_pi_in_its_own_directory_and_in_a_shared_one(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    home = tmp_path / "home"
    env = {"HOME": str(home), "PI_CODING_AGENT_SESSION_DIR": str(home / "all-pi")}
    header = {"type": "session", "version": 3, "id": "p", "timestamp": "2026-11-20T09:00:00Z"}
    write(home / ".pi" / "agent" / "sessions" / locations.pi_project_name(str(workspace)) / "1_p.jsonl",
          {**header, "cwd": str(workspace)})
    write(home / "all-pi" / "2_q.jsonl", {**header, "cwd": str(workspace)})
    write(home / "all-pi" / "3_r.jsonl", {**header, "cwd": "/srv/other"})
    assert found(workspace, env) == {
        f".pi/agent/sessions/{locations.pi_project_name(str(workspace))}/1_p.jsonl": "pi",
        "all-pi/2_q.jsonl": "pi"}


def test_directories_named_by_the_client_and_what_their_first_lines_say(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    env = {"HOME": str(tmp_path / "home")}
    extra = tmp_path / "home" / "archive"
    write(extra / "2026" / "mine.jsonl", {"type": "session_meta", "payload": {"cwd": str(workspace)}})
    write(extra / "theirs.jsonl", {"type": "user", "cwd": "/srv/other"})
    half = extra / "half.jsonl"
    half.write_text('{"type": "user", "cwd": "')  # no whole line yet: looked at again once it grew
    scanner = Scanner(str(workspace), sources(str(workspace), env, [str(extra)]))
    assert [path.name for path in scanner.scan()] == ["mine.jsonl"]
    half.write_text(json.dumps({"type": "user", "cwd": str(workspace)}) + "\n")
    assert sorted(path.name for path in scanner.scan()) == ["half.jsonl", "mine.jsonl"]
    assert recorded_cwd(half, "any") == (str(workspace), True)
    assert recorded_cwd(write(tmp_path / "r.jsonl", {"type": "response_item", "payload": {}}), "codex") == (None, True)


def test_a_file_made_in_the_same_mtime_tick_as_the_last_listing_is_found(tmp_path: Path) -> None:
    workspace, env, project = claude_workspace(tmp_path)
    scanner = Scanner(str(workspace), sources(str(workspace), env))
    assert [path.name for path in scanner.scan()] == ["s1.jsonl"]
    tick = project.stat().st_mtime_ns
    write(project / "s2.jsonl", {"type": "user", "cwd": str(workspace)})
    os.utime(project, ns=(tick, tick))  # as a coarse clock leaves it: the directory's mtime unchanged
    assert sorted(path.name for path in scanner.scan()) == ["s1.jsonl", "s2.jsonl"]
