"""The ``context-sidecar`` command: serve JSON-RPC on stdio, or run one of the tools."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence

from sidecar import __version__

DESCRIPTION = """\
Context management for LLM coding tools, spoken to over JSON-RPC on stdio (LSP framing).
With no command it serves the protocol on stdin/stdout; logs go to stderr or --log-file.

commands:
  demo      run a generated coding session through a real sidecar and show what it keeps
"""


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", metavar="PATH",
                        help="DuckDB file to use (':memory:' for none); default: per-user data dir, per workspace")
    common.add_argument("--log-file", metavar="PATH", help="write logs here instead of stderr")
    common.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")

    parser = argparse.ArgumentParser(prog="context-sidecar", description=DESCRIPTION, parents=[common],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"context-sidecar {__version__}")
    parser.add_argument("--stdio", action="store_true", help="serve on stdin/stdout (the default)")
    parser.add_argument("--clientProcessId", "--client-process-id", dest="client_process_id", type=int,
                        metavar="PID", help="exit when this process ends (sent by editor clients)")
    commands = parser.add_subparsers(dest="command", metavar="command")
    demo = commands.add_parser("demo", parents=[common], help="run the demo session",
                               description="Spawn the real sidecar over stdio, feed it a generated coding-agent "
                                           "session, and print usage, an assembled context and a search hit.")
    demo.add_argument("--messages", type=int, default=240, help="messages in the generated session (default 240)")
    return parser


def configure_logging(verbosity: int, log_file: str | None) -> None:
    """Logs to stderr or a file, never stdout."""
    level = logging.WARNING - 10 * min(verbosity, 2)
    handler: logging.Handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    # pygls logs whole message bodies at INFO; session content stays out of logs below -vv.
    logging.getLogger("pygls").setLevel(logging.DEBUG if verbosity >= 2 else logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``context-sidecar``."""
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose, args.log_file)
    if args.command == "demo":
        from sidecar.demo import run_demo

        return run_demo(db=args.db, messages=args.messages)
    return serve(args.db, args.client_process_id)


def serve(db: str | None, client_process_id: int | None) -> int:
    """Serve the protocol on stdio until ``exit``; returns the exit code."""
    from sidecar.core import Sidecar
    from sidecar.features import setup
    from sidecar.server import SidecarServer

    stdout = sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must never corrupt the protocol stream
    server = SidecarServer(Sidecar(storage_path=db))
    setup(server)

    async def run() -> int:
        if client_process_id:
            asyncio.get_running_loop().create_task(_watch_parent(client_process_id))
        return await server.serve(sys.stdin.buffer, stdout)

    return asyncio.run(run())


async def _watch_parent(pid: int) -> None:
    """Exit when the client process is gone, as LSP servers do."""
    while True:
        await asyncio.sleep(2)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            logging.getLogger(__name__).warning("client process %d is gone; exiting", pid)
            os._exit(1)
        except PermissionError:
            pass
