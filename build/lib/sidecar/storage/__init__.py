"""Storage: one class (``database.Storage``) owns the DuckDB connection and every SQL statement.

``connection.connect`` opens and configures that connection (row groups, memory limits, the lock).
Its rows and errors are ``sidecar.rows``, on the lowest layer, so every layer can hold them without
importing DuckDB; ``Storage`` is loaded on first use, keeping start-up quick.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Storage"]


def __getattr__(name: str) -> Any:
    if name == "Storage":
        from sidecar.storage.database import Storage

        return Storage
    raise AttributeError(name)
