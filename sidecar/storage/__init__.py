"""Storage: one interface (``interface.Store``), two backends; every SQL statement lives in one of them.

``database.Storage`` is the embedded default, a DuckDB file (``connection.connect`` opens and configures it);
``postgres.database.PgStorage`` is a team's PostgreSQL server, chosen by a ``postgresql://`` URL. ``open_store``
picks one. Rows and errors are ``sidecar.rows``, on the lowest layer, so every layer can hold them without
importing either driver; both load on first use, keeping start-up quick (psycopg only for a URL).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sidecar.config.database import is_url
from sidecar.config.defaults import DEFAULT_MEMORY_LIMIT

if TYPE_CHECKING:
    from sidecar.storage.interface import Store

__all__ = ["Storage", "open_store"]


def open_store(target: str, memory_limit: str = DEFAULT_MEMORY_LIMIT) -> Store:
    """The store ``target`` names: a PostgreSQL URL, else a DuckDB file (created and migrated)."""
    if is_url(target):
        from sidecar.storage.postgres.database import PgStorage

        return PgStorage.open(target)
    from sidecar.storage.database import Storage

    return Storage.open(target, memory_limit)


def __getattr__(name: str) -> Any:
    if name == "Storage":
        from sidecar.storage.database import Storage

        return Storage
    raise AttributeError(name)
