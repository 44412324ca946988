"""Storing agent transcripts: memory/import, and what the host's followers of a workspace's transcripts store.

Reading a file (``read``) touches no database, so it may run in a thread; storing it (``store``) runs where the
store is used. A re-read of a file that grew converges on what one import of the final file stores: stored messages
are recognised by id, an imported message whose conversion changed is rewritten in place, and nothing is stored
twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from protocol.types import ImportParams, ImportResult, IngestParams, RecordCompactionParams, SessionInfo
from sidecar.engine.messages import MessageRow, check_message, message_row
from sidecar.importers.common import ParsedTranscript
from sidecar.services.errors import SidecarError, invalid_params
from sidecar.services.memory import check_session_id, ingest
from sidecar.services.state import Sidecar
from sidecar.wire import ParamsError

if TYPE_CHECKING:
    from sidecar.services.compaction.runner import CompactionRunner

log = logging.getLogger(__name__)


RESUME_PREFIX = 256
"""Bytes of the line a window starts at that are kept, to tell that the file still holds that line there."""


@attrs.frozen
class Resume:
    """Where the next read of a growing file may start (see ``importers.common.resume_line``)."""

    offset: int
    line: int
    prelude: list[tuple[int, int]]
    """Lines read before it, as (line number, byte offset): a session's header, the turn settings in force."""
    prefix: bytes
    """The first bytes of that line: a file rewritten in place under the same name holds others there."""
    inode: int

    def still_there(self, path: Path) -> bool:
        """Whether the file is still the one this was taken from, that far."""
        try:
            with path.open("rb") as fh:
                if os.fstat(fh.fileno()).st_ino != self.inode:
                    return False
                fh.seek(self.offset)
                return fh.read(len(self.prefix)) == self.prefix
        except OSError:
            return False


@attrs.frozen
class Read:
    """A transcript as read from its file, checked, with a fingerprint of each message."""

    path: Path
    parsed: ParsedTranscript
    session_id: str
    fingerprints: dict[str, str]
    """Per message id, a digest of the message as converted: what changed since an earlier read."""
    resume: Resume | None = None
    """Where the next read may start, when asked for."""
    window: bool = False
    """Only part of the file was read (from an earlier read's ``resume``)."""


@attrs.frozen
class Found:
    """An agent's own compaction found in a transcript, with the context position of the last message it replaced."""

    params: RecordCompactionParams
    upto: int | None


@attrs.define
class Stored:
    """What storing a read did."""

    result: ImportResult
    compactions: list[Found] = attrs.field(factory=list)
    """The transcript's compactions not recorded yet (``Found.upto`` None: none of their messages is stored)."""


