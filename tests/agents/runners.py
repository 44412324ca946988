"""Claude Code, Codex and pi, each run offline against the world's fake provider, as the tests drive them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from sidecar.agents.tomledit import key_text, value_text
from tests.agents.world import RUN_TIMEOUT, AgentRun, AgentWorld, kill_group

Event = dict[str, Any]


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


class Claude:
    """Claude Code in ``-p`` mode: ``ANTHROPIC_BASE_URL`` at the fake, its nonessential traffic off."""

    def __init__(self, world: AgentWorld, binary: Path) -> None:
        self.world = world
        self.binary = binary

    def env(self) -> dict[str, str | None]:
        """Claude Code's own variables."""
        return {"ANTHROPIC_BASE_URL": self.world.provider.url, "ANTHROPIC_API_KEY": "dummy",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}

    def run(self, prompt: str, *args: str, resume: str | None = None,
            mcp_config: Mapping[str, Any] | Path | None = None, allowed_tools: Iterable[str] = (),
            env: Mapping[str, str | None] | None = None, timeout: float = RUN_TIMEOUT) -> AgentRun:
        """``claude -p PROMPT --output-format json`` (plus ``--resume``, ``--mcp-config``, ``--allowedTools``)."""
        argv: list[str | Path] = [self.binary, "-p", prompt, "--output-format", "json"]
        if resume:
            argv += ["--resume", resume]
        if mcp_config is not None:
            argv += ["--mcp-config", self._config_file(mcp_config)]
        allowed = list(allowed_tools)
        if allowed:
            argv += ["--allowedTools", ",".join(allowed)]
        return self.world.run([*argv, *args], env={**self.env(), **(env or {})}, timeout=timeout,
                              parse=self._parse)

    def transcripts(self, cwd: Path | None = None) -> Path:
        """Where Claude Code keeps the workspace's transcripts: ``~/.claude/projects/<cwd, [^A-Za-z0-9] as ->``."""
        where = os.path.realpath(cwd or self.world.workspace)
        return self.world.home / ".claude" / "projects" / re.sub(r"[^A-Za-z0-9]", "-", where)

    def _config_file(self, config: Mapping[str, Any] | Path) -> Path:
        if isinstance(config, Path):
            return config
        path = self.world.root / f"mcp-{time.monotonic_ns()}.json"
        path.write_text(json.dumps(config), encoding="utf-8")
        return path

    @staticmethod
    def _parse(stdout: str) -> tuple[Any, str]:
        output = _json_or_none(stdout)
        text = str(output.get("result", "")) if isinstance(output, dict) else stdout.strip()
        return output, text


class Codex:
    """``codex exec``; ``CODEX_HOME`` holds a config pointing at the fake, with every outbound call switched off."""

    def __init__(self, world: AgentWorld, binary: Path) -> None:
        self.world = world
        self.binary = binary
        self.home = world.home / ".codex"
        self.config: dict[str, Any] = {}
        """Merged over the base config before each run (e.g. ``{"mcp_servers": {...}}``)."""

    def base_config(self) -> dict[str, Any]:
        """The config every run gets: the fake provider, no approvals, a trusted workspace, nothing outbound."""
        return {
            "model": "fake-model", "model_provider": "fake", "approval_policy": "never",
            "sandbox_mode": "danger-full-access", "check_for_update_on_startup": False, "web_search": "disabled",
            "analytics": {"enabled": False},
            "features": {"plugins": False, "remote_plugin": False, "apps": False, "in_app_updates": False},
            "model_providers": {"fake": {"name": "fake", "base_url": self.world.provider.base_url,
                                         "wire_api": "responses", "env_key": "FAKE_API_KEY"}},
            "projects": {os.path.realpath(self.world.workspace): {"trust_level": "trusted"}},
        }

    def write_config(self) -> Path:
        """Write ``$CODEX_HOME/config.toml`` (base config merged with ``self.config``)."""
        self.home.mkdir(parents=True, exist_ok=True)
        path = self.home / "config.toml"
        path.write_text(to_toml(merged(self.base_config(), self.config)), encoding="utf-8")
        return path

    def env(self) -> dict[str, str | None]:
        """Codex's own variables."""
        return {"CODEX_HOME": str(self.home), "FAKE_API_KEY": "dummy"}

    def run(self, prompt: str, *args: str, env: Mapping[str, str | None] | None = None,
            timeout: float = RUN_TIMEOUT) -> AgentRun:
        """``codex exec --json --skip-git-repo-check [ARGS] PROMPT </dev/null``; output is its JSON events."""
        self.write_config()
        argv = [self.binary, "exec", "--json", "--skip-git-repo-check", *args, prompt]
        return self.world.run(argv, env={**self.env(), **(env or {})}, timeout=timeout, parse=self._parse)

    def sessions(self) -> list[Path]:
        """The rollout transcripts Codex wrote, oldest first."""
        return sorted((self.home / "sessions").rglob("rollout-*.jsonl"))

    @staticmethod
    def _parse(stdout: str) -> tuple[Any, str]:
        events = [e for e in map(_json_or_none, stdout.splitlines()) if isinstance(e, dict)]
        said = [e["item"].get("text", "") for e in events
                if e.get("type") == "item.completed" and (e.get("item") or {}).get("type") == "agent_message"]
        return events, said[-1] if said else ""


