"""The DuckDB connection: where the file is attached, with which row groups and memory settings."""

from __future__ import annotations

import logging
import os
import re

import duckdb

from sidecar.settings import MEMORY_SIZE
from sidecar.storage.rows import StorageFailure, StorageLocked

log = logging.getLogger(__name__)
MEMORY = ":memory:"
_LOCK_PID = re.compile(r"PID (\d+)")
ROW_GROUP_SIZE = 2048
"""Rows per row group, the least DuckDB allows. A checkpoint rewrites whole row groups: at DuckDB's
122,880 rows of ~2 KB messages a 200k-message load in-process peaked at 507 MiB, at 16,384 rows 330,
at 4,096 171 (and loaded in 13 s, not 17-19). A row group's bytes must fit memoryLimit: 4,096 rows of
40 KB tool outputs made a checkpoint fail under 64MB; 2,048 did not."""
CHECKPOINT_WAL_BYTES = 8 << 20
"""A WAL this large is checkpointed after the write that grew it (Storage.checkpoint_if_due). Rows not
yet checkpointed sit in memory at about 2.5 times their WAL bytes: at 32 MB the server's RSS swung
between 114 and 180 MiB during a 1M-message load, at 8 MB it stays within about 30 MiB of its floor."""
SCAN_MEMORY_LIMIT = "32MB"
"""DuckDB's limit while a grep reads the session's text: the pages it reads are evicted as it goes. Over
100k messages, in-process, the grep's peak was 50 MiB above its start at 512MB and 19 MiB at 32MB,
for 95 ms instead of 80."""
TRIMMED_MEMORY_LIMIT = "8MB"
"""Set for a moment after a checkpoint or a grep, so that DuckDB hands its cached pages back."""


def attach(db: duckdb.DuckDBPyConnection, path: str, memory_limit: str) -> None:
    """Attach the file at ``path`` as the connection's default database."""
    # Attached rather than opened, because only ATTACH takes a row group size; and opened directly,
    # DuckDB would put its spill files under the working directory.
    quoted = path.replace("'", "''")
    # Under DuckDB's default limit: replaying a WAL ends in a checkpoint (see Storage.checkpoint).
    db.execute("RESET memory_limit")
    try:
        db.execute(f"ATTACH '{quoted}' AS store (ROW_GROUP_SIZE {ROW_GROUP_SIZE})")
    finally:
        db.execute(f"SET memory_limit = '{memory_limit}'")
    db.execute("USE store")


def invalidating(error: BaseException | None) -> bool:
    """Whether ``error``, or an error that caused it, says DuckDB will refuse the database until it is reopened."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, duckdb.FatalException) or "has been invalidated" in str(error):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def connect(path: str, memory_limit: str) -> duckdb.DuckDBPyConnection:
    """A connection to the database at ``path`` (``:memory:`` for none), configured; StorageLocked if held."""
    if not MEMORY_SIZE.fullmatch(memory_limit):
        raise StorageFailure(f"memoryLimit {memory_limit!r} is not a size such as '512MB'")
    if path != MEMORY:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    config = {"memory_limit": memory_limit, "threads": 2}
    try:
        if path == MEMORY:
            db = duckdb.connect(path, config=config)
        else:
            db = duckdb.connect(config={**config, "temp_directory": path + ".tmp"})
            attach(db, path, memory_limit)
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