def read(path: Path, params: ImportParams, start: Resume | None = None, resumable: bool = False) -> Read:
    """Parse and check a transcript file; -32602 naming ``path`` or ``format`` when it cannot be read.

    ``start``: read only from there on (an earlier read's ``resume``, the format named). ``resumable``: find where
    the next read may start.
    """
    from sidecar.importers import FORMATS, ImportFormatError, Window, parse_transcript

    fmt = params.format or "auto"
    if fmt != "auto" and fmt not in FORMATS:
        raise invalid_params(f"format must be auto or one of {', '.join(FORMATS)}", "format")
    if not path.is_file():
        raise invalid_params(f"no transcript file at {str(path)!r}", "path")
    window = None
    if resumable or start is not None:
        window = Window(start.offset, start.line, start.prelude) if start else Window()
    try:
        parsed = parse_transcript(path, fmt, follow=bool(params.follow), window=window)
    except ImportFormatError as error:
        raise invalid_params(str(error), "format") from None
    except (OSError, UnicodeDecodeError) as error:
        raise invalid_params(f"cannot read {str(path)!r}: {error}", "path") from None
    if not parsed.messages:
        reasons = "; ".join(parsed.skipped[:5]) + ("; …" if len(parsed.skipped) > 5 else "")
        raise invalid_params(f"no messages could be read from {str(path)!r} as {parsed.format}: "
                             f"{parsed.lines_read} JSON lines read, none a {parsed.format} message"
                             + (f" ({len(parsed.skipped)} skipped: {reasons})" if reasons else ""), "path")
    session_id = params.session_id or parsed.suggested_session_id or path.stem
    check_session_id(session_id)
    fingerprints: dict[str, str] = {}
    for index, message in enumerate(parsed.messages):
        try:
            check_message(message, f"messages[{index}]")
        except ParamsError as error:
            raise invalid_params(f"{path.name}: {error}", error.field) from None
        text = json.dumps(message, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        fingerprints[message["id"]] = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
    resume = _resume(path, parsed, window) if resumable and window is not None else None
    return Read(path, parsed, session_id, fingerprints, resume, window=start is not None)


def _resume(path: Path, parsed: ParsedTranscript, window: Any) -> Resume | None:
    """Where the next read of the file may start, from what this one found."""
    from sidecar.importers import RESUME_ROLES
    from sidecar.importers.common import resume_line

    found = resume_line(parsed, RESUME_ROLES.get(parsed.format, ()))
    if found is None:
        return None
    line, prelude = found
    offsets = [window.offsets.get(n) for n in (line, *prelude)]
    if any(offset is None for offset in offsets):
        return None
    with path.open("rb") as fh:
        inode = os.fstat(fh.fileno()).st_ino
        fh.seek(offsets[0])
        prefix = fh.read(RESUME_PREFIX)
    return Resume(offsets[0], line, [(n, window.offsets[n]) for n in prelude], prefix, inode)


def store(sidecar: Sidecar, read: Read, known: dict[str, str] | None = None) -> Stored:
    """Store what ``read`` found; ``known`` are the fingerprints of an earlier read of the same file into the same
    session, all stored since: only messages whose fingerprint differs are looked up and written.

    Messages already stored as they are count as duplicates; an imported message whose conversion changed (the
    file grew: more tool calls, reasoning) and a stand-in result whose real result arrived are rewritten in place
    (``Storage.replace_messages``); the rest is ingested as one atomic batch, the original lines beside them.
    """
    parsed, session_id = read.parsed, read.session_id
    store_ = sidecar.store()
    exists = store_.session(session_id) is not None
    wanted = parsed.messages if known is None or not exists else \
        [m for m in parsed.messages if known.get(m["id"]) != read.fingerprints[m["id"]]]
    replacements, fresh = _changes(sidecar, session_id, parsed.messages, wanted) if exists else ([], wanted)
    replaced = 0
    if replacements:
        replaced = store_.replace_messages(session_id, replacements)
        sidecar.runtime.rendered.clear()  # positions now hold other messages than the ones rendered
    info = parsed.session or {}
    if fresh or not exists or known is None:
        result = ingest(sidecar, IngestParams(session_id=session_id, messages=fresh, session=SessionInfo(
            model=info.get("model"), title=info.get("title"), metadata=info.get("metadata"))))
        duplicates = result.duplicates
    else:
        duplicates = 0
    changed = {m["id"] for m in fresh} | {row.id or old_id for old_id, row in replacements}
    store_.store_sources(session_id, {i: lines for i, lines in parsed.sources.items() if i in changed})
    ids = [m["id"] for m in parsed.messages]
    usage = sidecar.usage(sidecar.session(session_id))
    outcome = ImportResult(session_id=session_id, format=parsed.format, ids=ids,
                           duplicates=len(ids) - len(fresh) - replaced + duplicates, skipped=list(parsed.skipped),
                           usage=usage, replaced=replaced, compactions=0 if parsed.compactions else None)
    return Stored(outcome, _compactions(sidecar, read))


def import_transcript(sidecar: Sidecar, params: ImportParams) -> Stored:
    """memory/import: parse a transcript file on this machine and store it (relative paths from the client's)."""
    path = Path(sidecar.cwd or ".", Path(params.path).expanduser())
    return store(sidecar, read(path, params))


async def record_found(runner: CompactionRunner, found: list[Found]) -> tuple[int, list[Found]]:
    """Record the agent's own compactions a transcript holds (as memory/recordCompaction does): how many were, and
    those dealt with (recorded now or before).

    One whose messages are not stored (it replaced nothing here) is skipped; one that fails (a compaction of the
    session running) is logged and left for the next read of the file.
    """
    done: list[Found] = []
    count = 0
    for item in found:
        if item.upto is None:
            log.info("%s compaction %s of %s replaced no stored message; not recorded", item.params.source,
                     item.params.id, item.params.session_id)
            continue
        try:
            outcome = await runner.record(item.params, item.upto)
        except SidecarError as error:
            log.warning("%s compaction %s of %s not recorded yet: %s", item.params.source, item.params.id,
                        item.params.session_id, error.message)
            continue
        count += outcome.recorded
        if outcome.recorded or outcome.summary_id:
            done.append(item)
    return count, done


def _changes(sidecar: Sidecar, session_id: str, messages: list[dict[str, Any]], wanted: list[dict[str, Any]]
             ) -> tuple[list[tuple[str, MessageRow]], list[dict[str, Any]]]:
    """What storing ``wanted`` (of the transcript's ``messages``) changes: stored messages to rewrite (stored id,
    new row), and messages to ingest."""
    store_ = sidecar.store()
    owners = {call["id"]: m["id"] for m in messages for call in m.get("tool_calls") or ()}
    stand_ins = {m["id"]: f"{owners[m['tool_call_id']]}:{m['tool_call_id']}:no-result" for m in wanted
                 if m["role"] == "tool" and m["tool_call_id"] in owners
                 and not (m.get("metadata") or {}).get("synthetic")}
    stored = store_.messages_by_id(session_id, [m["id"] for m in wanted] + list(stand_ins.values()))
    names = {call["id"]: call["function"]["name"] for m in messages for call in m.get("tool_calls") or ()}
    max_part = sidecar.settings.prune.max_tokens_per_part
    replacements: list[tuple[str, MessageRow]] = []
    fresh: list[dict[str, Any]] = []
    for message in wanted:
        old = stored.get(message["id"])
        if old is None and message["id"] in stand_ins:
            old = stored.get(stand_ins[message["id"]])
            if old is not None and not (json.loads(old.raw).get("metadata") or {}).get("synthetic"):
                old = None
        if old is None:
            fresh.append(message)
            continue
        row = message_row(message, max_part, names)
        source = (message.get("metadata") or {}).get("source")
        if old.raw != row.raw and (json.loads(old.raw).get("metadata") or {}).get("source") == source:
            replacements.append((old.id, row))  # Ours, from an earlier read of the same transcript.
    return replacements, fresh


def _compactions(sidecar: Sidecar, read: Read) -> list[Found]:
    """The transcript's own compactions not recorded yet, each with the position up to which it replaced."""
    if not read.parsed.compactions:
        return []
    store_ = sidecar.store()
    recorded = {row.compaction_id for row in store_.agent_compactions(read.session_id)}
    pending = [c for c in read.parsed.compactions if c.id not in recorded]
    stored = store_.messages_by_id(read.session_id, [c.upto for c in pending if c.upto is not None])
    return [Found(RecordCompactionParams(session_id=read.session_id, summary=c.summary, source=read.parsed.format,
                                         trigger=c.trigger, id=c.id),  # type: ignore[arg-type]
                  stored[c.upto].seq if c.upto in stored else None) for c in pending]
