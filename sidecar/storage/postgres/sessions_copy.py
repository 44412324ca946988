"""Whole sessions in and out of a team database (``db copy``): this role's own, verbatim, ids kept."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import psycopg

from sidecar.rows import SessionDump
from sidecar.storage.copying import COPIED_TABLES, position_map, renumber
from sidecar.storage.postgres.lineage import shared_summary
from sidecar.storage.postgres.positions import Positions
from sidecar.storage.postgres.writes import shared_message
from sidecar.storage.secrets import redact


class PgCopies:
    """The part of PgStorage that dumps and loads whole sessions."""

    _transaction: Callable[[], AbstractContextManager[psycopg.Connection]]
    _notify: Callable[[psycopg.Connection, str], None]
    _positions: Positions

    def dump_session(self, session_id: str) -> SessionDump | None:
        """Every row of one of this role's sessions, verbatim (the owner's text where a secret was replaced)."""
        with self._transaction() as db:
            if not db.execute("SELECT 1 FROM sessions WHERE session_id = %s AND owner = current_user",
                              [session_id]).fetchall():
                return None
            tables: dict[str, list[dict[str, Any]]] = {}
            for table in COPIED_TABLES:
                cursor = db.execute(f"SELECT * FROM {table} WHERE session_id = %s", [session_id])
                names = [column.name for column in cursor.description or ()]
                tables[table] = [{name: value for name, value in zip(names, row, strict=True) if name != "owner"}
                                 for row in cursor.fetchall()]
            private = {(kind, ref): value for kind, ref, value in db.execute(
                "SELECT kind, ref_id, value FROM private_values WHERE session_id = %s", [session_id]).fetchall()}
        for row in tables["messages"]:
            row.update(private.get(("message", row["id"]), {}))
        for row in tables["summaries"]:
            row.update(private.get(("summary", row["id"]), {}))
        for row in tables["message_sources"]:
            if ("lines", row["id"]) in private:
                row["lines"] = json.dumps(private["lines", row["id"]]["lines"], ensure_ascii=False)
        for row in tables["agent_compactions"]:
            row.update(private.get(("compaction", row["summary_id"]), {}))
        return SessionDump(session_id, tables)

    def load_session(self, dump: SessionDump) -> bool:
        """Store a dumped session as this role's, under its ids, in one transaction; False if the id exists here."""
        with self._transaction() as db:
            if db.execute("SELECT 1 FROM sessions WHERE session_id = %s", [dump.session_id]).fetchall():
                return False
            wanted = position_map(dump)
            tables = renumber(dump, dict(zip(wanted, self._positions.take(len(wanted)), strict=True)))
            private: list[tuple[str, str, str]] = []
            for row in tables["messages"]:
                raw, text, verbatim = shared_message(row["raw"], row["text"])
                row["raw"], row["text"] = raw, text
                if verbatim is not None:
                    private.append(("message", row["id"], json.dumps(verbatim, ensure_ascii=False)))
            for row in tables["summaries"]:
                summary, verbatim = shared_summary(_summary_of(row))
                row.update(content=summary.content, rules=summary.rules, rules_left_out=summary.rules_left_out)
                if verbatim is not None:
                    private.append(("summary", row["id"], json.dumps(verbatim, ensure_ascii=False)))
            for row in tables["message_sources"]:
                lines = json.loads(row["lines"])
                shared_lines = [redact(line) for line in lines]
                if shared_lines != lines:
                    row["lines"] = json.dumps(shared_lines, ensure_ascii=False)
                    private.append(("lines", row["id"], json.dumps({"lines": lines}, ensure_ascii=False)))
            for row in tables["agent_compactions"]:
                text = redact(row["text"])
                if text is not row["text"]:
                    private.append(("compaction", row["summary_id"], json.dumps({"text": row["text"]})))
                    row["text"] = text
            for table in COPIED_TABLES:
                rows = tables[table]
                if not rows:
                    continue
                columns = list(rows[0])
                db.cursor().executemany(
                    f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))})",
                    [[row[column] for column in columns] for row in rows])
            if private:
                db.cursor().executemany("INSERT INTO private_values (session_id, kind, ref_id, value) "
                                        "VALUES (%s, %s, %s, %s)", [(dump.session_id, *row) for row in private])
            self._notify(db, dump.session_id)
        return True


def _summary_of(row: dict[str, Any]) -> Any:
    from sidecar.rows import SummaryRow

    return SummaryRow(**{key: value for key, value in row.items() if key != "session_id"})