class Pi:
    """pi with ``PI_CODING_AGENT_DIR`` holding a models.json whose provider ``fake`` is the fake (Chat Completions)."""

    def __init__(self, world: AgentWorld, binary: Path, context_window: int = 200_000) -> None:
        self.world = world
        self.binary = binary
        self.dir = world.home / ".pi" / "agent"
        self.context_window = context_window

    def write_models(self) -> Path:
        """Write ``models.json`` with the provider ``fake`` and its model ``fake-model``."""
        self.dir.mkdir(parents=True, exist_ok=True)
        model = {"id": "fake-model", "name": "fake-model", "contextWindow": self.context_window, "maxTokens": 4096}
        provider = {"baseUrl": self.world.provider.base_url, "api": "openai-completions", "apiKey": "dummy",
                    "models": [model]}
        path = self.dir / "models.json"
        path.write_text(json.dumps({"providers": {"fake": provider}}, indent=2), encoding="utf-8")
        return path

    def env(self) -> dict[str, str | None]:
        """pi's own variables."""
        return {"PI_CODING_AGENT_DIR": str(self.dir), "PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1",
                "PI_TELEMETRY": "0"}

    def argv(self, *args: str) -> list[str]:
        """pi's command line for the fake model, offline."""
        return [str(self.binary), "--offline", "--provider", "fake", "--model", "fake-model", *args]

    def run(self, prompt: str, *args: str, env: Mapping[str, str | None] | None = None,
            timeout: float = RUN_TIMEOUT) -> AgentRun:
        """``pi … [ARGS] -p PROMPT``; output is what it printed."""
        self.write_models()
        return self.world.run(self.argv(*args, "-p", prompt), env={**self.env(), **(env or {})}, timeout=timeout)

    def rpc(self, *args: str, env: Mapping[str, str | None] | None = None) -> PiRpc:
        """Start ``pi --mode rpc`` (use it as a context manager)."""
        self.write_models()
        return PiRpc(self.world, self.argv("--mode", "rpc", *args), {**self.env(), **(env or {})})

    def sessions(self) -> list[Path]:
        """The session files pi wrote, oldest first."""
        return sorted((self.dir / "sessions").rglob("*.jsonl"))


class PiRpc:
    """A ``pi --mode rpc`` process: send commands as JSON lines, wait for responses and events."""

    def __init__(self, world: AgentWorld, argv: list[str], env: Mapping[str, str | None]) -> None:
        self.world = world
        self.process = subprocess.Popen(argv, cwd=world.workspace, env=world.env(env), text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        start_new_session=True)
        self.events: list[Event] = []
        """Every line pi printed, parsed, in order (responses included)."""
        self.stderr = ""
        self._lock = threading.Condition()
        self._ids = 0
        self._readers = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for reader in self._readers:
            reader.start()

    def __enter__(self) -> PiRpc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, command: Mapping[str, Any]) -> str:
        """Send one command with a fresh ``id``; return the id."""
        with self._lock:
            self._ids += 1
            ident = f"kit-{self._ids}"
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({**command, "id": ident}) + "\n")
        self.process.stdin.flush()
        return ident

    def request(self, command: Mapping[str, Any], timeout: float = RUN_TIMEOUT) -> Event:
        """Send a command and wait for its response; fail if pi refused it."""
        ident = self.send(command)
        response = self.wait_for(lambda e: e.get("type") == "response" and e.get("id") == ident, timeout=timeout)
        assert response.get("success"), f"pi refused {command}: {response}"
        return response

    def prompt(self, message: str, timeout: float = RUN_TIMEOUT) -> list[Event]:
        """Send a prompt and wait for the agent to finish it; return the events from the prompt to ``agent_end``."""
        start = len(self.events)
        self.request({"type": "prompt", "message": message}, timeout=timeout)
        self.wait_for(lambda e: e.get("type") == "agent_end", timeout=timeout, after=start)
        return self.events[start:]

    def wait_for(self, predicate: Callable[[Event], bool], timeout: float = RUN_TIMEOUT, after: int = 0) -> Event:
        """The first event at or after index ``after`` satisfying ``predicate``, waiting for it to come."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                for event in self.events[after:]:
                    if predicate(event):
                        return event
                left = deadline - time.monotonic()
                if left <= 0 or (self.process.poll() is not None and not self._readers[0].is_alive()):
                    raise AssertionError(f"pi sent no awaited event in {timeout} s (exit {self.process.poll()}); "
                                         f"last events {self.events[-3:]}; stderr:\n{self.stderr[-2000:]}")
                self._lock.wait(min(left, 1.0))

    def close(self, timeout: float = 10.0) -> int:
        """Close stdin, wait for pi to exit (killing it after ``timeout``); return its exit code."""
        if self.process.stdin and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_group(self.process)
            code = self.process.wait()
        kill_group(self.process)
        for reader in self._readers:
            reader.join(5)
        return code

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            event = _json_or_none(line.rstrip("\r\n"))
            with self._lock:
                self.events.append(event if isinstance(event, dict) else {"type": "unparsed", "line": line})
                self._lock.notify_all()
        with self._lock:
            self._lock.notify_all()

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self._lock:
                self.stderr += line


def merged(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` merged in, tables key by key."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = merged(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) \
            else value
    return out


def to_toml(table: Mapping[str, Any], prefix: str = "") -> str:
    """A TOML document for ``table`` (strings, numbers, booleans, lists of those, nested tables)."""
    scalars = [f"{key_text(k)} = {value_text(v)}" for k, v in table.items() if not isinstance(v, Mapping)]
    text = "\n".join(scalars) + ("\n" if scalars else "")
    for key, value in table.items():
        if isinstance(value, Mapping):
            name = f"{prefix}.{key_text(key)}" if prefix else key_text(key)
            text += f"\n[{name}]\n" + to_toml(value, name)
    return text

