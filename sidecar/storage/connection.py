"""The DuckDB connection: where the file is attached, with which row groups and memory settings."""

from __future__ import annotations

import logging
import os
import re

import duckdb

from sidecar.storage.rows import StorageFailure, StorageLocked

log = logging.getLogger(__name__)
MEMORY = ":memory:"
_LOCK_PID = re.compile(r"PID (\d+)")
MEMORY_LIMIT = re.compile(r"(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)", re.IGNORECASE)
ROW_GROUP_SIZE = 4096
"""Rows per row group. A checkpoint rewrites whole row groups, and at DuckDB's 122,880 rows of ~2 KB
messages that took a 200k-message load in-process to a 507 MiB peak; 16,384 rows 330 MiB, 4,096 rows
171 MiB, and faster (13 s against 17-19 s). Greps over 100k messages took the same time."""
CHECKPOINT_WAL_BYTES = 32 << 20
"""A WAL this large is checkpointed after the write that grew it (Storage.checkpoint_if_due)."""
TRIMMED_MEMORY_LIMIT = "8MB"
"""Set for a moment after a checkpoint or a grep, so that DuckDB hands its cached pages back."""
_UNITS = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def size_in_bytes(size: str) -> float:
    """A DuckDB size such as '512MB' in bytes."""
    match = MEMORY_LIMIT.fullmatch(size)
    if match is None:
        raise ValueError(f"not a size: {size!r}")
    return float(match.group(1)) * _UNITS[match.group(2).lower()]


def connect(path: str, memory_limit: str) -> duckdb.DuckDBPyConnection:
    """A connection to the database at ``path`` (``:memory:`` for none), configured; StorageLocked if held."""
    if not MEMORY_LIMIT.fullmatch(memory_limit):
        raise StorageFailure(f"memoryLimit {memory_limit!r} is not a size such as '512MB'")
    if path != MEMORY:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    config = {"memory_limit": memory_limit, "threads": 2}
    try:
        if path == MEMORY:
            db = duckdb.connect(path, config=config)
        else:
            # Attached rather than opened, because only ATTACH takes a row group size; and then DuckDB
            # would put its spill files under the working directory.
            db = duckdb.connect(config={**config, "temp_directory": path + ".tmp"})
            quoted = path.replace("'", "''")
            db.execute(f"ATTACH '{quoted}' AS store (ROW_GROUP_SIZE {ROW_GROUP_SIZE})")
            db.execute("USE store")
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
