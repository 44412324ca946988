"""A test's machine as an agent sees it: its own HOME and XDG dirs, a workspace, a fake provider, a refusing proxy."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sidecar.testing import FakeProvider, RecordedRequest
from sidecar.testing.refusing_proxy import RefusingProxy

RUN_TIMEOUT = 120.0
"""Seconds one agent run may take before it is killed and the test fails."""
QUIET = {
    "DO_NOT_TRACK": "1",  # honoured by many CLIs' telemetry
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "NO_UPDATE_NOTIFIER": "1",
    "npm_config_update_notifier": "false",
}
"""Telemetry and update switches every agent run gets; each runner adds its agent's own."""


@dataclasses.dataclass(frozen=True)
class AgentRun:
    """What one agent run gave."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    output: Any
    """The parsed output: Claude Code's result JSON, Codex's JSON events, pi's text."""
    text: str
    """The agent's final answer as it printed it."""
    requests: list[RecordedRequest]
    """The model requests the fake provider received during the run, oldest first."""
    seconds: float

    def check(self) -> AgentRun:
        """This run, after asserting it exited 0 (the message shows its stderr)."""
        assert self.returncode == 0, f"{self.argv[0]} exited {self.returncode}:\n{self.stderr[-4000:]}"
        return self


class AgentWorld:
    """A temporary HOME (with XDG dirs) and workspace, the fake provider, and the refusing proxy in the env."""

    def __init__(self, root: Path, provider: FakeProvider, proxy: RefusingProxy, runtime_dir: Path) -> None:
        self.root = root
        self.provider = provider
        self.proxy = proxy
        self.home = root / "home"
        self.workspace = root / "workspace"
        self.xdg = {"XDG_CONFIG_HOME": self.home / ".config", "XDG_DATA_HOME": self.home / ".local" / "share",
                    "XDG_STATE_HOME": self.home / ".local" / "state", "XDG_CACHE_HOME": self.home / ".cache",
                    "XDG_RUNTIME_DIR": runtime_dir}
        """The XDG dirs; XDG_RUNTIME_DIR is short, as socket paths must be (the sidecar's host sockets)."""
        for path in (self.home, self.workspace, *self.xdg.values()):
            path.mkdir(parents=True, exist_ok=True)

    @property
    def sidecar(self) -> Path:
        """The ``context-sidecar`` beside the Python running the tests (the checkout's venv); first on PATH."""
        return Path(sys.executable).parent / "context-sidecar"

    def env(self, extra: Mapping[str, str | None] | None = None) -> dict[str, str]:
        """A clean environment (nothing inherited) pointing at this world; ``extra`` on top, a None value removes."""
        node = shutil.which("node")
        path = [str(self.sidecar.parent), *([str(Path(node).parent)] if node else []), "/usr/local/bin", "/usr/bin",
                "/bin"]
        shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
        env: dict[str, str | None] = {
            "PATH": os.pathsep.join(dict.fromkeys(path)), "HOME": str(self.home), "LANG": "C.UTF-8", "TERM": "dumb",
            "SHELL": shell, **{name: str(value) for name, value in self.xdg.items()}, **QUIET, **self.proxy.env()}
        env.update(extra or {})
        return {name: value for name, value in env.items() if value is not None}

    def run(self, argv: Sequence[str | os.PathLike[str]], *, env: Mapping[str, str | None] | None = None,
            stdin: str | None = None, cwd: Path | None = None, timeout: float = RUN_TIMEOUT,
            parse: Any = None) -> AgentRun:
        """Run an agent to its end in the workspace; ``parse(stdout)`` gives ``(output, text)``."""
        args = [str(a) for a in argv]
        seen = len(self.provider.requests)
        started = time.monotonic()
        process = subprocess.Popen(args, cwd=cwd or self.workspace, env=self.env(env), text=True,
                                   stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            stdout, stderr = process.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(process)
            stdout, stderr = process.communicate()
            raise AssertionError(f"{args[0]} did not finish in {timeout} s; stderr:\n{stderr[-4000:]}") from None
        finally:
            kill_group(process)  # whatever it left running (MCP servers, shells)
        seconds = time.monotonic() - started
        output, text = parse(stdout) if parse else (stdout, stdout.strip())
        requests = [r for r in self.provider.requests[seen:] if r.api in ("anthropic", "responses", "chat")]
        return AgentRun(args, process.returncode, stdout, stderr, output, text, requests, seconds)

    def assert_nothing_left(self) -> None:
        """Assert no process of this world asked the refusing proxy for anything."""
        attempts = [(a.method, a.target) for a in self.proxy.attempts]
        assert attempts == [], f"traffic tried to leave the machine: {attempts}"


def kill_group(process: subprocess.Popen[Any]) -> None:
    """SIGKILL the process's group (it was started in a session of its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
