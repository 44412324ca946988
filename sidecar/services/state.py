"""The sidecar's state: settings, the open store and the sessions' runtime; ``figures`` works out their figures."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from protocol import errors as codes
from sidecar.config.database import is_url, shown
from sidecar.config.paths import default_database, default_storage_path, legacy_workspace_path, workspace_key
from sidecar.config.settings import Settings
from sidecar.config.sockets import ShareError, check_owner
from sidecar.rows import SessionRow, StorageFailure, StorageLocked
from sidecar.services.errors import SidecarError, unknown_session
from sidecar.services.figures import SessionFigures
from sidecar.services.runtime import Runtime

if TYPE_CHECKING:
    from sidecar.storage.interface import Store

log = logging.getLogger(__name__)


@attrs.define
class Sidecar(SessionFigures):
    """Everything a request handler needs, shared by all of them."""

    settings: Settings = attrs.field(factory=Settings)
    storage_path: str | None = None
    """Set by ``--db``; otherwise from settings or the workspace root, at initialize."""

    usage_notifications: bool = True
    compaction_hooks: bool = False
    client_summaries: bool = False
    """The client declared ``summaries``: it runs the summarizer calls of the sessions it drives on its model."""
    notify: Callable[[str, Any], None] = lambda method, params: None
    """Sends a notification to this connection's client (the server sets it)."""
    _storage: Store | None = None
    runtime: Runtime = attrs.field(factory=Runtime)
    """What is kept in memory about each session, shared with the other connections of a host."""
    revision_prefix: str = attrs.field(factory=lambda: uuid.uuid4().hex[:8])
    """Revisions name this sidecar (process, or a host's connection) too, so another's is never taken for ours."""
    revisions: int = 0
    merge_root: str | None = None
    """A workspace root whose file of earlier versions is to be merged before the store is first used."""
    cwd: str | None = None
    """Where relative paths in params start: a relay's working directory in a host; None for this process's."""
    workspace: str | None = None
    """Where this connection's new sessions belong: the client's root, else the agent's working directory."""
    owns_storage: bool = True
    """False for a host's connections: the store is the host's, opened and closed by it."""

    def attached(self) -> Sidecar:
        """A connection's view of this (a host's) sidecar: own settings, the same store and sessions' runtime."""
        return Sidecar(storage_path=self.storage_path, storage=self._storage, runtime=self.runtime, owns_storage=False)

    def next_revision(self) -> str:
        """A new assemble revision."""
        self.revisions += 1
        return f"{self.revision_prefix}-{self.revisions}"

    def resolve_storage_path(self, workspace_root: str | None) -> str:
        """Fix the database path from --db, then settings, then the workspace; returns it."""
        if self.storage_path is None:
            self.storage_path = self.settings.storage.path or default_database(workspace_root)
        return self.storage_path

    def store(self) -> Store:
        """The open store; opened on first use so a lock held elsewhere is retried on each request."""
        if self._storage is not None and self._storage.invalidated:
            self._reopen(self._storage)
        if self._storage is None:
            path = self.storage_path or self.resolve_storage_path(None)
            from sidecar.storage import open_store  # DuckDB or psycopg loads on first use, not at start-up

            try:
                check_owner(path)
                self._storage = open_store(path, self.settings.storage.memory_limit)
            except StorageLocked as error:
                raise SidecarError(codes.STORAGE_LOCKED, str(error), {"path": error.path, "pid": error.pid}) \
                    from error
            except (StorageFailure, ShareError) as error:
                raise SidecarError(codes.STORAGE_ERROR, str(error), {"path": shown(path)}) from error
            log.info("storage %s opened", shown(path))
        if self.merge_root is not None:
            root, self.merge_root = self.merge_root, None
            merged = self.merge_legacy(root)
            if merged is not None:
                log.warning("%s", merged)
        return self._storage

    def merge_legacy(self, workspace_root: str) -> str | None:
        """Carry the workspace's file of earlier versions into the per-user database; returns what was done.

        Only when this is the per-user default database. The old file is renamed ``*.merged`` once every
        session of it is here; a session whose id exists here already is left in it (and the file kept).
        """
        legacy = legacy_workspace_path(workspace_root)
        if not (self.storage_path and os.path.exists(legacy)) or is_url(self.storage_path) or \
                os.path.realpath(self.storage_path) != os.path.realpath(default_storage_path()):
            return None
        from sidecar.storage.database import Storage

        try:
            Storage.open(legacy, self.settings.storage.memory_limit).close()  # migrated, its WAL folded in
            store = self.store()
            assert isinstance(store, Storage)  # a file, as the default database is
            copied, left = store.merge_file(legacy, workspace_key(workspace_root))
        except (StorageFailure, StorageLocked) as error:
            return f"could not merge {legacy} into {self.storage_path} (tried again next time): {error}"
        if left:
            return (f"merged {len(copied)} sessions of {legacy} into {self.storage_path}; kept the file, whose "
                    f"sessions {', '.join(left)} have namesakes there")
        os.replace(legacy, legacy + ".merged")
        return f"merged {len(copied)} sessions of {legacy} into {self.storage_path}"

    def noticed(self, error: BaseException) -> None:
        """Look at a request's failure: one that invalidated the database gets it reopened on the next request."""
        if self._storage is not None:
            self._storage.note_failure(error)

    def _reopen(self, store: Store) -> None:
        """Take back a database DuckDB invalidated; until that works, each request answers an error and retries."""
        log.warning("DuckDB invalidated %s; opening it again", store.path)
        try:
            store.reopen()
        except StorageLocked as error:
            raise SidecarError(codes.STORAGE_LOCKED, str(error), {"path": error.path, "pid": error.pid}) from error
        except StorageFailure as error:
            raise SidecarError(codes.STORAGE_ERROR, f"storage {store.path} was invalidated and could not be "
                               f"opened again: {error}", {"path": store.path}) from error
        self.runtime.forget()
        log.info("storage %s opened again", store.path)

    @property
    def open_store(self) -> Store | None:
        """The store if it is open, without trying to open it."""
        return self._storage

    def close(self) -> None:
        """Checkpoint and close the store, if open."""
        if not self.owns_storage:
            return
        store, self._storage = self._storage, None
        if store is not None:
            store.close()

    def session(self, session_id: str) -> SessionRow:
        """The session, or -32001."""
        session = self.store().session(session_id)
        if session is None:
            raise unknown_session(session_id)
        return session
