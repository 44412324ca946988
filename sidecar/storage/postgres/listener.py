"""What other hosts changed: a thread LISTENing on the team database's channel, reconnecting when it must.

Each write's transaction notifies ``<origin> <session id>`` (ids only: any role may listen); a host hears
every other host's, and its own are skipped. After a reconnection every session may have changed unseen, so
``on_change`` gets None: look at all of them again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg

from sidecar.config.database import shown
from sidecar.storage.postgres.connection import connection_options, first_line
from sidecar.storage.postgres.migrations import CHANNEL

log = logging.getLogger(__name__)

WAKE_SECONDS = 1.0
"""How often the thread looks whether it should stop."""
RETRY_SECONDS = 1.0
"""Between attempts to connect again after the server went away."""


class Listener:
    """One connection, in a thread of its own, calling ``on_change(session_id)`` for another host's writes."""

    def __init__(self, url: str, origin: str, on_change: Callable[[str | None], None]) -> None:
        self.url, self.origin, self.on_change = url, origin, on_change
        self._stop = threading.Event()
        self.connected = threading.Event()
        """Set while the connection listens: a write committed after it is heard."""
        self._thread = threading.Thread(target=self._run, name="pg-listener", daemon=True)

    def start(self) -> None:
        """Start listening (returns at once; ``connected`` says when it does)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop, within about WAKE_SECONDS."""
        self._stop.set()
        self._thread.join(timeout=WAKE_SECONDS * 3)

    def _run(self) -> None:
        heard_before = False
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, **connection_options(self.url)) as db:
                    db.execute(f"LISTEN {CHANNEL}")
                    self.connected.set()
                    if heard_before:
                        self.on_change(None)  # what changed while we were away was not heard
                    heard_before = True
                    while not self._stop.is_set():
                        for notice in db.notifies(timeout=WAKE_SECONDS):
                            self._heard(notice.payload)
            except psycopg.Error as error:
                self.connected.clear()
                if not self._stop.is_set():
                    log.info("listening on %s: %s; again in %g s", shown(self.url), first_line(error, self.url),
                             RETRY_SECONDS)
                    self._stop.wait(RETRY_SECONDS)
            except Exception:  # never let the thread die silently: a listener that stops hears nothing
                log.exception("listening on %s failed", shown(self.url))
                self._stop.wait(RETRY_SECONDS)

    def _heard(self, payload: str) -> None:
        origin, _, session_id = payload.partition(" ")
        if payload == "grants":
            self.on_change(None)
        elif origin != self.origin and session_id:
            self.on_change(session_id)
