"""Storage: one class (``database.Storage``) owns the DuckDB connection and every SQL statement.

``connection.connect`` opens and configures that connection (row groups, memory limits, the lock).

Rows and errors live in ``rows``, which does not import DuckDB, so that start-up stays quick;
``Storage`` is loaded on first use.
"""

from __future__ import annotations

from typing import Any

from sidecar.storage.rows import (
    ItemRow,
    SearchHit,
    SessionRow,
    StorageFailure,
    StorageLocked,
    StoredMessage,
    SummaryRow,
    utcnow,
)

__all__ = ["ItemRow", "SearchHit", "SessionRow", "Storage", "StorageFailure", "StorageLocked", "StoredMessage",
           "SummaryRow", "utcnow"]


def __getattr__(name: str) -> Any:
    if name == "Storage":
        from sidecar.storage.database import Storage

        return Storage
    raise AttributeError(name)
