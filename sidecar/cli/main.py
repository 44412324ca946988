"""The ``context-sidecar`` command: serve JSON-RPC on stdio, or run one of the tools."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from sidecar import __version__
from sidecar.config.defaults import DEFAULT_MEMORY_LIMIT

if TYPE_CHECKING:
    from sidecar.cli.prompt_cache import Prices

DESCRIPTION = """\
Context management for LLM coding tools, spoken to over JSON-RPC on stdio (LSP framing).
With no command it serves the protocol on stdin/stdout; logs go to stderr or --log-file.

commands:
  demo      run a generated coding session through a real sidecar and show what it keeps
  import    store a pi, Claude Code, Codex or OpenAI JSON transcript in the database (memory/import)
  replay    walk a transcript through a real sidecar turn by turn, with auto-compaction, and show the timeline
  wrap      run Claude Code or Codex through the proxy: context-sidecar wrap claude [ARGS]
  status    the running proxy's figures per session (GET /stats)
  proxy     an HTTP proxy for Claude Code, Codex and other agents that assembles every prompt they send
  hook      run as a Claude Code hook: keep its transcript and rules across Claude Code's own compaction
  setup     add context-sidecar's memory tools (and, for Claude Code, its hooks) to Claude Code's or Codex's config
  host      serve one database to every context-sidecar on it (started on demand; see docs/sharing.md)
  mcp       an MCP server on stdio giving Claude Code, Codex, … the memory tools over their workspace's sessions
  db        a team database: migrate its schema (its owner), copy sessions between a file and it
  team      who reads which project's sessions in a team database: grant, revoke, list (its owner)

Sharing: the first context-sidecar on a database file starts a host process for it, listening on a Unix
socket in a per-user directory ($XDG_RUNTIME_DIR/context-sidecar, /run/user/UID/context-sidecar or
/tmp/context-sidecar-UID); every context-sidecar on that file relays its stdio to the host, so editors
and agents see the same sessions.
--no-share (or the setting storage.share: false) opens the database in this process instead; ':memory:'
is never shared.

Logs: stderr, or --log-file. Through a host, the host also writes the lines of your connection (at your -v)
to your --log-file, marked [host]; its own log is <hash>.log beside its socket, removed when it exits
without an error.
"""
TYPED_DB = ("demo", "import", "replay", "setup", "proxy", "wrap")
"""Commands whose --db is refused at once (exit 2) when its directory is missing. The server, mcp and hook, which
agents and editors start, report it as the storage error of each request instead (a hook must exit 0)."""
FORMAT_CHOICES = ["auto", "pi", "claude-code", "codex", "openai"]
DB_HELP = ("DuckDB file to use, in a directory that exists (':memory:' for none), or a team's PostgreSQL server as "
           "postgresql://USER@HOST:PORT/DB (password from PGPASSWORD or ~/.pgpass); default: $CONTEXT_SIDECAR_DB, else "
           "one per-user file for every workspace")
ALL = "*"
"""``build_parser``'s every command."""


def common_options(db_help: str = DB_HELP, command: bool = False) -> argparse.ArgumentParser:
    """--db, --log-file and -v, accepted before and after a command."""
    # A command's own defaults would overwrite what was given before the command name (--db X demo).
    common = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS if command else None)
    common.add_argument("--db", metavar="PATH|URL", help=db_help)
    common.add_argument("--log-file", metavar="PATH", help="write logs here instead of stderr")
    verbose = common.add_argument("-v", "--verbose", action="count", help="more logging (-vv for debug)")
    if not command:
        verbose.default = 0
    return common


def build_parser(command: str | None = ALL) -> argparse.ArgumentParser:
    """The command line; given a ``command``, the parser of that one only (``None``: of none, to serve), so that
    a start imports no other command's module (an agent waits for ``mcp`` and ``hook``)."""
    common = common_options()
    in_command = common_options(command=True)

    parser = argparse.ArgumentParser(prog="context-sidecar", description=DESCRIPTION, parents=[common],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"context-sidecar {__version__}")
    serving_options(parser)
    commands = parser.add_subparsers(dest="command", metavar="command")
    for names, add in COMMANDS:
        if command == ALL or command in names:
            add(commands, in_command)
    return parser


