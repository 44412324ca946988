"""Who reads what in a team database: grants of projects to member roles, made by the database's owner.

A grant is a row of ``grants`` (which row-level security reads on every query, so a revoke holds from the next
query on, in every host) and, for a role's first grant, the table privileges a member needs; its last revoke
takes them back. Members must be ordinary roles: a superuser, a role with BYPASSRLS or the owner itself would
read every row, so none is granted.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from sidecar.rows import StorageFailure
from sidecar.storage.postgres.migrations import CHANNEL, READ_ONLY_TABLES, TABLES


def _check_owner(db: psycopg.Connection) -> None:
    row = db.execute("SELECT tableowner = current_user, current_user FROM pg_tables "
                     "WHERE schemaname = current_schema() AND tablename = 'grants'").fetchone()
    if row is None:
        raise StorageFailure("the database has no context-sidecar schema; its owner runs: context-sidecar --db URL "
                             "db migrate")
    if not row[0]:
        raise StorageFailure(f"role {row[1]} does not own the team database; grants are made by its owner")


def _check_member(db: psycopg.Connection, role: str) -> None:
    found = db.execute("SELECT rolsuper OR rolbypassrls, rolname = current_user FROM pg_roles WHERE rolname = %s",
                       [role]).fetchone()
    if found is None:
        raise StorageFailure(f"there is no role {role} on this server; the server's admin creates it first "
                             f"(CREATE ROLE {role} LOGIN)")
    if found[1]:
        raise StorageFailure(f"role {role} owns the database and reads every row; members are other roles")
    if found[0]:
        raise StorageFailure(f"role {role} is a superuser or has BYPASSRLS, so row-level security would not apply "
                             "to it; a member must be an ordinary role")


def _privileges(role: str, give: bool) -> list[sql.Composed]:
    """The statements granting (or revoking) what a member needs of the tables."""
    who = sql.Identifier(role)
    tables = sql.SQL(", ").join(sql.Identifier(table) for table in TABLES)
    read_only = sql.SQL(", ").join(sql.Identifier(table) for table in READ_ONLY_TABLES)
    if give:
        return [sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(tables, who),
                sql.SQL("GRANT SELECT ON {} TO {}").format(read_only, who),
                sql.SQL("GRANT USAGE ON SEQUENCE positions TO {}").format(who)]
    return [sql.SQL("REVOKE ALL ON {} FROM {}").format(tables, who),
            sql.SQL("REVOKE ALL ON {} FROM {}").format(read_only, who),
            sql.SQL("REVOKE ALL ON SEQUENCE positions FROM {}").format(who)]


def grant(db: psycopg.Connection, role: str, project: str) -> bool:
    """Let ``role`` read the sessions of ``project``; False when it could already."""
    with db.transaction():
        _check_owner(db)
        _check_member(db, role)
        added = db.execute("INSERT INTO grants (role, project) VALUES (%s, %s) ON CONFLICT DO NOTHING RETURNING 1",
                           [role, project]).fetchall()
        for statement in _privileges(role, True):
            db.execute(statement)
        db.execute("SELECT pg_notify(%s, 'grants')", [CHANNEL])
    return bool(added)


def revoke(db: psycopg.Connection, role: str, project: str) -> bool:
    """Stop ``role`` reading the sessions of ``project`` (from its next query on); False when it could not."""
    with db.transaction():
        _check_owner(db)
        removed = db.execute("DELETE FROM grants WHERE role = %s AND project = %s RETURNING 1",
                             [role, project]).fetchall()
        left = db.execute("SELECT 1 FROM grants WHERE role = %s", [role]).fetchall()
        if not left and db.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchall():
            for statement in _privileges(role, False):
                db.execute(statement)
        db.execute("SELECT pg_notify(%s, 'grants')", [CHANNEL])
    return bool(removed)


def grants(db: psycopg.Connection) -> list[tuple[str, str]]:
    """Every grant as (role, project), sorted."""
    _check_owner(db)
    return [(role, project) for role, project in
            db.execute("SELECT role, project FROM grants ORDER BY role, project").fetchall()]
