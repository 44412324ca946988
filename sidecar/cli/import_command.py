"""``context-sidecar import``: store a transcript file through a real sidecar's ``memory/import``."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import sys
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path

from protocol.types import ImportResult
from sidecar.agents.follow import Follower, NothingYet, Step, nothing_yet
from sidecar.cli import plural, report_error, say, spawn_server, usage_text
from sidecar.client import SidecarClient, SidecarRequestError

# Importing stores history; compacting it is for the next agent or editor session that uses it.
SETTINGS = {"compaction": {"auto": False}}
GROUPED = 3
"""Skip reasons shared by more lines than this are printed once, with the line numbers."""


def run_import(path: str, db: str | None, session: str | None, fmt: str, follow: bool = False) -> int:
    """Import one transcript (or follow it until Ctrl-C); returns the exit code."""
    target = Path(path).expanduser().resolve()
    try:
        if follow:
            return asyncio.run(_follow(target, db, session, fmt))
        return asyncio.run(_import(target, db, session, fmt))
    except SidecarRequestError as error:
        return report_error("import", error)
    except KeyboardInterrupt:
        say("context-sidecar import: stopped")
        return 0


async def _import(path: Path, db: str | None, session: str | None, fmt: str) -> int:
    async with await spawn_server(db, SETTINGS) as client:
        result = await client.import_transcript(str(path), session_id=session, format=fmt)
        storage = client.capabilities.get("storage")
        pid = client.process.pid if client.process else "?"
    replaced = result.replaced or 0
    stored = len(result.ids) - result.duplicates - replaced
    say(f"context-sidecar import: {path.name} ({result.format}) into session {result.session_id}")
    say(f"  storage: {storage} (sidecar pid {pid})")
    say(f"  {plural(stored, 'message')} stored, {result.duplicates:,} already in the session, "
        + (f"{replaced:,} updated, " if replaced else "") + f"{plural(len(result.skipped), 'line')} skipped")
    for line in skip_lines(result.skipped):
        say(f"  skipped {line}")
    say(f"  usage: {usage_text(result.usage)}")
    return 0


async def _follow(path: Path, db: str | None, session: str | None, fmt: str) -> int:
    if not path.parent.is_dir():
        print(f"context-sidecar import: error: no directory {path.parent}", file=sys.stderr)
        return 1
    # A terminal's Ctrl-C reaches the whole process group: the sidecar is to end when we shut it down, after
    # the last import, not in the middle of one, so it starts with SIGINT ignored.
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        spawning = spawn_server(db, SETTINGS)
        client = await spawning
    finally:
        signal.signal(signal.SIGINT, handler)
    stop = asyncio.Event()
    async with client:
        await client.sessions()  # opens the database now, so the first entry is not kept waiting for it
        follower = Follower(client_importer(client), path, session, fmt)
        say(f"context-sidecar import: following {path} (Ctrl-C stops)")
        say(f"  storage: {client.capabilities.get('storage')}")
        _stop_on_ctrl_c(stop)
        await follower.run(lambda step: _report(follower, step), stop=stop)
    say("context-sidecar import: stopped")
    return 0


def client_importer(client: SidecarClient) -> Callable[[Path, str | None, str], Awaitable[ImportResult]]:
    """The follower's import through a client's ``memory/import``."""

    async def run(path: Path, session: str | None, fmt: str) -> ImportResult:
        try:
            return await client.import_transcript(str(path), session, fmt, follow=True)
        except SidecarRequestError as error:
            if nothing_yet(error.message):
                raise NothingYet(error.message) from None
            raise

    return run


def _stop_on_ctrl_c(stop: asyncio.Event) -> None:
    """The first Ctrl-C sets ``stop``, so the import under way ends first; a second one interrupts at once.

    Not when SIGINT was ignored at start (a job a non-interactive shell started in the background): as for any
    command, the terminal's Ctrl-C is then not meant for it.
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        return
    loop = asyncio.get_running_loop()

    def first() -> None:
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    with contextlib.suppress(NotImplementedError):  # no loop signal handlers here: Ctrl-C cancels as asyncio does
        loop.add_signal_handler(signal.SIGINT, first)


def _report(follower: Follower, step: Step) -> None:
    """One line per change: what was stored, then new skip reasons and what happened to the file."""
    for note in step.notes:
        say(f"  {note}")
    if step.stored or step.replaced:
        usage = follower.last.usage if follower.last else None
        figure = f"; {usage.tokens:,} tokens ({usage.percent:.1f}%)" if usage else ""
        say(f"  +{plural(step.stored, 'message')}" + (f", {step.replaced:,} updated" if step.replaced else "")
            + f" in session {follower.session}{figure}")
    for line in skip_lines(step.skipped):
        say(f"  skipped {line}")


def skip_lines(reasons: list[str]) -> list[str]:
    """Skip reasons in file order; a reason shared by many lines is printed once with their numbers."""
    by_reason: dict[str, list[int]] = defaultdict(list)
    others: list[str] = []
    for reason in reasons:
        match = re.match(r"line (\d+): (.*)$", reason, re.DOTALL)
        if match:
            by_reason[match.group(2)].append(int(match.group(1)))
        else:
            others.append(reason)
    out: list[tuple[int, str]] = []
    for reason, numbers in by_reason.items():
        if len(numbers) > GROUPED:
            shown = ", ".join(str(n) for n in numbers[:8]) + (", …" if len(numbers) > 8 else "")
            out.append((numbers[0], f"{len(numbers)} lines ({shown}): {reason}"))
        else:
            out.extend((n, f"line {n}: {reason}") for n in numbers)
    return [text for _, text in sorted(out)] + others
