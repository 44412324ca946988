"""``context-sidecar db …`` and ``team …``: a team database's schema, copies of sessions, and who reads what.

Each failure is one line on stderr (exit 1), with the URL shown without its password; nothing is written then.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sidecar.config.database import is_url, shown
from sidecar.rows import StorageFailure, StorageLocked

DB_DESCRIPTION = """\
migrate: create or upgrade the schema of the team database --db URL (run by the role that owns the database, an
  ordinary role; members' sidecars never change the schema and say so when it is missing or older).
copy: copy every session of --from into --to, ids kept, as the connecting role's rows; a session already in --to is
  left alone, so a second run copies nothing. From a team database, only the connecting role's own sessions."""
TEAM_DESCRIPTION = """\
grant ROLE --project PROJECT: let the member role ROLE read the sessions of PROJECT (a workspace's git origin as
  host/owner/repo, e.g. github.com/acme/app); revoke takes it back from the member's next query on, in every
  running sidecar; list prints one line per grant: ROLE PROJECT. Run by the database's owner, with --db URL."""


def add_commands(commands: Any, in_command: argparse.ArgumentParser) -> None:
    """The ``db`` and ``team`` commands."""
    db = commands.add_parser("db", parents=[in_command], help="a team database's schema; copy sessions between "
                                                                "databases", description=DB_DESCRIPTION,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = db.add_subparsers(dest="db_action", metavar="action", required=True)
    actions.add_parser("migrate", parents=[in_command], help="create or upgrade the team database's schema")
    copy = actions.add_parser("copy", parents=[in_command], help="copy sessions from one database to another")
    copy.add_argument("--from", dest="source", required=True, metavar="FILE|URL", help="where the sessions are")
    copy.add_argument("--to", dest="target", required=True, metavar="FILE|URL", help="where they go")
    team = commands.add_parser("team", parents=[in_command], help="who reads which project's sessions",
                               description=TEAM_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = team.add_subparsers(dest="team_action", metavar="action", required=True)
    for verb, text in (("grant", "let ROLE read PROJECT's sessions"), ("revoke", "take a grant back")):
        parser = verbs.add_parser(verb, parents=[in_command], help=text)
        parser.add_argument("role", metavar="ROLE", help="the member's PostgreSQL role")
        parser.add_argument("--project", required=True, metavar="PROJECT", help="host/owner/repo")
    verbs.add_parser("list", parents=[in_command], help="one line per grant: ROLE PROJECT")


def _fail(message: str) -> int:
    print(f"context-sidecar: {message}", file=sys.stderr)
    return 1


def run_db(args: argparse.Namespace) -> int:
    """``db migrate`` or ``db copy``."""
    try:
        if args.db_action == "migrate":
            return _migrate(args.db)
        return _copy(args.source, args.target)
    except (StorageFailure, StorageLocked) as error:
        return _fail(str(error))


def _owner_connection(url: str | None) -> Any:
    """A connection for the owner's commands, or StorageFailure saying what is wrong."""
    if not url or not is_url(url):
        raise StorageFailure("this needs --db postgresql://OWNER@HOST:PORT/DATABASE, the team database")
    from sidecar.storage.postgres.connection import connect

    return connect(url)


def _migrate(url: str | None) -> int:
    import psycopg

    from sidecar.storage.postgres.connection import failure
    from sidecar.storage.postgres.migrations import MIGRATIONS, migrate, schema_state

    db = _owner_connection(url)
    assert url is not None
    try:
        state = schema_state(db)
        if state is not None and state.unknown:
            return _fail(f"the team database {shown(url)} was migrated by a newer context-sidecar (it has "
                         f"{', '.join(state.unknown)}); upgrade context-sidecar")
        try:
            applied = migrate(db)
        except psycopg.errors.InsufficientPrivilege:
            role = db.execute("SELECT current_user").fetchone()[0]
            return _fail(f"role {role} cannot change the schema of {shown(url)}: db migrate is run by the role that "
                         "owns the database")
        except psycopg.Error as error:
            raise failure(error, url) from None
    finally:
        db.close()
    if applied:
        print(f"{shown(url)}: applied {len(applied)} migrations ({', '.join(applied)})")
    else:
        print(f"{shown(url)}: the schema is up to date ({MIGRATIONS[-1][0]})")
    return 0


def _copy(source: str, target: str) -> int:
    from sidecar.storage import open_store

    if not is_url(source) and not _exists(source):
        return _fail(f"{source} does not exist")
    origin = open_store(source)
    try:
        destination = open_store(target)
        try:
            copied = kept = messages = 0
            for session in origin.sessions():
                dump = origin.dump_session(session.session_id)
                if dump is None:
                    continue  # a teammate's session, readable here but not ours to copy
                if destination.load_session(dump):
                    copied += 1
                    messages += len(dump.tables["messages"])
                else:
                    kept += 1
        finally:
            destination.close()
    finally:
        origin.close()
    there = f"; {kept} already in {shown(target)}, left as they are" if kept else ""
    print(f"copied {copied} sessions ({messages} messages) from {shown(source)} to {shown(target)}{there}")
    return 0


def _exists(path: str) -> bool:
    import os

    return os.path.exists(path)


def run_team(args: argparse.Namespace) -> int:
    """``team grant``, ``team revoke`` or ``team list``."""
    from sidecar.storage.postgres import team

    try:
        db = _owner_connection(args.db)
        try:
            if args.team_action == "list":
                for role, project in team.grants(db):
                    print(f"{role} {project}")
                return 0
            if args.team_action == "grant":
                done = team.grant(db, args.role, args.project)
                print(f"granted {args.role} {args.project}" if done else f"{args.role} already reads {args.project}")
                return 0
            done = team.revoke(db, args.role, args.project)
            print(f"revoked {args.role} {args.project}" if done else f"{args.role} had no grant of {args.project}")
            return 0
        finally:
            db.close()
    except StorageFailure as error:
        return _fail(str(error))
    except Exception as error:  # psycopg's, from a statement: one line, the password masked
        import psycopg

        from sidecar.storage.postgres.connection import failure

        if isinstance(error, psycopg.Error):
            return _fail(str(failure(error, args.db)))
        raise