def serving_options(parser: argparse.ArgumentParser) -> None:
    """The options of serving (no command), before any command."""
    parser.add_argument("--stdio", action="store_true", help="serve on stdin/stdout (the default)")
    parser.add_argument("--no-share", dest="share", action="store_false",
                        help="open the database in this process instead of sharing it through a host")
    parser.add_argument("--clientProcessId", "--client-process-id", dest="client_process_id", type=int,
                        metavar="PID", help="exit when this process ends (sent by editor clients)")


class _ScanError(Exception):
    """The command line is wrong: the whole parser will say how."""


class _Scanner(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _ScanError(message)


def command_named(argv: Sequence[str]) -> str | None:
    """The command ``argv`` runs, ``None`` to serve, or ``ALL`` (help, the version, a mistake): which parsers
    ``build_parser`` must make. The same options as the whole parser, so that --db VALUE is never taken for a
    command."""
    scan = _Scanner(add_help=False, parents=[common_options()])
    serving_options(scan)
    scan.add_argument("-h", "--help", "--version", dest="everything", action="store_true")
    scan.add_argument("command", nargs="?")
    try:
        known, _ = scan.parse_known_args(argv)
    except _ScanError:
        return ALL
    if known.everything or (known.command is not None and not any(known.command in n for n, _ in COMMANDS)):
        return ALL
    return known.command


def _add_demo(commands: Any, in_command: argparse.ArgumentParser) -> None:
    """``demo``."""
    demo = commands.add_parser("demo", parents=[in_command], help="run the demo session",
                               description="Spawn the real sidecar over stdio, feed it a generated coding-agent "
                                           "session, and print usage, an assembled context and a search hit.")
    demo.add_argument("--messages", type=positive_int, default=240,
                      help="messages in the generated session, at least 1 (default 240)")


def _add_import(commands: Any, in_command: argparse.ArgumentParser) -> None:
    """``import``."""
    imp = commands.add_parser(
        "import", parents=[in_command], help="import a transcript file",
        description="Spawn a sidecar on --db (default: the per-user database) and store the transcript with "
                    "memory/import, as one atomic batch. Lines that are not valid entries are reported with their "
                    "line numbers and skipped; importing the same file again stores nothing twice.")
    imp.add_argument("file", metavar="FILE", help="transcript: pi or Claude Code session JSONL, Codex rollout, "
                                                  "or OpenAI messages JSON/JSONL")
    imp.add_argument("--session", metavar="ID", help="session id (default: the transcript's own, or the file name)")
    imp.add_argument("--format", choices=FORMAT_CHOICES, default="auto", help="transcript format (default auto)")
    imp.add_argument("--follow", action="store_true",
                     help="keep watching FILE as an agent writes it (pi, Claude Code, Codex) and import each new "
                          "entry within a second; a deleted file is waited for; Ctrl-C stops (exit 0)")


def _add_replay(commands: Any, in_command: argparse.ArgumentParser) -> None:
    """``replay``."""
    from protocol import methods  # for its modes: loading the protocol's types is no start's business

    replay_db = "DuckDB file to keep the replayed session in; default: a fresh temporary file, removed afterwards"
    replay = commands.add_parser(
        "replay", parents=[common_options(replay_db, command=True)], help="replay a transcript turn by turn",
        description="Parse the transcript here, spawn a real sidecar on --db (default: a fresh temporary database, "
                    "removed afterwards) with auto-compaction on, and feed it turn by turn as an agent would: "
                    "ingest the user message, then per step context/assemble, report the provider usage the "
                    "transcript recorded, ingest the step; each compaction ends before the next message, so a "
                    "transcript gives the same timeline every run. Prints a timeline (usage, state changes, "
                    "compactions) and a summary table, with the prompt cache figures: the share of each turn's "
                    "prompt that repeats the previous prompt's leading messages byte for byte (billed as a cache "
                    "read, the rest as a cache write) and the input cost under --prices.")
    replay.add_argument("file", metavar="FILE", help="transcript file, as for import")
    replay.add_argument("--session", metavar="ID", help="session id (default: the transcript's own, or the file "
                                                        "name); must be new in --db")
    replay.add_argument("--format", choices=FORMAT_CHOICES, default="auto", help="transcript format (default auto)")
    replay.add_argument("--context-window", type=int, metavar="N",
                        help="context window of the session (default: the transcript model's, else 128000)")
    replay.add_argument("--mode", choices=methods.COMPACTION_MODES, default="incremental",
                        help="auto-compaction mode (default incremental)")
    replay.add_argument("--report-usage", choices=["auto", "always", "never"], default="auto",
                        help="send the provider usage recorded in the transcript: auto (default) while the sidecar "
                             "sends the transcript's own context, i.e. until it prunes or compacts; always; never")
    replay.add_argument("-q", "--quiet", action="store_true",
                        help="timeline lines only for state changes and compactions")
    replay.add_argument("--prices", type=price_table, default=None, metavar="read=R,write=W,input=I",
                        help="price per prompt token for the input-cost figures, relative to an uncached token: "
                             "cache read, cache write, and plain input (default read=0.1,write=1.25,input=1, "
                             "Anthropic's 5-minute cache); any subset, each a number >= 0. The sidecar weighs its "
                             "prune steps at the same read and write prices")
    replay.add_argument("--settings", type=settings_object, default=None, metavar="JSON",
                        help="more sidecar settings, merged section by section over the replay's own, e.g. "
                             "'{\"compaction\": {\"freshTail\": 8}}' (docs/configuration.md lists them)")
    replay.add_argument("--compare-prune-off", action="store_true",
                        help="replay again with pruning off (prune.enabled false, a fresh temporary DB) and print "
                             "its prefix hits, input cost, and the cost ratio of pruning on / off")


def _add_proxy(commands: Any, in_command: argparse.ArgumentParser) -> None:
    """``proxy``: its module defines it (argparse only; the proxy itself loads when it runs)."""
    from sidecar.cli.proxy_command import add_command

    add_command(commands, in_command)


def _add_wrap(commands: Any, in_command: argparse.ArgumentParser) -> None:
    """``wrap``, defined in its module."""
    from sidecar.cli.wrap_command import add_command

    add_command(commands, in_command)


def _add_status(commands: Any, in_command: argparse.ArgumentParser) -> None:
    """``status``, defined in its module."""
    from sidecar.cli.status_command import add_command

    add_command(commands)


def _add_team(commands: Any, in_command: argparse.ArgumentParser) -> None:
    """``db`` and ``team``, defined in their module."""
    from sidecar.cli.team_command import add_commands

    add_commands(commands, in_command)


def _add_hook(commands: Any, in_command: argparse.ArgumentParser) -> None:
    """``hook``."""
    hook = commands.add_parser(
        "hook", parents=[in_command], help="run as a Claude Code hook (setup installs it)",
        description="Read a Claude Code hook's JSON on stdin and act on it through the shared host: PreCompact imports "
                    "the transcript to its last line; SessionStart (source compact) prints additionalContext with the "
                    "session's standing rules and the files it modified and read; PostCompact records Claude Code's "
                    "summary with the session. It always exits 0 within 20 s: a problem (bad input, an unknown event, "
                    "a missing transcript, no host) is one line on stderr and in the log (--log-file, default "
                    "hook.log in the per-user log directory), and Claude Code goes on.")
    hook.add_argument("agent", metavar="AGENT", help="the agent whose hook this is: claude-code")


def _add_setup(commands: Any, in_command: argparse.ArgumentParser) -> None:
    """``setup``."""
    setup = commands.add_parser(
        "setup", parents=[in_command], help="add the memory tools to Claude Code or Codex",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Write context-sidecar's MCP server (the memory tools) into the agent's own user config, and for Claude Code
its compaction hooks too, so that every session of the agent, claude -p and codex exec included, has them.
Everything else in those files keeps its bytes; running it again changes nothing; it prints what it changed.""",
        epilog="""\
claude-code: ~/.claude.json (under $CLAUDE_CONFIG_DIR if set): mcpServers.context-sidecar;
  ~/.claude/settings.json: hooks PreCompact, SessionStart (matcher compact), PostCompact running
  'context-sidecar hook claude-code', and permissions.allow mcp__context-sidecar (Claude Code runs the memory
  tools, which only read, without asking; claude -p calls no tool without a permission; --no-allow leaves it
  out). --project: .mcp.json and .claude/settings.json (plus enabledMcpjsonServers);
  Claude Code reads them in a folder you trust.
codex: $CODEX_HOME/config.toml (default ~/.codex): [mcp_servers.context-sidecar] with required = true
  (codex exec waits for no optional server) and startup_timeout_sec = 30, run through /bin/sh so that a
  broken install (moved, its Python gone) starts a stand-in with no tools instead of stopping Codex (run
  --remove before you uninstall), default_tools_approval_mode = "approve" (codex exec asks no one) and
  env_vars (XDG_RUNTIME_DIR, XDG_DATA_HOME, XDG_STATE_HOME, CODEX_HOME, CLAUDE_CONFIG_DIR, pi's: Codex
  passes an MCP server few variables of its own). --project: .codex/config.toml, which Codex reads in a trusted project.
A file that is not valid JSON or TOML, or holds one of these keys with another type, is refused: nothing
is written and the exit code is 1. --db PATH is passed on to the server and the hooks. What setup created is
recorded in $XDG_STATE_HOME/context-sidecar/setup.json (default ~/.local/state), so that --remove takes out
no key or file the user had.""")
    setup.add_argument("agent", choices=["claude-code", "codex"], help="the agent to set up")
    setup.add_argument("--project", nargs="?", const=".", metavar="DIR",
                       help="write the project's files in DIR (default: this folder) instead of the user config")
    setup.add_argument("--dry-run", action="store_true", help="print the change as a diff and write nothing")
    setup.add_argument("--no-allow", dest="allow", action="store_false",
                       help="claude-code: leave out (or take out) permissions.allow mcp__context-sidecar, so that "
                            "Claude Code asks before each memory tool call; claude -p then runs them only with "
                            "--allowedTools mcp__context-sidecar")
    setup.add_argument("--remove", action="store_true",
                       help="take out exactly what setup adds (the server, its hooks and permission entries), "
                            "and the keys and files it created for them once they are empty")


def _add_host(commands: Any, in_command: argparse.ArgumentParser) -> None:
    """``host``."""
    host = commands.add_parser(
        "host", parents=[in_command], help="serve a database to relays (started on demand)",
        description="Open --db and serve it on a Unix socket to every context-sidecar relaying to it; exit, with "
                    "a checkpoint, --linger seconds after the last connection closed. Relays start it by themselves; "
                    "prints 'ready PID' (or 'error CODE MESSAGE') on stdout once it listens (or cannot).")
    host.add_argument("--socket", required=True, metavar="PATH", help="where to listen")
    host.add_argument("--linger", type=float, default=5.0, metavar="SECONDS",
                      help="seconds to stay up without connections (default 5)")
    host.add_argument("--memory-limit", default=DEFAULT_MEMORY_LIMIT, metavar="SIZE",
                      help=f"DuckDB memory_limit (default {DEFAULT_MEMORY_LIMIT})")


def _add_mcp(commands: Any, in_command: argparse.ArgumentParser) -> None:
    """``mcp``."""
    mcp = commands.add_parser(
        "mcp", parents=[in_command], help="serve the memory tools to an agent over MCP (stdio)",
        description="Serve MCP on stdin/stdout (newline-delimited JSON-RPC) for a coding agent: the tools memory_grep, "
                    "memory_describe, memory_expand and memory_query over every session of the client's workspace (its "
                    "first MCP root, else this directory), the agent's current session first. It reaches the "
                    "database through its shared host like every client; logs go to stderr or --log-file.")
    mcp.add_argument("--settings", type=settings_object, metavar="JSON",
                     help="settings for this client's connection (a JSON object), e.g. the summarizer memory_query "
                          "answers with: '{\"llm\": {\"model\": \"gpt-4o-mini\"}}'")


COMMANDS: tuple[tuple[tuple[str, ...], Callable[[Any, argparse.ArgumentParser], None]], ...] = (
    (("demo",), _add_demo), (("import",), _add_import), (("replay",), _add_replay), (("proxy",), _add_proxy),
    (("wrap",), _add_wrap), (("status",), _add_status), (("db", "team"), _add_team), (("hook",), _add_hook),
    (("setup",), _add_setup), (("host",), _add_host), (("mcp",), _add_mcp))
"""The commands in the order --help lists them, each with what adds its parser."""


def positive_int(text: str) -> int:
    """A whole number of at least 1, or argparse's error (exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def settings_object(text: str) -> dict[str, Any]:
    """``--settings``: a JSON object, or argparse's error (exit 2) saying what is wrong."""
    try:
        value = json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"a JSON object of settings is needed, not {type(value).__name__}")
    return value


def price_table(text: str) -> Prices:
    """``--prices``: a price table, or argparse's error (exit 2) saying what is wrong."""
    from sidecar.cli.prompt_cache import parse_prices  # not imported when serving: start-up time

    try:
        return parse_prices(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def configure_logging(verbosity: int, log_file: str | None) -> None:
    """Logs to stderr or a file, never stdout; no database password in them."""
    from sidecar.config.database import PasswordMask

    level = logging.WARNING - 10 * min(verbosity, 2)
    handler: logging.Handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.addFilter(PasswordMask())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    # pygls logs whole message bodies at INFO; session content stays out of logs below -vv.
    logging.getLogger("pygls").setLevel(logging.DEBUG if verbosity >= 2 else logging.WARNING)


STDOUT_FD = 1
"""The process's stdout, whatever ``sys.stdout`` is now (serving points it at stderr)."""
CLOSED_PIPE_EXIT = 128 + 13
"""The exit status when stdout's reader went away (``| head``): a shell's for a tool SIGPIPE ended."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``context-sidecar``: a reader that closes stdout early (``| head``) ends it quietly."""
    try:
        try:
            return run_command(argv)
        finally:
            sys.stdout.flush()  # here, where a closed pipe is caught, not at exit
    except BrokenPipeError:
        # Python flushes stdout again at exit: what is left in its buffer goes nowhere instead of a second error.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), STDOUT_FD)
        return CLOSED_PIPE_EXIT


def run_command(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run the command (or serve)."""
    args = build_parser(command_named(sys.argv[1:] if argv is None else argv)).parse_args(argv)
    if args.command in TYPED_DB and args.db:
        from sidecar.config.paths import missing_directory

        missing = missing_directory(args.db)
        if missing:
            print(f"context-sidecar {args.command}: error: --db {args.db}: {missing}", file=sys.stderr)
            return 2
    try:
        configure_logging(args.verbose, args.log_file)
    except OSError as error:
        if args.command != "hook":  # a hook goes on whatever happens; it writes its own log (hook.log)
            print(f"context-sidecar{' ' + args.command if args.command else ''}: error: --log-file {args.log_file}: "
                  f"{error.strerror or error}", file=sys.stderr)
            return 2
        configure_logging(args.verbose, None)
    if args.command in ("demo", "import", "replay"):
        from sidecar.cli import log_server_like_the_tool

        log_server_like_the_tool(args.verbose or 0, args.log_file)
    if args.command == "demo":
        from sidecar.cli.demo import run_demo

        return run_demo(db=args.db, messages=args.messages)
    if args.command == "import":
        from sidecar.cli.import_command import run_import

        return run_import(args.file, db=args.db, session=args.session, fmt=args.format, follow=args.follow)
    if args.command == "replay":
        from sidecar.cli.replay import run_replay

        return run_replay(args.file, db=args.db, session=args.session, fmt=args.format,
                          context_window=args.context_window, mode=args.mode, quiet=args.quiet,
                          report_usage=args.report_usage, prices=args.prices,
                          compare_prune_off=args.compare_prune_off, settings=args.settings)
    if args.command == "mcp":
        from sidecar.mcp.stdio import run

        return run(db=args.db, settings=args.settings, log_file=args.log_file, verbose=args.verbose)
    if args.command == "hook":
        from sidecar.cli.hook import run_hook

        return run_hook(args.agent, db=args.db, log_file=args.log_file)
    if args.command == "setup":
        from sidecar.cli.setup import run_setup

        if not args.allow and args.agent != "claude-code":
            print("context-sidecar setup: error: --no-allow is for claude-code (Codex's approval of the tools is "
                  "default_tools_approval_mode in its entry)", file=sys.stderr)
            return 2
        return run_setup(args.agent, args.project, args.dry_run, args.remove, args.db, args.allow)
    if args.command == "proxy":
        from sidecar.cli.proxy_command import ProxyOptions, run_proxy

        return run_proxy(ProxyOptions.from_args(args))
    if args.command == "wrap":
        from sidecar.cli.proxy_command import ProxyOptions as WrapOptions
        from sidecar.cli.wrap_command import default_log, run_wrap

        if not args.log_file:
            default_log().parent.mkdir(parents=True, exist_ok=True)
            configure_logging(args.verbose, str(default_log()))
        given = any(arg == "--port" or arg.startswith("--port=") for arg in (argv or sys.argv[1:]))
        return run_wrap(WrapOptions.from_args(args), args.agent, args.args, given)
    if args.command == "db":
        from sidecar.cli.team_command import run_db

        return run_db(args)
    if args.command == "team":
        from sidecar.cli.team_command import run_team

        return run_team(args)
    if args.command == "status":
        from sidecar.cli.status_command import run_status

        return run_status(args.port, args.json)
    if args.command == "host":
        if not args.db:
            build_parser().error("host needs --db")
        from sidecar.rpc import host

        return host.main(args.db, args.socket, args.linger, args.memory_limit)
    return serve(args.db, args.client_process_id, args.share, args.verbose, args.log_file)


def serve(db: str | None, client_process_id: int | None, share: bool = True, verbose: int = 0,
          log_file: str | None = None) -> int:
    """Serve the protocol on stdio until ``exit``, relaying to the database's host when it is shared."""
    from sidecar.config.sockets import database_key
    from sidecar.rpc import startup as early_start

    stdout = sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must never corrupt the protocol stream
    stdin = sys.stdin.buffer.fileno()
    if not share or db == ":memory:" or os.name == "nt":
        early = early_start.start(stdin, stdout, db)
    else:
        early = early_start.read_first(stdin, None)
        wanted = early_start.storage_of(early.frames[0].message, db) if early.frames else None
        if wanted is not None and wanted[2] and wanted[0] != ":memory:":
            from sidecar.rpc import relay

            log_args = ["-" + "v" * verbose] if verbose else []
            log_to = {"logFile": os.path.abspath(log_file), "verbose": verbose} if log_file else None

            def answer() -> tuple[Any, Any] | None:
                # As the host will: it names the database by its real path.
                early_start.answer(early, stdout, database_key(wanted[0]))
                return (early.frames[0].message["id"], early.answered) if early.answered is not None else None

            code = relay.serve(bytes(early.raw), wanted[0], wanted[1], log_args, client_process_id, log_to, answer)
            if code is not None:
                return code
        early_start.preload()
        if early.answered is None:
            early = early_start.answer(early, stdout, db)

    import asyncio

    from sidecar.rpc.handlers import setup  # waits for the thread importing it
    from sidecar.rpc.server import SidecarServer
    from sidecar.services.state import Sidecar

    server = SidecarServer(Sidecar(storage_path=db))
    setup(server)
    # What start-up built (lsprotocol's classes and their functions) lives as long as the process:
    # moved out of the collector's reach, full collections no longer walk it on every request burst.
    gc.freeze()

    async def run() -> int:
        if client_process_id:
            asyncio.get_running_loop().create_task(_watch_parent(client_process_id))
        return await server.serve(sys.stdin.buffer, stdout, early)

    try:
        return asyncio.run(run())
    finally:
        gc.unfreeze()  # let the last collection see DuckDB's objects, or its bindings report them as leaked


async def _watch_parent(pid: int) -> None:
    """Exit when the client process is gone, as LSP servers do."""
    import asyncio

    while True:
        await asyncio.sleep(2)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            logging.getLogger(__name__).warning("client process %d is gone; exiting", pid)
            os._exit(1)
        except PermissionError:
            pass
