"""``context-sidecar proxy``: the HTTP proxy that assembles every prompt of an unmodified agent."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import sys
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import attrs

log = logging.getLogger(__name__)

DEFAULT_PORT = 8787
HOST = "127.0.0.1"
SUMMARIZERS = ("agent", "settings", "deterministic")


def add_options(parser: argparse.ArgumentParser) -> None:
    """The proxy's own options (``wrap`` takes them too)."""
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, metavar="N",
                        help=f"port on {HOST} to listen on (default {DEFAULT_PORT}; 0: any free port)")
    parser.add_argument("--settings", metavar="FILE", type=settings_file,
                        help="a file holding a JSON object of settings, as initialize's options take them "
                             "(contextWindow, models, compaction, prune, llm …); inline JSON works too")
    parser.add_argument("--anthropic-upstream", metavar="URL", default=None,
                        help="where Anthropic Messages requests go: the provider, a gateway, a local model "
                             "(default https://api.anthropic.com; wrap claude: an ANTHROPIC_BASE_URL already set)")
    parser.add_argument("--openai-upstream", metavar="URL", default=None,
                        help="where OpenAI Responses and Chat Completions requests go, with its version: the "
                             "provider, a gateway, a local model (default https://api.openai.com/v1; wrap codex: "
                             "the base URL of Codex's active provider, or OPENAI_BASE_URL)")
    parser.add_argument("--prepare-timeout", type=seconds, default=None, metavar="SECONDS",
                        help="how long the sidecar may take over a request (storing, assembling, a compaction) "
                             "before it goes upstream as the agent sent it (default 60)")
    parser.add_argument("--no-share", dest="share", action="store_false", default=True,
                        help="the sidecar opens the database itself instead of sharing it through its host")
    parser.add_argument("--summarizer", choices=SUMMARIZERS, default="agent",
                        help="who writes the summaries of compacted history: agent (default: the agent's own model, "
                             "called like its requests, with its credentials, which are kept in memory only), "
                             "settings (the llm settings of --settings, else deterministic) or deterministic (no "
                             "model call)")
    parser.add_argument("--summary-model", metavar="MODEL", type=model_name, default=None,
                        help="with --summarizer agent: the model of the summary calls, e.g. a cheaper tier of the "
                             "agent's provider (default: the model of the agent's requests)")


