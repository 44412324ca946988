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
from typing import TYPE_CHECKING, Any

import attrs

from sidecar.cli.proxy_command import HOST, ProxyOptions, add_options, running

if TYPE_CHECKING:
    from sidecar.proxy.stats import Problem

log = logging.getLogger(__name__)

AGENTS = ("claude", "codex")


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
  codex: one -c override moves the active provider's base URL to the proxy, and nothing else (config.toml
    is not changed, and none of its secrets goes on a command line); where it pointed (for the built-in
    openai provider, openai_base_url or OPENAI_BASE_URL) is where the proxy sends codex's requests
    (--openai-upstream wins).

Should the proxy not start, the agent runs without it, and wrap says so in one line; should the sidecar not
be able to store the session (its database locked by another process), wrap says so once.

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


@attrs.define
class CodexProvider:
    """The model provider a Codex run uses, as its config.toml (read only) says."""

    name: str
    base_url: str | None
    """Where its requests went (the proxy's OpenAI upstream); None for the public API."""
    defined: bool
    """A table of the user's ``[model_providers]``: a dotted ``-c`` override moves its base URL, and Codex keeps
    the rest of it (``http_headers``, ``query_params``, ``env_key``) from the file."""

    def overrides(self, url: str) -> list[str]:
        """The ``-c`` overrides pointing the provider at the proxy: its base URL alone, so that no secret of its
        table shows on a command line (``ps``, ``/proc/PID/cmdline``). NotProxied when it cannot be pointed."""
        from sidecar.agents.tomledit import key_text

        base = json.dumps(f"{url}/openai/v1")
        if self.defined and "." not in self.name:
            return ["-c", f"model_providers.{key_text(self.name)}.base_url={base}"]
        if self.name == "openai" and not self.defined:  # the built-in provider (its own key or login)
            return ["-c", f"openai_base_url={base}"]
        raise NotProxied(f"Codex's model provider {self.name!r} cannot be pointed at the proxy by an override")


class NotProxied(Exception):
    """The agent cannot be run through the proxy; the message says why (the agent then runs without it)."""


def codex_provider(env: Mapping[str, str]) -> CodexProvider:
    """The active Codex provider, from $CODEX_HOME/config.toml (read only)."""
    import tomllib

    home = Path(env.get("CODEX_HOME") or Path(env.get("HOME") or Path.home()) / ".codex")
    try:
        config = tomllib.loads((home / "config.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        config = {}
    name = str(config.get("model_provider") or "openai")
    table = (config.get("model_providers") or {}).get(name)
    if isinstance(table, dict):
        return CodexProvider(name, table.get("base_url") or None, True)
    if name == "openai":
        return CodexProvider(name, config.get("openai_base_url") or env.get("OPENAI_BASE_URL") or None, False)
    return CodexProvider(name, None, False)  # another of Codex's built-in providers


def agent_command(agent: str, args: list[str], url: str, env: dict[str, str],
                  provider: CodexProvider | None) -> list[str]:
    """The agent's command line, pointed at the proxy (``env`` is updated in place)."""
    binary = shutil.which(agent, path=env.get("PATH"))
    if binary is None:
        raise FileNotFoundError(f"{agent} is not on PATH")
    if agent == "claude":
        env["ANTHROPIC_BASE_URL"] = f"{url}/anthropic"  # everything under it goes to Anthropic's upstream
        return [binary, *args]
    assert provider is not None
    return [binary, *provider.overrides(url), *args]


def say(text: str) -> None:
    """One line on the terminal the agent uses."""
    print(f"context-sidecar wrap: {text}", file=sys.stderr, flush=True)


def run_wrap(options: ProxyOptions, agent: str, args: list[str], port_given: bool) -> int:
    """Run the agent through a proxy (without one, said in a line, when none can serve it); returns its exit
    status (128 + N when a signal ended it)."""
    import asyncio

    if args[:1] == ["--"]:
        args = args[1:]
    env = dict(os.environ)
    if shutil.which(agent, path=env.get("PATH")) is None:
        say(f"{agent} is not on PATH")
        return 127
    provider: CodexProvider | None = None
    # The agent's own base URL (a gateway, say) is where its requests went: the proxy sends them there.
    if agent == "claude" and options.anthropic_upstream is None and env.get("ANTHROPIC_BASE_URL"):
        options.anthropic_upstream = env["ANTHROPIC_BASE_URL"]
    if agent == "codex":
        provider = codex_provider(env)
        if options.openai_upstream is None and provider.base_url:
            options.openai_upstream = provider.base_url

    async def main() -> int:
        if provider is not None:
            try:
                provider.overrides("")
            except NotProxied as error:
                say(f"{error}: running {agent} without the proxy (nothing is stored)")
                return await run_agent(agent, args, None, env, provider)
        found = running_proxy(options.port)
        if found is not None:
            problem = mismatch(found, options, agent)
            if problem:
                say(f"the proxy on port {options.port} {problem}; stop it or choose another --port")
                return 2
            trouble = found.get("problem") or {}
            if trouble.get("message") and not trouble.get("resolvedAt"):
                say(f"the sidecar of the proxy on port {options.port} cannot store sessions ({trouble['message']}): "
                    f"{agent}'s requests go to its provider as it sends them")
            return await run_agent(agent, args, f"http://{HOST}:{options.port}", env, provider)
        if not port_given:
            options.port = 0 if _taken(options.port) else options.port
        async with contextlib.AsyncExitStack() as stack:
            try:
                app = await stack.enter_async_context(running(options))
            except Exception as error:  # the agent runs all the same
                log.exception("the proxy could not start")
                why = f"cannot listen on {HOST}:{options.port}: {error.strerror or error}" \
                    if isinstance(error, OSError) else f"{type(error).__name__}: {error}"
                say(f"the proxy could not start ({why}): running {agent} without it (nothing is stored)")
                return await run_agent(agent, args, None, env, provider)
            said: list[str] = []

            def tell(problem: Problem) -> None:
                if not said:  # once: the rest is in `context-sidecar status` and the log
                    said.append(problem.message)
                    say(f"the sidecar cannot store this session ({problem.message}): {agent}'s requests go to its "
                        f"provider as it sends them; `context-sidecar status --port {app.port}` shows it")

            app.proxy.stats.on_problem = tell
            if app.proxy.stats.problem is not None:
                tell(app.proxy.stats.problem)
            code = await run_agent(agent, args, f"http://{HOST}:{app.port}", env, provider)
            await app.proxy.settle()
            report_summaries(app.stats())
            return code

    return asyncio.run(main())


def report_summaries(stats: dict[str, Any]) -> None:
    """One line on stderr per session of the run that compacted: who wrote its summaries, what the calls cost."""
    from sidecar.proxy.stats import summaries_line

    for entry in stats.get("sessions") or ():
        line = summaries_line(entry)
        if line:
            print(f"context-sidecar: {entry['sessionId']}: {entry['compactions']} compactions; {line}",
                  file=sys.stderr)


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


async def run_agent(agent: str, args: list[str], url: str | None, env: dict[str, str],
                    provider: CodexProvider | None) -> int:
    """Run the agent on the terminal, pointed at the proxy at ``url`` (None: as it is); Ctrl-C is the agent's to
    handle (the wrapper waits for it)."""
    import asyncio
    import signal

    command = agent_command(agent, args, url, env, provider) if url is not None else [agent, *args]
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
