"""The command line as a shell uses it: output into a pipe its reader closed, usage lines, paths a user types."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.cli.main import CLOSED_PIPE_EXIT
from sidecar.testing import FakeProvider
from tests.helpers.proxy import running_proxy

CLI = [sys.executable, "-m", "sidecar"]


def into_closed_pipe(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The command with its stdout a pipe whose reader is gone (``| head`` that has had its lines)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([*CLI, *map(str, args)], stdout=write, stderr=subprocess.PIPE, text=True, timeout=120,
                              env=env, check=False)
    finally:
        os.close(write)


def run(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=120, env=env, check=False)


async def test_status_json_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    with FakeProvider(responder=lambda request: "ok") as fake:
        async with running_proxy(tmp_path, fake.url) as proxy:
            port = proxy.url.rsplit(":", 1)[1]
            shown = await asyncio.to_thread(into_closed_pipe, "status", "--port", port, "--json")
            whole = await asyncio.to_thread(run, "status", "--port", port, "--json")
    assert whole.returncode == 0 and '"server": "context-sidecar proxy"' in whole.stdout
    assert (shown.returncode, shown.stderr) == (CLOSED_PIPE_EXIT, "")


@pytest.mark.parametrize("args", [["demo", "--messages", "30"], ["setup", "claude-code", "--dry-run"]],
                         ids=lambda args: args[0])
def test_every_command_that_prints_ends_quietly_when_its_reader_is_gone(args: list[str], tmp_path: Path) -> None:
    """Fixed once, where the command starts: the demo has a sidecar running when its first line cannot go out."""
    env = {**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path)}
    shown = into_closed_pipe(*args, env=env)
    assert (shown.returncode, shown.stderr) == (CLOSED_PIPE_EXIT, "")
    assert not (tmp_path / ".claude.json").exists(), "a dry run that could not print still wrote nothing"


def test_wrap_s_usage_says_the_agent_s_arguments_are_optional() -> None:
    bare = run("wrap")
    assert bare.returncode == 2
    assert bare.stderr.splitlines() == [
        "usage: context-sidecar wrap [proxy options] {claude,codex} [ARGS ...]",
        "context-sidecar wrap: error: the following arguments are required: agent"]
    shown = run("wrap", "--help").stdout
    assert shown.startswith("usage: context-sidecar wrap [proxy options] {claude,codex} [ARGS ...]\n")
    assert "one already set is where the proxy sends claude's" in shown, "a gateway's URL is kept: --help says so"
    assert "OPENAI_BASE_URL) is where the proxy sends codex's requests" in shown


@pytest.mark.parametrize("command", [["demo"], ["import", "x.jsonl"], ["replay", "x.jsonl"], ["setup", "claude-code"],
                                     ["proxy", "--port", "0"], ["wrap", "--port", "0", "claude"]],
                         ids=lambda command: command[0])
def test_a_typed_db_in_a_directory_that_does_not_exist_is_refused_and_nothing_is_made(
        command: list[str], tmp_path: Path) -> None:
    typo = tmp_path / "no-such" / "dir" / "memory.duckdb"
    env = {**os.environ, "HOME": str(tmp_path / "home"), "XDG_DATA_HOME": str(tmp_path / "data"),
           "XDG_STATE_HOME": str(tmp_path / "state"), "PATH": os.path.dirname(sys.executable)}
    name, *rest = command
    ran = run(name, "--db", typo, *rest, env=env)
    assert ran.returncode == 2
    assert ran.stderr.splitlines() == [f"context-sidecar {name}: error: --db {typo}: no directory {typo.parent} "
                                       "(create it, or correct the path)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "nothing made: no directory, no config, no log"


def test_the_default_database_s_directories_are_made(tmp_path: Path) -> None:
    data = tmp_path / "fresh" / "share"
    env = {**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(data), "XDG_RUNTIME_DIR": str(tmp_path)}
    ran = run("demo", "--messages", "3", env=env)
    assert ran.returncode == 0, ran.stderr
    assert (data / "context-sidecar" / "memory.duckdb").is_file()


async def test_a_database_setting_in_a_directory_that_does_not_exist_is_an_error_and_nothing_is_made(
        tmp_path: Path) -> None:
    from sidecar.client import SidecarClient, SidecarRequestError

    typo = tmp_path / "no-such" / "memory.duckdb"
    async with await SidecarClient.spawn(settings={"storage": {"path": str(typo)}}) as client:
        with pytest.raises(SidecarRequestError) as raised:
            await client.sessions()
    assert f"cannot open {typo}: no directory {typo.parent}" in raised.value.message
    assert not typo.parent.exists()


def test_a_log_file_in_a_directory_that_does_not_exist_is_one_line() -> None:
    ran = run("demo", "--log-file", "/no-such-dir-here/x.log")
    assert (ran.returncode, ran.stderr) == (2, "context-sidecar demo: error: --log-file /no-such-dir-here/x.log: "
                                               "No such file or directory\n")