def add_command(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register ``proxy``."""
    proxy = commands.add_parser(
        "proxy", parents=[common], help="assemble every prompt of an agent, as an HTTP proxy",
        description="Listen on 127.0.0.1 for the Anthropic Messages API (POST /v1/messages, count_tokens), the "
                    "OpenAI Responses API (POST /v1/responses) and Chat Completions (POST /v1/chat/completions). "
                    "Each request's new messages are stored through the shared host, the conversation is replaced "
                    "by the sidecar's assembled context (within the model's window, compacted history as "
                    "summaries), and the answer streams back unchanged while it is recorded. Under /anthropic and "
                    "/openai (e.g. ANTHROPIC_BASE_URL=http://127.0.0.1:8787/anthropic) anything else goes to that "
                    "provider untouched; without a prefix, a route of no one API is answered 404. GET /stats "
                    "shows, per session, the tokens the agent sent against those forwarded, the cache hit rate and "
                    "compactions (also: context-sidecar status). API keys pass through from the agent's headers "
                    "and are never stored or logged. Summaries of compacted history are written by the agent's own "
                    "model, called like its latest request (see --summarizer). Ctrl-C stops it.")
    add_options(proxy)


def settings_file(path: str) -> dict[str, Any]:
    """``--settings``: a JSON object in a file (or given inline, or as @FILE, as other commands take it), or
    argparse's error (exit 2)."""
    try:
        text = path if path.lstrip().startswith("{") else \
            Path(path.removeprefix("@")).expanduser().read_text(encoding="utf-8")
        data = json.loads(text)
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {error.strerror}") from None
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{path} is not JSON: {error}") from None
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError(f"{path} must hold a JSON object of settings")
    return data


def model_name(text: str) -> str:
    """``--summary-model``: a model name, or argparse's error (exit 2)."""
    if not text.strip() or text != text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not a model name")
    return text


def seconds(text: str) -> float:
    """``--prepare-timeout``: a positive number of seconds, or argparse's error (exit 2)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds above 0")
    return value


@attrs.define
class ProxyOptions:
    """What the proxy is started with."""

    port: int = DEFAULT_PORT
    """Port on 127.0.0.1; 0 for any free one."""
    db: str | None = None
    """The database (``--db``); None for the per-user file."""
    settings: dict[str, Any] | None = None
    """initialize's options for the sidecar it attaches to."""
    anthropic_upstream: str | None = None
    """Where Anthropic Messages requests go; None for the public API."""
    openai_upstream: str | None = None
    """Where OpenAI requests go, with its version (``…/v1``); None for the public API."""
    share: bool = True
    """Attach to the database's shared host (False: ``--no-share``)."""
    prepare_timeout: float | None = None
    """Seconds the sidecar may take over a request before it goes upstream unmanaged; None for the default."""
    summarizer: str = "agent"
    """Who writes summaries: ``agent`` (its model, through the proxy), ``settings`` (the llm settings) or
    ``deterministic``."""
    summary_model: str | None = None
    """The model of the summary calls on the agent's provider; None for the agent's own."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ProxyOptions:
        """From parsed command-line options."""
        return cls(args.port, getattr(args, "db", None), args.settings, args.anthropic_upstream,
                   args.openai_upstream, args.share, args.prepare_timeout, args.summarizer, args.summary_model)

    def sidecar_settings(self) -> dict[str, Any] | None:
        """The settings the proxy's sidecar connection gets: without ``llm`` when summaries are deterministic."""
        if self.summarizer != "deterministic" or self.settings is None:
            return self.settings
        return {key: value for key, value in self.settings.items() if key != "llm"}


@contextlib.asynccontextmanager
async def running(options: ProxyOptions) -> AsyncIterator[Any]:
    """A listening proxy (its ``App``, with ``port`` set), stopped at the end of the block."""
    import asyncio

    from sidecar.client import SidecarClient
    from sidecar.config.settings import read_settings
    from sidecar.proxy.app import PREPARE_TIMEOUT, App, Upstreams
    from sidecar.proxy.core import Proxy
    from sidecar.proxy.http import start_server
    from sidecar.proxy.routes import Routes, default_adapters
    from sidecar.proxy.stats import Stats
    from sidecar.proxy.summary_calls import SummaryCalls
    from sidecar.proxy.upstream import Upstream

    settings, problems = read_settings(options.sidecar_settings())
    for problem in problems:
        log.warning("--settings: %s", problem)
    level = logging.getLogger().getEffectiveLevel()
    verbose = ["-v"] * (2 if level <= logging.DEBUG else 1 if level <= logging.INFO else 0)
    # The sidecar logs at the proxy's verbosity, into the proxy's log file (its compactions, its summary calls).
    command = [sys.executable, "-P", "-m", "sidecar", *verbose, *([] if options.share else ["--no-share"])]
    # Its stderr goes to the proxy's log file, if there is one; in a session of its own, Ctrl-C on the terminal
    # (which wrap leaves to the agent) does not stop it.
    log_file = next((h.baseFilename for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)),
                    None)

    upstream = Upstream()
    stats = Stats()
    calls = SummaryCalls(upstream, stats, options.summary_model) if options.summarizer == "agent" else None

    def spawn() -> Awaitable[SidecarClient]:
        # Each ingest's reply holds the session's usage: no context/didChangeUsage besides.
        return SidecarClient.spawn(command, db=options.db, settings=options.sidecar_settings(), stderr=log_file,
                                   capabilities={"usageNotifications": False}, new_session=True,
                                   summarize=calls.run if calls is not None else None)

    try:
        client = await spawn()
    except BaseException:
        await upstream.close()
        raise
    routes = Routes(default_adapters())
    upstreams = Upstreams()
    upstreams.anthropic = options.anthropic_upstream or upstreams.anthropic
    upstreams.openai = options.openai_upstream or upstreams.openai
    app = App(Proxy(client, settings, stats, spawn), upstream, upstreams, routes,
              client.capabilities.get("storage"), options.prepare_timeout or PREPARE_TIMEOUT, calls, options.summarizer)
    try:
        server = await start_server(app.handle, HOST, options.port, routes.failure)
    except BaseException:
        await upstream.close()
        await client.close()
        raise
    app.port = server.sockets[0].getsockname()[1]
    check = asyncio.ensure_future(app.proxy.check())  # a database it cannot use is told before the first request
    try:
        yield app
    finally:
        check.cancel()
        server.close()
        await app.proxy.settle()
        await upstream.close()
        await app.proxy.client.close()


def run_proxy(options: ProxyOptions) -> int:
    """Serve until Ctrl-C or SIGTERM; exit 0, or 1 when it cannot start."""
    import asyncio
    import signal

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        try:
            async with running(options) as app:
                print(f"context-sidecar proxy: listening on http://{HOST}:{app.port} (storage {app.storage}); "
                      f"Anthropic → {app.upstreams.anthropic}, OpenAI → {app.upstreams.openai}", file=sys.stderr,
                      flush=True)
                app.proxy.stats.on_problem = lambda problem: print(
                    f"context-sidecar proxy: the sidecar cannot take requests ({problem.message}): they go to the "
                    "provider as the agent sends them (context-sidecar status)", file=sys.stderr, flush=True)
                await stop.wait()
        except OSError as error:
            print(f"context-sidecar proxy: cannot listen on {HOST}:{options.port}: {error.strerror or error}",
                  file=sys.stderr)
            return 1
        print("context-sidecar proxy: stopped", file=sys.stderr)
        return 0

    return asyncio.run(main())
