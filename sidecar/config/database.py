"""Which database a target names: a DuckDB file (a path) or a team's PostgreSQL server (a libpq URL).

A URL is shown, logged and keyed everywhere without its password (``shown``): the password stays in the URL
given, in ``PGPASSWORD`` or in ``~/.pgpass``, where libpq reads it.
"""

from __future__ import annotations

import logging
import os
import re
from urllib.parse import SplitResult, unquote, urlsplit

URL_SCHEMES = ("postgresql", "postgres")
ENV_VARIABLE = "CONTEXT_SIDECAR_DB"
"""The database of every context-sidecar that is given none (``--db`` or the setting ``storage.path``)."""
_SCHEME = re.compile(r"^(postgresql|postgres)://", re.IGNORECASE)


class DatabaseUrlError(ValueError):
    """A PostgreSQL URL that does not parse; the message never holds its password."""


def is_url(target: str | None) -> bool:
    """Whether ``target`` names a PostgreSQL server rather than a DuckDB file."""
    return bool(target) and _SCHEME.match(target or "") is not None


def _split(target: str) -> SplitResult:
    try:
        parts = urlsplit(target)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as error:
        raise DatabaseUrlError(f"the database URL {shown(target)} does not parse ({_reason(error, target)}); "
                               "expected postgresql://USER@HOST:PORT/DATABASE") from None
    return parts


def _reason(error: Exception, target: str) -> str:
    """An error's message with the URL's password, if any, masked."""
    text = " ".join(str(error).split())
    password = _password_text(target)
    return text.replace(password, "***") if password else text


def _password_text(target: str) -> str | None:
    """The password as written in the URL (percent-encoded or not), found without parsing the rest."""
    rest = _SCHEME.sub("", target, count=1)
    userinfo = rest.split("/", 1)[0].rpartition("@")[0]
    if ":" not in userinfo:
        return None
    return userinfo.split(":", 1)[1] or None


def shown(target: str) -> str:
    """``target`` as shown to people and logs: a URL loses its password (``user:***@``); a path stays."""
    if not is_url(target):
        return target
    password = _password_text(target)
    if password is None:
        return target
    return target.replace(":" + password + "@", ":***@", 1)


def password(target: str) -> str | None:
    """The password written in the URL, decoded; None when it has none."""
    found = _password_text(target) if is_url(target) else None
    return unquote(found) if found else None


def without_password(target: str) -> str:
    """The URL with no password at all (for a child process, which then reads it from ``PGPASSWORD``)."""
    found = _password_text(target) if is_url(target) else None
    return target.replace(":" + found + "@", "@", 1) if found else target


def check_url(target: str) -> None:
    """DatabaseUrlError, with a clear message, when the URL does not parse as libpq would read it."""
    parts = _split(target)
    if parts.scheme.lower() not in URL_SCHEMES:
        raise DatabaseUrlError(f"the database URL {shown(target)} does not start with postgresql://")
    from psycopg import conninfo  # only for a URL: psycopg is not loaded for a DuckDB file

    try:
        conninfo.conninfo_to_dict(target)
    except Exception as error:  # psycopg raises ProgrammingError with libpq's words
        raise DatabaseUrlError(f"the database URL {shown(target)} does not parse ({_reason(error, target)}); "
                               "expected postgresql://USER@HOST:PORT/DATABASE") from None


def key(target: str) -> str:
    """The database as every process on it names it: a file's real path, or the URL without its password."""
    if is_url(target):
        return without_password(target)
    return os.path.realpath(os.path.expanduser(target))


def from_environment() -> str | None:
    """The database ``CONTEXT_SIDECAR_DB`` names, if set and not empty."""
    return os.environ.get(ENV_VARIABLE) or None


_URL_PASSWORD = re.compile(r"(postgres(?:ql)?://[^:/@\s'\"]+:)[^@\s'\"]+@", re.IGNORECASE)


def mask_passwords(text: str) -> str:
    """``text`` with the password of every PostgreSQL URL in it masked."""
    return _URL_PASSWORD.sub(r"\1***@", text) if "://" in text else text


class PasswordMask(logging.Filter):
    """A log handler's filter: the password of any PostgreSQL URL in a record is masked (messages at -vv quote
    whole requests, an initialize's settings among them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask_passwords(message)
        if masked is not message and masked != message:
            record.msg, record.args = masked, None
        return True
