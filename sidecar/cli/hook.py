"""``context-sidecar hook claude-code``: Claude Code's compaction hooks, as a client of the shared host.

- ``PreCompact``: import the transcript to its last line, so nothing Claude Code is about to compact is missing.
  (It sends no ``memory/watch``: a watch lasts as long as its connection, and the MCP server keeps one.)
- ``SessionStart`` with source ``compact``: print ``additionalContext`` holding the session's standing rules and
  the files it modified and read (``memory/rules``), so they survive Claude Code's own compaction.
- ``PostCompact``: record Claude Code's ``compact_summary`` with the session (``memory/recordCompaction``).

A hook never blocks or breaks the agent: whatever goes wrong, it exits 0 within ``DEADLINE`` seconds and says why
in one line on stderr and in its log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import select
import sys
import time
from pathlib import Path
from typing import IO, Any

from protocol import errors as codes
from protocol import methods
from protocol import types as t
from sidecar.cli import SERVER_COMMAND
from sidecar.client import SidecarClient, SidecarRequestError
from sidecar.config.database import PasswordMask

log = logging.getLogger("context-sidecar.hook")

AGENTS = ("claude-code",)
EVENTS = ("PreCompact", "SessionStart", "PostCompact")
DEADLINE = 20.0
"""Seconds a hook may take in all; Claude Code waits for it (setup gives Claude Code's own timeout some room)."""
STDIN_WAIT = 5.0
"""Seconds to wait for Claude Code's JSON on stdin."""
MAX_INPUT = 1 << 20
MAX_CONTEXT_CHARS = 8000
"""The additionalContext stays well under what Claude Code takes from a hook (10,000 characters)."""
MAX_MODIFIED = 30
MAX_READ = 15
LOG_ROTATE_BYTES = 1 << 20
SOURCE = "claude-code"
RUNNING_RECHECK = 0.5
"""Seconds between tries to record a summary while another compaction of the session runs (unless it ends)."""


class HookProblem(Exception):
    """Why the hook did nothing (or not all of it), in one line."""


def default_log_path() -> Path:
    """The hooks' log: the per-user log directory."""
    import platformdirs

    return Path(platformdirs.user_log_dir("context-sidecar", appauthor=False)) / "hook.log"


def run_hook(agent: str, db: str | None = None, log_file: str | None = None, stdin: IO[bytes] | None = None) -> int:
    """Handle one hook call of ``agent``; always returns 0 (a hook must never block the agent)."""
    started = time.monotonic()
    log_path = Path(log_file) if log_file else default_log_path()
    _log_to(log_path)
    event = ""
    try:
        if agent not in AGENTS:
            raise HookProblem(f"no hooks for {agent!r} (context-sidecar has hooks for {', '.join(AGENTS)})")
        payload = read_payload(stdin if stdin is not None else sys.stdin.buffer)
        event = str(payload.get("hook_event_name"))
        output, done = asyncio.run(handle(payload, db, log_path, started + DEADLINE))
    except HookProblem as problem:
        return _fail(event, str(problem), log_path)
    except SidecarRequestError as error:
        return _fail(event, f"context-sidecar answered {error}", log_path)
    except Exception as error:  # anything at all: the agent goes on
        log.debug("hook failed", exc_info=True)
        return _fail(event, f"unexpected {type(error).__name__}: {error}", log_path)
    if output is not None:
        sys.stdout.write(json.dumps(output, ensure_ascii=False) + "\n")
        sys.stdout.flush()
    log.info("%s: %s (%.2f s)", event, done, time.monotonic() - started)
    return 0


def _fail(event: str, reason: str, log_path: Path) -> int:
    """One line on stderr and in the log; exit code 0 all the same (2 would block Claude Code)."""
    line = f"context-sidecar hook{' ' + event if event else ''}: {reason}; the agent goes on without it"
    print(f"{line} (log: {log_path})", file=sys.stderr, flush=True)
    log.warning("%s", line)
    return 0


def _log_to(path: Path) -> None:
    """Log this hook's lines to ``path`` (rotated at 1 MB), and nothing to stderr but the one line of a failure."""
    handlers: list[logging.Handler] = []
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.stat().st_size > LOG_ROTATE_BYTES:
            path.replace(path.with_name(path.name + ".1"))
        handlers.append(logging.FileHandler(path, encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler.addFilter(PasswordMask())
    logging.basicConfig(level=logging.INFO, handlers=handlers or [logging.NullHandler()], force=True)


def read_payload(stream: IO[bytes]) -> dict[str, Any]:
    """The hook's JSON object from ``stream``, read until its end within ``STDIN_WAIT`` seconds."""
    if stream.isatty():
        raise HookProblem("reads a Claude Code hook's JSON on stdin, and stdin is a terminal")
    data = bytearray()
    deadline = time.monotonic() + STDIN_WAIT
    fd = stream.fileno()
    while len(data) <= MAX_INPUT:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(left, 0))
        if not ready:
            raise HookProblem(f"no end of input on stdin within {STDIN_WAIT:g} s")
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        data += chunk
    else:
        raise HookProblem(f"malformed hook input: more than {MAX_INPUT:,} bytes")
    try:
        payload = json.loads(data)
    except (ValueError, UnicodeDecodeError) as error:
        raise HookProblem(f"malformed hook input: not JSON ({error})") from None
    if not isinstance(payload, dict):
        raise HookProblem("malformed hook input: not a JSON object")
    event = payload.get("hook_event_name")
    if not isinstance(event, str) or not event:
        raise HookProblem("malformed hook input: no hook_event_name")
    if event not in EVENTS:
        raise HookProblem(f"unknown hook event {event!r} (context-sidecar handles {', '.join(EVENTS)})")
    return payload


def _text(payload: dict[str, Any], key: str) -> str:
    value = payload.get(key)
    if not isinstance(value, str) or not value:
        raise HookProblem(f"malformed hook input: no {key}")
    return value


async def handle(payload: dict[str, Any], db: str | None, log_path: Path,
                 deadline: float) -> tuple[dict[str, Any] | None, str]:
    """(what to print on stdout, what was done) for one hook call, within ``deadline`` (a monotonic time)."""
    event = payload["hook_event_name"]
    if event == "SessionStart" and payload.get("source") != "compact":
        return None, f"source {payload.get('source')!r}: nothing to restore"
    session_id = _text(payload, "session_id")
    if event == "PostCompact":
        _text(payload, "compact_summary")
    elif event == "PreCompact":
        _transcript(payload)
    cwd = payload.get("cwd")
    if isinstance(cwd, str) and os.path.isdir(cwd):
        os.chdir(cwd)  # the sidecar records the session's workspace from its working directory
    left = deadline - time.monotonic()
    try:
        client = await asyncio.wait_for(SidecarClient.spawn(
            command=SERVER_COMMAND, db=db, settings={"compaction": {"auto": False}}, stderr=str(log_path),
            timeout=left), left)
    except TimeoutError:
        raise HookProblem(f"context-sidecar did not start within {DEADLINE:g} s") from None
    except (OSError, SidecarRequestError) as error:
        raise HookProblem(f"context-sidecar is unreachable: {error}") from None
    try:
        steps = {"PreCompact": pre_compact, "SessionStart": session_start, "PostCompact": post_compact}
        return await asyncio.wait_for(steps[event](client, session_id, payload), deadline - time.monotonic())
    except TimeoutError:
        raise HookProblem(f"gave up after {DEADLINE:g} s") from None
    finally:
        await _close(client)


async def _close(client: SidecarClient) -> None:
    """Shut the relay down, killing it if it takes more than a moment."""
    try:
        await asyncio.wait_for(client.close(timeout=2.0), 3.0)
    except Exception:
        if client.process is not None and client.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                client.process.kill()


def _transcript(payload: dict[str, Any]) -> str:
    """The hook's transcript file; HookProblem when there is none."""
    path = payload.get("transcript_path")
    if not isinstance(path, str) or not path:
        raise HookProblem("malformed hook input: no transcript_path")
    if not os.path.isfile(path):
        raise HookProblem(f"no transcript at {path!r}")
    return path


async def _import(client: SidecarClient, payload: dict[str, Any], required: bool = True) -> t.ImportResult | None:
    """memory/import of the hook's transcript (a complete file: nothing is written while the hook runs)."""
    try:
        path = _transcript(payload)
    except HookProblem:
        if required:
            raise
        return None
    return await client.import_transcript(path, format="claude-code", follow=True)


async def pre_compact(client: SidecarClient, session_id: str,
                      payload: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """Import the transcript to its last line before Claude Code compacts it."""
    result = await _import(client, payload)
    assert result is not None
    stored = len(result.ids) - result.duplicates
    return None, f"session {result.session_id}: {stored:,} new messages imported, {len(result.ids):,} in the transcript"


async def session_start(client: SidecarClient, session_id: str,
                        payload: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """After Claude Code compacted: its standing rules and files, as additionalContext for the next request.

    PreCompact imported the transcript a moment ago (Claude Code runs it first), so the transcript is read again
    only when the session is not in memory at all.
    """
    session = session_id
    try:
        rules = await client.rules(session)
    except SidecarRequestError as error:
        if error.code != codes.UNKNOWN_SESSION:
            raise
        imported = await _import(client, payload, required=False)
        if imported is None:
            raise HookProblem(f"session {session} is not in context-sidecar's memory, and there is no transcript "
                              f"at {payload.get('transcript_path')!r}") from None
        session = imported.session_id
        rules = await client.rules(session)
    cwd = payload.get("cwd")
    text = restore_text(rules, cwd if isinstance(cwd, str) else None)
    if text is None:
        return None, f"session {session}: no standing rules or files to restore"
    output = {"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": text}}
    return output, (f"session {session}: restored {len(rules.rules)} rules, {len(rules.modified)} modified and "
                    f"{len(rules.read)} read files ({len(text):,} characters)")


async def post_compact(client: SidecarClient, session_id: str,
                       payload: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """Record Claude Code's own summary with the session."""
    summary = _text(payload, "compact_summary")
    trigger = payload.get("trigger")
    trigger = trigger if trigger in ("manual", "auto") else None
    try:
        result = await _record(client, session_id, summary, trigger)
    except SidecarRequestError as error:
        if error.code != codes.UNKNOWN_SESSION or await _import(client, payload, required=False) is None:
            raise
        result = await _record(client, session_id, summary, trigger)
    recorded = "recorded" if result.recorded else "already recorded"
    return None, f"session {session_id}: Claude Code's summary {recorded} as {result.summary_id}"


async def _record(client: SidecarClient, session_id: str, summary: str, trigger: Any) -> t.RecordCompactionResult:
    """memory/recordCompaction; while another compaction of the session runs (the transcript's follower recording
    this same one, often), again once it ended (recorded by text once: then it says so), within the DEADLINE."""
    try:
        return await client.record_compaction(session_id, summary, SOURCE, trigger)
    except SidecarRequestError as error:
        if error.code != codes.COMPACTION_RUNNING:
            raise
    log.info("session %s: waiting for the compaction that is running to end", session_id)
    await client.follow(session_id)  # so that its context/didCompact reaches this connection
    while True:
        ended = client.wait_for_notification(methods.CONTEXT_DID_COMPACT, lambda done: done.session_id == session_id,
                                             timeout=None)
        try:
            return await client.record_compaction(session_id, summary, SOURCE, trigger)
        except SidecarRequestError as error:
            if error.code != codes.COMPACTION_RUNNING:
                raise
            # One that compacts nothing or fails announces nothing: look again after a while regardless.
            await asyncio.wait({ended}, timeout=RUNNING_RECHECK)
        finally:
            ended.cancel()


def restore_text(rules: t.RulesResult, cwd: str | None = None) -> str | None:
    """The additionalContext: labelled, the rules verbatim, then files (relative to ``cwd`` when under it), within
    ``MAX_CONTEXT_CHARS``."""
    if not (rules.rules or rules.modified or rules.read):
        return None
    lines = ["[context-sidecar] Carried over from before this conversation was compacted (the full history stays "
             "in context-sidecar's memory)."]
    if rules.rules:
        lines += ["", "Standing rules the user gave earlier in this session, verbatim:"]
        lines += [f"- {rule}" for rule in rules.rules]
        if rules.rules_left_out:
            lines.append(f"({len(rules.rules_left_out)} more rules are in the session's stored history.)")
    for title, paths, cap in (("Files modified in this session, most recent first:", rules.modified, MAX_MODIFIED),
                              ("Files read in this session, most recent first:", rules.read, MAX_READ)):
        if not paths:
            continue
        section = ["", title]
        used = len("\n".join(lines + section))
        shown = 0
        for path in (_relative(path, cwd) for path in paths[:cap]):
            if used + len(path) + 3 > MAX_CONTEXT_CHARS - 40:
                break
            section.append(f"- {path}")
            used += len(path) + 3
            shown += 1
        if shown < len(paths):
            section.append(f"- … and {len(paths) - shown} more")
        if shown:
            lines += section
    return "\n".join(lines)[:MAX_CONTEXT_CHARS]


def _relative(path: str, cwd: str | None) -> str:
    """``path`` relative to ``cwd`` when it lies under it (Claude Code's tools name absolute paths)."""
    if cwd and os.path.isabs(path):
        root = cwd.rstrip(os.sep) + os.sep
        if path.startswith(root):
            return path[len(root):]
    return path
