"""``context-sidecar import``: store a transcript file through a real sidecar's ``memory/import``."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

from sidecar.client import SidecarClient, SidecarRequestError
from sidecar.tools import SERVER_COMMAND, plural, say, usage_text

# Importing stores history; compacting it is for the next agent or editor session that uses it.
SETTINGS = {"compaction": {"auto": False}}


def run_import(path: str, db: str | None, session: str | None, fmt: str) -> int:
    """Import one transcript; returns the exit code."""
    try:
        return asyncio.run(_import(Path(path).expanduser().resolve(), db, session, fmt))
    except SidecarRequestError as error:
        print(f"context-sidecar import: error: {error}", file=sys.stderr)
        return 1


async def _import(path: Path, db: str | None, session: str | None, fmt: str) -> int:
    async with await SidecarClient.spawn(command=SERVER_COMMAND, db=db, settings=SETTINGS) as client:
        result = await client.import_transcript(str(path), session_id=session, format=fmt)
        storage = client.capabilities.get("storage")
        pid = client.process.pid if client.process else "?"
    stored = len(result.ids) - result.duplicates
    say(f"context-sidecar import: {path.name} ({result.format}) into session {result.session_id}")
    say(f"  storage: {storage} (sidecar pid {pid})")
    say(f"  {plural(stored, 'message')} stored, {result.duplicates:,} already in the session, "
        f"{plural(len(result.skipped), 'line')} skipped")
    for reason in sorted(result.skipped, key=_line_number):
        say(f"  skipped {reason}")
    say(f"  usage: {usage_text(result.usage)}")
    return 0


def _line_number(reason: str) -> int:
    """The line a skip reason names ("line 12: ..."), for listing them in file order."""
    match = re.match(r"line (\d+)", reason)
    return int(match.group(1)) if match else sys.maxsize
