"""The `context-sidecar` command line: its subcommands and what they share."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from protocol.types import Usage
    from sidecar.client import SidecarClient, SidecarRequestError

SERVER_COMMAND = [sys.executable, "-P", "-m", "sidecar"]
_server_logging: list[str] = []
"""The ``-v`` and ``--log-file`` a tool was given, passed on to the sidecar it spawns."""


def log_server_like_the_tool(verbose: int, log_file: str | None) -> None:
    """Let the sidecars the tools spawn log as the tool was told to; otherwise they log nowhere."""
    _server_logging[:] = (["-" + "v" * min(verbose, 2)] if verbose else []) + (["--log-file", log_file]
                                                                               if log_file else [])


async def spawn_server(db: str | None, settings: dict[str, Any]) -> SidecarClient:
    """The sidecar a tool talks to. Its errors reach the tool as replies, which the tool reports in one line; its
    log (the same errors again, as warnings) goes where ``-v``/``--log-file`` say, else nowhere."""
    import subprocess

    from sidecar.client import SidecarClient

    quiet = subprocess.DEVNULL if not _server_logging else None
    return await SidecarClient.spawn(command=[*SERVER_COMMAND, *_server_logging], db=db, settings=settings,
                                     stderr=quiet)


def usage_text(usage: Usage) -> str:
    """One usage figure as a person reads it."""
    hint = f" — {usage.hint}" if usage.hint else ""
    return (f"{usage.tokens:,} tokens of {usage.context_window:,} ({usage.percent:.1f}%), "
            f"state {usage.state}, {usage.source}{hint}")


def plural(count: int, word: str, many: str | None = None) -> str:
    """``1 message``, ``2 messages``."""
    return f"{count:,} {word if count == 1 else many or word + 's'}"


def say(text: str = "") -> None:
    """Print a line now (the output is often piped)."""
    print(text, flush=True)


def report_error(tool: str, error: SidecarRequestError) -> int:
    """A request's error as the tool's one line on stderr; the exit code 1."""
    from sidecar.client import SidecarConnectionLost

    more = "" if _server_logging or not isinstance(error, SidecarConnectionLost) else \
        " (run again with -v to see the sidecar's log)"
    print(f"context-sidecar {tool}: error: {error.message}{more}", file=sys.stderr)
    return 1
