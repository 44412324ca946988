"""Whole sessions between two stores (``db copy``): the tables copied, and positions renumbered in order.

Positions are global in each store, so a session copied in takes new ones, drawn from the store it goes to, in
the same order; every column that holds a position is mapped, and 0 (none) stays 0.
"""

from __future__ import annotations

from typing import Any

from sidecar.rows import SessionDump

COPIED_TABLES = ("sessions", "messages", "context_items", "summaries", "summary_sources", "message_sources",
                 "agent_compactions")
"""Every table of a session's rows, in an order that inserts each row after what it refers to."""
POSITION_COLUMNS = {"sessions": ("first_position", "last_position", "live_after", "pruned_upto"),
                    "messages": ("seq",), "context_items": ("position",)}
"""The columns that hold positions, by table."""


def position_map(dump: SessionDump) -> list[int]:
    """Every position the session's rows hold (0 and None left out), in order."""
    found = {row[column] for table, columns in POSITION_COLUMNS.items() for row in dump.tables.get(table, ())
             for column in columns if row.get(column)}
    return sorted(found)


def renumber(dump: SessionDump, mapping: dict[int, int]) -> dict[str, list[dict[str, Any]]]:
    """The dump's rows with their positions replaced through ``mapping`` (copies; the dump is left as it was)."""
    tables = {table: [dict(row) for row in dump.tables.get(table, ())] for table in COPIED_TABLES}
    for table, columns in POSITION_COLUMNS.items():
        for row in tables[table]:
            for column in columns:
                if row.get(column):
                    row[column] = mapping[row[column]]
    return tables
