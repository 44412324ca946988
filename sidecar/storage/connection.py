"""The DuckDB connection: where the file is attached, with which row groups and memory settings."""

from __future__ import annotations

import logging
import os
import re

import duckdb

from sidecar.config.paths import missing_directory
from sidecar.config.settings import DEFAULT_MEMORY_LIMIT, MEMORY_SIZE
from sidecar.rows import StorageFailure, StorageLocked

log = logging.getLogger(__name__)
MEMORY = ":memory:"
_LOCK_PID = re.compile(r"PID (\d+)")
ROW_GROUP_SIZE = 2048
"""Rows per row group, the least DuckDB allows. A checkpoint rewrites whole row groups: at DuckDB's
122,880 rows of ~2 KB messages a 200k-message load in-process peaked at 507 MiB, at 16,384 rows 330,
at 4,096 171 (and loaded in 13 s, not 17-19). A row group's bytes must fit memoryLimit: 4,096 rows of
40 KB tool outputs made a checkpoint fail under 64MB; 2,048 did not."""
CHECKPOINT_WAL_BYTES = 16 << 20
"""A WAL this large is checkpointed after the write that grew it (Storage.checkpoint_if_due). Rows not
yet checkpointed sit in memory at about 2.5 times their WAL bytes: with 32 MB the bench's server was at
171 MiB after its 1M-message load, with 16 MB 150 and with 8 MB 146. 8 MB cost a tenth of the batch
ingest rate (more checkpoints), and did not lower the peak, which a checkpoint's own allocations set."""
SCAN_MEMORY_LIMIT = "32MB"
"""DuckDB's limit while a grep reads the session's text: the pages it reads are evicted as it goes. Over
100k messages, in-process, a grep's peak was 43-48 MiB above its start at 512MB and 29-30 at 32MB, in
73-78 ms either way."""
TRIMMED_MEMORY_LIMIT = "8MB"
"""Set for a moment after a checkpoint or a grep, so that DuckDB hands its cached pages back."""


def attach(db: duckdb.DuckDBPyConnection, path: str) -> None:
    """Attach the file at ``path`` as the connection's default database."""
    # Attached rather than opened, because only ATTACH takes a row group size; and opened directly,
    # DuckDB would put its spill files under the working directory.
    quoted = path.replace("'", "''")
    db.execute(f"ATTACH '{quoted}' AS store (ROW_GROUP_SIZE {ROW_GROUP_SIZE})")
    db.execute("USE store")


def invalidating(error: BaseException | None) -> bool:
    """Whether ``error``, or an error that caused it, says DuckDB will refuse the database until it is reopened."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, duckdb.FatalException) or (
                isinstance(error, duckdb.Error) and "has been invalidated" in str(error)):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def connect(path: str, memory_limit: str) -> duckdb.DuckDBPyConnection:
    """A connection to the database at ``path`` (``:memory:`` for none), configured; StorageLocked if held."""
    if not MEMORY_SIZE.fullmatch(memory_limit):
        raise StorageFailure(f"memoryLimit {memory_limit!r} is not a size such as {DEFAULT_MEMORY_LIMIT!r}")
    if path != MEMORY:
        missing = missing_directory(path)
        if missing:
            raise StorageFailure(f"cannot open {path}: {missing}")
        directory = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(directory, exist_ok=True)  # the per-user data directory, the only one made
        except OSError as error:
            raise StorageFailure(f"cannot open {path}: cannot create its directory {directory}: "
                                 f"{error.strerror}") from error
    config: dict[str, str | bool | int | float | list[str]] = {"memory_limit": memory_limit, "threads": 2}
    try:
        if path == MEMORY:
            db = duckdb.connect(path, config=config)
        else:
            db = duckdb.connect(config={**config, "temp_directory": path + ".tmp"})
            try:
                attach(db, path)
            except duckdb.Error:
                db.close()  # or the instance would hold the file's lock until collected
                raise
    except duckdb.IOException as error:
        if "lock" in str(error).lower():
            match = _LOCK_PID.search(str(error))
            raise StorageLocked(path, int(match.group(1)) if match else None) from error
        raise StorageFailure(f"cannot open {path}: {error}") from error
    except duckdb.Error as error:
        raise StorageFailure(f"cannot open {path}: {error}") from error
    # Not DuckDB's checkpoints: ours come at CHECKPOINT_WAL_BYTES, and trim the cache after them.
    db.execute("SET checkpoint_threshold = '1GB'")
    db.execute("SET preserve_insertion_order = true")
    return db
