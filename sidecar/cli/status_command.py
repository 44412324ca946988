"""``context-sidecar status``: the running proxy's figures per session, from its ``GET /stats``."""

from __future__ import annotations

import json
import sys
from typing import Any

from sidecar.cli.proxy_command import DEFAULT_PORT, HOST


def add_command(commands: Any) -> None:
    """Register ``status``."""
    status = commands.add_parser(
        "status", help="the running proxy's figures per session",
        description="Ask the proxy on 127.0.0.1:--port for its figures (GET /stats) and print them per session: "
                    "requests, the tokens the agent sent against those forwarded, the provider's cache hit rate, "
                    "compactions, who wrote the summaries and what the summary calls cost. Exit 1 when no proxy "
                    "answers there.")
    status.add_argument("--port", type=int, default=DEFAULT_PORT, metavar="N",
                        help=f"the proxy's port (default {DEFAULT_PORT})")
    status.add_argument("--json", action="store_true", help="print GET /stats as it is")


def run_status(port: int, as_json: bool) -> int:
    """Print the figures; 1 when no proxy answers."""
    from sidecar.cli.wrap_command import running_proxy
    from sidecar.proxy.stats import summaries_line

    stats = running_proxy(port)
    if stats is None:
        print(f"context-sidecar status: no context-sidecar proxy on {HOST}:{port}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(stats, indent=2))
        return 0
    print(f"context-sidecar proxy on http://{HOST}:{port} (pid {stats['pid']}, up {_duration(stats['uptimeSeconds'])})"
          f", storage {stats['storage']}")
    problem = stats.get("problem")
    if problem:
        state = f"managed again since {problem['resolvedAt']}" if problem.get("resolvedAt") else \
            f"since {problem['since']}"
        print(f"  ! the sidecar could not take requests ({problem['requests']:,} went to the provider as the agent "
              f"sent them, nothing stored; {state}): {problem['message']}")
    sessions = stats["sessions"]
    if not sessions:
        print("  no requests yet")
        return 0
    print(f"  {'session':<40} {'api':<9} {'requests':>8} {'sent':>11} {'forwarded':>11} {'cache hits':>10} "
          f"{'compactions':>11}")
    for entry in sessions:
        rate = entry["cacheHitRate"]
        print(f"  {_short(entry['sessionId']):<40} {entry['provider']:<9} {entry['requests']:>8,} "
              f"{entry['agentTokens']:>11,} {entry['forwardedTokens']:>11,} "
              f"{'-' if rate is None else f'{rate:.1%}':>10} {entry['compactions']:>11,}")
        line = summaries_line(entry)
        if line:
            print(f"    {line}")
    print("  sent, forwarded: estimated tokens of the request bodies (UTF-8 bytes / 4), cache markers left out;\n"
          "    each message goes as first stored (an agent may resend it in another form: a few tokens either way)\n"
          "  cache hits: the provider's cache reads / prompt tokens")
    return 0


def _short(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _duration(seconds: float) -> str:
    minutes, second = divmod(int(seconds), 60)
    hours, minute = divmod(minutes, 60)
    return f"{hours}h{minute:02d}m" if hours else f"{minute}m{second:02d}s"
