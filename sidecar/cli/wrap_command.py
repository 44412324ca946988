"""``context-sidecar wrap [proxy options] claude|codex [ARGS…]``: run an agent through the proxy."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sidecar.cli.proxy_command import HOST, ProxyOptions, add_options, running

log = logging.getLogger(__name__)

AGENTS = ("claude", "codex")
PROVIDER = "context-sidecar"
"""The Codex model provider a wrapped run uses (``-c`` overrides: the user's config.toml is not touched)."""


def add_command(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register ``wrap``."""
    wrap = commands.add_parser(
        "wrap", parents=[common], help="run Claude Code or Codex through the proxy",
        usage="context-sidecar wrap [proxy options] {claude,codex} [ARGS ...]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Start the proxy (or use the one already listening on --port), run the agent with its base URL pointed at it,
and stop what was started when the agent exits, with the agent's exit status. Proxy options go before the
agent; everything after it is the agent's own (a -- there is dropped).

Where the requests go (a gateway, a local model, a company proxy):
  claude: ANTHROPIC_BASE_URL is pointed at the proxy; one already set is where the proxy sends claude's
    requests (--anthropic-upstream wins), so the agent's token goes where it went before.
  codex: a model provider for this run only, given with -c (config.toml is not changed): the active
    provider's settings with its base URL at the proxy; that provider's base URL (for the built-in openai
    provider, OPENAI_BASE_URL) is where the proxy sends codex's requests (--openai-upstream wins).

The proxy's log goes to --log-file (default proxy.log in the per-user log directory), so that the agent has
the terminal to itself.""",
        epilog="""\
examples:
  context-sidecar wrap claude                                   Claude Code as usual, through the proxy
  context-sidecar wrap claude -p "fix the failing test"         its arguments after its name
  ANTHROPIC_BASE_URL=https://llm.example.com context-sidecar wrap claude   through your gateway
  context-sidecar wrap --anthropic-upstream http://127.0.0.1:4000 claude   or name it here
  context-sidecar wrap --db /tmp/a.duckdb codex exec "fix the test"       Codex, another database""")
    add_options(wrap)
    wrap.add_argument("agent", choices=AGENTS, help="the agent to run (found on PATH)")
    # Nothing after the agent is required: argparse would list a REMAINDER among the required arguments.
    wrap.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                      help="the agent's own arguments, as you would give them to it").required = False


def default_log() -> Path:
    """Where a wrapped run's proxy logs: proxy.log in the per-user log directory."""
    import platformdirs

    return Path(platformdirs.user_log_dir("context-sidecar", appauthor=False)) / "proxy.log"


