"""Where a database's host listens: a per-user runtime directory only its owner can enter, one socket per file."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from pathlib import Path

from sidecar.config.database import is_url, key

MEMORY = ":memory:"
RUN_USER = "/run/user/{uid}"


class ShareError(Exception):
    """Sharing is impossible or unsafe here; the message says why, naming the path involved."""


def runtime_dir() -> Path:
    """The per-user directory of host sockets, created 0700; refused if another user owns it or can enter it.

    Without XDG_RUNTIME_DIR: ``/run/user/UID`` when it is this user's (what a login session sets that variable
    to), else ``/tmp``, never TMPDIR: agents start their MCP servers with a reduced environment (Codex passes
    neither variable), and every client of a database must find the same socket.
    """
    base = os.environ.get("XDG_RUNTIME_DIR")
    if not (base and os.path.isdir(base)):
        base = RUN_USER.format(uid=os.getuid())
        with contextlib.suppress(OSError):
            if os.stat(base).st_uid == os.getuid() and os.path.isdir(base):
                return _checked(Path(base) / "context-sidecar")
        return _checked(Path("/tmp") / f"context-sidecar-{os.getuid()}")
    return _checked(Path(base) / "context-sidecar")


def _checked(path: Path) -> Path:
    """``path``, created 0700 if missing; ShareError when it is not this user's alone."""
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        info = path.lstat()
    except OSError as error:
        raise ShareError(f"cannot create the socket directory {path}: {error}") from error
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise ShareError(f"socket directory {path} is not a directory owned by uid {os.getuid()}")
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise ShareError(f"socket directory {path} is open to other users (mode {stat.S_IMODE(info.st_mode):o})")
    return path


def database_key(db_path: str) -> str:
    """The database as the host and every relay name it: a file's real path, a URL without its password."""
    return key(db_path)


def socket_path(db_path: str) -> Path:
    """The host socket of this database file."""
    digest = hashlib.sha256(database_key(db_path).encode("utf-8", "surrogateescape")).hexdigest()[:20]
    return runtime_dir() / f"{digest}.sock"


def lock_path(socket: Path) -> Path:
    """The file whose lock is held by whoever is starting the host of ``socket``."""
    return socket.with_suffix(".lock")


def check_owner(db_path: str) -> None:
    """ShareError when the database file exists and belongs to another user."""
    if db_path == MEMORY or is_url(db_path):
        return
    path = database_key(db_path)
    try:
        owner = os.stat(path).st_uid
    except OSError:
        return  # not there yet: it is created as this user
    if owner != os.getuid():
        raise ShareError(f"database {path} is owned by uid {owner}, not by this user (uid {os.getuid()}); "
                         "copy it, or run context-sidecar as its owner")
