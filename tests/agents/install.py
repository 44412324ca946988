"""The real coding agents the tests drive, pinned and installed from npm into a cache shared by every checkout.

The pins are ``tests/agents/npm/<agent>/package.json`` with their ``package-lock.json`` (every transitive
package pinned too). Each agent installs into
``${XDG_CACHE_HOME:-~/.cache}/context-sidecar/agents/<agent>-<version>-<lock digest>/`` with ``npm ci``,
into a temporary directory renamed into place when its binary answers ``--version``.

    python -m tests.agents.install              # install what is missing (quick when cached)
    python -m tests.agents.install --check pi   # say what is installed; install nothing
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PINS = Path(__file__).resolve().parent / "npm"
STAMP = ".installed"
SKIP_ENV = "SKIP_AGENTS"
REQUIRE_ENV = "CONTEXT_SIDECAR_REQUIRE_AGENTS"


@dataclasses.dataclass(frozen=True)
class Agent:
    """One pinned agent: its npm folder under ``tests/agents/npm`` and the binary it installs."""

    name: str
    folder: str
    bin: str

    @property
    def package(self) -> str:
        """The npm package's name."""
        return next(iter(self._manifest()["dependencies"]))

    @property
    def version(self) -> str:
        """The pinned version."""
        return str(self._manifest()["dependencies"][self.package])

    @property
    def digest(self) -> str:
        """A digest of the lock file: a changed lock installs afresh."""
        return hashlib.sha256((PINS / self.folder / "package-lock.json").read_bytes()).hexdigest()[:12]

    def home(self, cache: Path | None = None) -> Path:
        """Where this pin installs."""
        return (cache or cache_dir()) / f"{self.folder}-{self.version}-{self.digest}"

    def binary(self, cache: Path | None = None) -> Path | None:
        """The installed binary, or None when this pin is not installed."""
        home = self.home(cache)
        path = home / "node_modules" / ".bin" / self.bin
        return path if (home / STAMP).is_file() and path.exists() else None

    def _manifest(self) -> dict[str, dict[str, str]]:
        return json.loads((PINS / self.folder / "package.json").read_text(encoding="utf-8"))


AGENTS: dict[str, Agent] = {a.name: a for a in (Agent("claude", "claude-code", "claude"),
                                                Agent("codex", "codex", "codex"), Agent("pi", "pi", "pi"))}


def cache_dir() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/context-sidecar/agents``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "context-sidecar" / "agents"


def agent_binary(name: str) -> Path:
    """The installed binary of a pinned agent for a test: skips it when missing, fails it when agents are required."""
    import pytest

    agent = AGENTS[name]
    if os.environ.get(SKIP_ENV):
        pytest.skip(f"{SKIP_ENV} is set")
    found = agent.binary()
    if found is None:
        reason = (f"{agent.package}@{agent.version} is not installed in {agent.home()}: "
                  f"run `python -m tests.agents.install {name}` (scripts/test.sh does)")
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{REQUIRE_ENV} is set and {reason}")
        pytest.skip(reason)
    return found


class InstallError(RuntimeError):
    """npm could not install an agent; the message says why."""


def install(agent: Agent, cache: Path | None = None) -> Path:
    """Install ``agent`` unless it is installed; return its binary. One installer at a time per cache."""
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = agent.binary(cache)
        if found is not None:
            return found
        npm = shutil.which("npm")
        if npm is None:
            raise InstallError("npm is not on PATH: Node.js 20.6 or newer with npm is needed (scripts/node.sh "
                               "prints the bin directory of one, installing it when missing)")
        work = Path(tempfile.mkdtemp(prefix=f".{agent.folder}-", dir=cache))
        try:
            for name in ("package.json", "package-lock.json"):
                shutil.copyfile(PINS / agent.folder / name, work / name)
            done = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--no-update-notifier", "--loglevel=error"],
                                  cwd=work, capture_output=True, text=True, timeout=1200, check=False)
            if done.returncode != 0:
                raise InstallError(f"npm ci of {agent.package}@{agent.version} failed:\n{done.stderr.strip()}")
            binary = work / "node_modules" / ".bin" / agent.bin
            said = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=120,
                                  check=False, cwd=work, env={**os.environ, "HOME": str(work)})
            if agent.version not in said.stdout + said.stderr:
                raise InstallError(f"{binary} --version printed {said.stdout.strip()!r} {said.stderr.strip()!r}, "
                                   f"not {agent.version}")
            (work / STAMP).write_text(f"{agent.package}@{agent.version}\n", encoding="utf-8")
            home = agent.home(cache)
            shutil.rmtree(home, ignore_errors=True)
            work.rename(home)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        for old in cache.glob(f"{agent.folder}-*"):  # earlier pins of this agent
            if old != home:
                shutil.rmtree(old, ignore_errors=True)
        return home / "node_modules" / ".bin" / agent.bin


def main(argv: list[str] | None = None) -> int:
    """Install the pinned agents that are missing (all by default), or with --check only report them."""
    parser = argparse.ArgumentParser(prog="python -m tests.agents.install", description=main.__doc__)
    parser.add_argument("agents", nargs="*", help=f"of {', '.join(AGENTS)} (default: all)")
    parser.add_argument("--check", action="store_true", help="report what is installed; install nothing")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.agents) - set(AGENTS))
    if unknown:
        parser.error(f"unknown agent {', '.join(unknown)}: the agents are {', '.join(AGENTS)}")
    failed = False
    for agent in (AGENTS[name] for name in args.agents or AGENTS):
        label = f"{agent.package}@{agent.version}"
        found = agent.binary()
        if found is not None or args.check:
            print(f"{label}: {found or 'not installed'}")
            failed = failed or found is None
            continue
        started = time.monotonic()
        print(f"{label}: installing into {agent.home()} ...", flush=True)
        try:
            path = install(agent)
        except (InstallError, subprocess.TimeoutExpired, OSError) as error:
            print(f"{label}: {error}", file=sys.stderr)
            failed = True
            continue
        print(f"{label}: {path} ({time.monotonic() - started:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
