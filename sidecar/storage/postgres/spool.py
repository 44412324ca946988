"""Ingests kept on this machine while the team database cannot be reached, sent in order once it can.

An ingest that finds the server gone answers success all the same: its messages (ids and positions already
given) are appended to a file and synced before the answer. While the file holds any, every ingest joins it,
so that order holds. A thread tries the server every second and, once it answers, writes the ingests in
transactions of up to ``BATCH`` ingests, in order, and only then drops them from the file: an ingest written but
not yet dropped (the host killed between the two) is written again, and its ids make it a no-op. So the server
gets every message exactly once, in order.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import attrs

log = logging.getLogger(__name__)
BATCH = 200
"""Spooled ingests written per transaction (and per rewrite of the file) once the server is back."""


def spool_path(url: str) -> Path:
    """The spool of a database, in the user's data directory, named by the database (its URL without password)."""
    import hashlib

    import platformdirs

    from sidecar.config.database import key

    digest = hashlib.sha256(key(url).encode()).hexdigest()[:20]
    return Path(platformdirs.user_data_dir("context-sidecar", appauthor=False)) / "spool" / f"{digest}.jsonl"


@attrs.define
class SpooledMessage:
    id: str
    seq: int
    role: str
    raw: str
    text: str
    tool_name: str | None
    tool_call_id: str | None
    tool_call_ids: list[str] | None
    tokens: int
    message_at: datetime
    pinned: bool
    prunable: bool


@attrs.define
class IngestRecord:
    """One ingest: what its transaction writes."""

    session_id: str
    messages: list[SpooledMessage]
    info: dict[str, Any]
    prune_rule: str
    sources: dict[str, list[str]]
    upsert: bool
    """Write the session's row (a new session, or new information about it)."""
    recount: bool
    """The prune rule changed: recount the session's prunable totals."""
    created_at: datetime

    def to_json(self) -> str:
        data = attrs.asdict(self)
        data["created_at"] = self.created_at.isoformat()
        for message in data["messages"]:
            message["message_at"] = message["message_at"].isoformat()
        return json.dumps(data, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> IngestRecord:
        data = json.loads(text)
        messages = [SpooledMessage(**{**m, "message_at": datetime.fromisoformat(m["message_at"])})
                    for m in data.pop("messages")]
        return cls(messages=messages, **{**data, "created_at": datetime.fromisoformat(data["created_at"])})


class Spool:
    """The file of ingests waiting for the server, and the thread that sends them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._pending: list[IngestRecord] = []
        self._thread: threading.Thread | None = None
        if path.exists():  # left by a host that stopped before the server came back
            try:
                self._pending = [IngestRecord.from_json(line) for line in path.read_text().splitlines() if line]
            except (ValueError, TypeError, KeyError) as error:
                log.error("the spool %s cannot be read (%s); it is kept as %s.bad", path, error, path)
                os.replace(path, path.with_name(path.name + ".bad"))
                self._pending = []

    @property
    def pending(self) -> list[IngestRecord]:
        """The ingests not yet on the server, oldest first (a copy)."""
        with self._lock:
            return list(self._pending)

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._pending)

    def add(self, record: IngestRecord) -> None:
        """Append an ingest, synced to disk before this returns."""
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, (record.to_json() + "\n").encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            self._pending.append(record)

    def _drop_first(self, count: int) -> None:
        """The oldest ``count`` ingests are on the server: rewrite the file without them."""
        with self._lock:
            del self._pending[:count]
            if not self._pending:
                self.path.unlink(missing_ok=True)
                return
            temporary = self.path.with_name(self.path.name + ".new")
            temporary.write_text("".join(record.to_json() + "\n" for record in self._pending))
            with open(temporary, "rb") as written:
                os.fsync(written.fileno())
            os.replace(temporary, self.path)

    def drain(self, connected: Callable[[], Any], write: Callable[[Any, list[IngestRecord]], None],
              done: Callable[[], None], stop: threading.Event, retry_seconds: float) -> None:
        """Start the thread that sends the ingests once ``connected()`` gives a connection (if not running)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(target=self._drain, args=(connected, write, done, stop, retry_seconds),
                                            name="pg-spool", daemon=True)
            self._thread.start()

    def _drain(self, connected: Callable[[], Any], write: Callable[[Any, list[IngestRecord]], None],
               done: Callable[[], None], stop: threading.Event, retry_seconds: float) -> None:
        while not stop.is_set():
            try:
                db = connected()
            except Exception as error:
                log.info("the team database is still away (%s); %d ingests wait", error, len(self.pending))
                stop.wait(retry_seconds)
                continue
            try:
                while True:
                    with self._lock:
                        batch = self._pending[:BATCH]
                        if not batch:
                            done()  # under the lock: no ingest joins the spool after this
                            return
                    write(db, batch)  # one transaction, in order
                    self._drop_first(len(batch))
            except Exception as error:
                log.info("sending the spooled ingests stopped (%s); tried again in %g s", error, retry_seconds)
                stop.wait(retry_seconds)
            finally:
                try:
                    db.close()
                except Exception as error:  # a dead connection's close may fail too
                    log.debug("closing the spool's connection: %s", error)
