"""Whole sessions in and out of a DuckDB file (``db copy``), ids kept, positions renumbered in order."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import duckdb

from sidecar.rows import SessionDump, SessionRow
from sidecar.storage.copying import COPIED_TABLES, position_map, renumber


class SessionCopies:
    """Mixin of Storage: ``dump_session`` and ``load_session``."""

    _db: duckdb.DuckDBPyConnection
    _sessions: dict[str, SessionRow]
    _transaction: Callable[..., AbstractContextManager[None]]
    allocate_positions: Callable[[int], int]

    def dump_session(self, session_id: str) -> SessionDump | None:
        """Every row of the session, verbatim."""
        tables: dict[str, list[dict[str, Any]]] = {}
        for table in COPIED_TABLES:
            cursor = self._db.execute(f"SELECT * FROM {table} WHERE session_id = ?", [session_id])
            names = [column[0] for column in cursor.description or ()]
            tables[table] = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        if not tables["sessions"]:
            return None
        return SessionDump(session_id, tables)

    def load_session(self, dump: SessionDump) -> bool:
        """Store a dumped session under its ids in one transaction; False if a session of that id is here."""
        if self._db.execute("SELECT 1 FROM sessions WHERE session_id = ?", [dump.session_id]).fetchall():
            return False
        wanted = position_map(dump)
        first = self.allocate_positions(len(wanted))
        tables = renumber(dump, {old: first + index for index, old in enumerate(wanted)})
        with self._transaction():
            for table, rows in tables.items():
                for columns, values in _grouped(rows):
                    self._db.executemany(f"INSERT INTO {table} ({', '.join(columns)}) "
                                         f"VALUES ({', '.join(['?'] * len(columns))})", values)
        self._sessions.pop(dump.session_id, None)
        return True


def _grouped(rows: list[dict[str, Any]]) -> Iterator[tuple[list[str], list[list[Any]]]]:
    """The rows as (columns, values) for one INSERT (every row of a table has the same columns)."""
    if rows:
        columns = list(rows[0])
        yield columns, [[row[column] for column in columns] for row in rows]