def running_proxy(port: int) -> dict[str, Any] | None:
    """The figures of a context-sidecar proxy listening on ``port``, None when none answers there."""
    if not port:
        return None
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/stats", timeout=2) as response:
            stats = json.loads(response.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return stats if isinstance(stats, dict) and stats.get("server") == "context-sidecar proxy" else None


def codex_provider(env: Mapping[str, str]) -> tuple[str | None, dict[str, Any]]:
    """The active Codex provider's base URL and its settings, from $CODEX_HOME/config.toml (read only)."""
    import tomllib

    home = Path(env.get("CODEX_HOME") or Path(env.get("HOME") or Path.home()) / ".codex")
    try:
        config = tomllib.loads((home / "config.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        config = {}
    name = config.get("model_provider") or "openai"
    provider = dict((config.get("model_providers") or {}).get(name) or {})
    if not provider and name == "openai":
        # The built-in provider's fields: `codex login` (auth.json) or, without it, the key in the environment.
        provider = {"name": "OpenAI", "requires_openai_auth": True, "base_url": env.get("OPENAI_BASE_URL") or None}
        if not (home / "auth.json").exists() and env.get("OPENAI_API_KEY"):
            provider["env_key"] = "OPENAI_API_KEY"
    return provider.pop("base_url", None), provider


def agent_command(agent: str, args: list[str], url: str, env: dict[str, str],
                  provider: dict[str, Any]) -> list[str]:
    """The agent's command line, pointed at the proxy (``env`` is updated in place)."""
    binary = shutil.which(agent, path=env.get("PATH"))
    if binary is None:
        raise FileNotFoundError(f"{agent} is not on PATH")
    if agent == "claude":
        env["ANTHROPIC_BASE_URL"] = f"{url}/anthropic"  # everything under it goes to Anthropic's upstream
        return [binary, *args]
    from sidecar.agents.tomledit import value_text

    entry = {"name": PROVIDER, "wire_api": "responses", **provider, "base_url": f"{url}/openai/v1"}
    overrides = ["-c", f"model_provider={json.dumps(PROVIDER)}",
                 "-c", f"model_providers.{PROVIDER}={value_text(entry)}"]
    return [binary, *overrides, *args]


def run_wrap(options: ProxyOptions, agent: str, args: list[str], port_given: bool) -> int:
    """Run the agent through a proxy; returns its exit status (128 + N when a signal ended it)."""
    import asyncio

    if args[:1] == ["--"]:
        args = args[1:]
    env = dict(os.environ)
    provider: dict[str, Any] = {}
    # The agent's own base URL (a gateway, say) is where its requests went: the proxy sends them there.
    if agent == "claude" and options.anthropic_upstream is None and env.get("ANTHROPIC_BASE_URL"):
        options.anthropic_upstream = env["ANTHROPIC_BASE_URL"]
    if agent == "codex":
        base, provider = codex_provider(env)
        if options.openai_upstream is None and base:
            options.openai_upstream = base

    async def main() -> int:
        found = running_proxy(options.port)
        if found is not None:
            problem = mismatch(found, options, agent)
            if problem:
                print(f"context-sidecar wrap: the proxy on port {options.port} {problem}; stop it or choose another "
                      "--port", file=sys.stderr)
                return 2
            return await run_agent(agent, args, f"http://{HOST}:{options.port}", env, provider)
        if not port_given:
            options.port = 0 if _taken(options.port) else options.port
        async with running(options) as app:
            return await run_agent(agent, args, f"http://{HOST}:{app.port}", env, provider)

    try:
        return asyncio.run(main())
    except FileNotFoundError as error:
        print(f"context-sidecar wrap: {error}", file=sys.stderr)
        return 127
    except OSError as error:
        print(f"context-sidecar wrap: cannot listen on {HOST}:{options.port}: {error.strerror or error}",
              file=sys.stderr)
        return 1


def mismatch(found: dict[str, Any], options: ProxyOptions, agent: str) -> str | None:
    """How a running proxy differs from the one this run asks for (its database, the agent's upstream), if it does."""
    from sidecar.config.sockets import database_key
    from sidecar.proxy.app import ANTHROPIC_UPSTREAM, OPENAI_UPSTREAM

    storage = found.get("storage")
    if options.db is not None and not (isinstance(storage, str) and database_key(storage) == database_key(options.db)):
        return f"uses {storage}, not {options.db}"
    kind, wanted = ("anthropic", options.anthropic_upstream or ANTHROPIC_UPSTREAM) if agent == "claude" else \
        ("openai", options.openai_upstream or OPENAI_UPSTREAM)
    theirs = (found.get("upstreams") or {}).get(kind)
    if not isinstance(theirs, str) or theirs.rstrip("/") != wanted.rstrip("/"):
        return f"sends {kind} requests to {theirs}, not {wanted}"
    return None


def _taken(port: int) -> bool:
    """Whether something (not our proxy) listens on the port."""
    import socket

    with socket.socket() as probe:
        return probe.connect_ex((HOST, port)) == 0


async def run_agent(agent: str, args: list[str], url: str, env: dict[str, str], provider: dict[str, Any]) -> int:
    """Run the agent on the terminal; Ctrl-C is the agent's to handle (the wrapper waits for it)."""
    import asyncio
    import signal

    command = agent_command(agent, args, url, env, provider)
    loop = asyncio.get_running_loop()
    process = await asyncio.create_subprocess_exec(*command, env=env)
    loop.add_signal_handler(signal.SIGINT, lambda: None)  # the terminal sends it to the agent too
    loop.add_signal_handler(signal.SIGTERM, lambda: process.send_signal(signal.SIGTERM))
    try:
        code = await process.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signum)
    return 128 - code if code < 0 else code
