"""Where the database lives: one file in the per-user data directory, for every workspace."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

import platformdirs

from sidecar.config.database import from_environment


def default_storage_path(workspace_root: str | None = None) -> str:
    """The per-user database, one for every workspace (sessions record theirs)."""
    return str(Path(platformdirs.user_data_dir("context-sidecar", appauthor=False)) / "memory.duckdb")


def default_database(workspace_root: str | None = None) -> str:
    """The database of a sidecar given none: ``CONTEXT_SIDECAR_DB`` if set, else the per-user file."""
    return from_environment() or default_storage_path(workspace_root)


def missing_directory(path: str) -> str | None:
    """Why a database file cannot be made at ``path`` without making directories nobody asked for, else None.

    Only the per-user data directory is made when missing: a path the user typed is taken as it is, so that a typo
    does not leave a tree of directories behind (as root, ``/nonexistent/dir/``). URLs and ``:memory:`` are not
    files.
    """
    if path == ":memory:" or "://" in path:
        return None
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(directory) or directory == os.path.dirname(default_storage_path()):
        return None
    if os.path.exists(directory):
        return f"{directory} is not a directory"
    return f"no directory {directory} (create it, or correct the path)"


def legacy_workspace_path(workspace_root: str) -> str:
    """Where versions before sharing kept a workspace's own database; merged into the per-user one on first use."""
    base = Path(platformdirs.user_data_dir("context-sidecar", appauthor=False))
    root = os.path.abspath(workspace_root)
    digest = hashlib.sha256(root.encode()).hexdigest()[:12]
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in os.path.basename(root) or "root")
    return str(base / "workspaces" / f"{name}-{digest}.duckdb")


def workspace_key(path: str) -> str:
    """A workspace directory as sessions record it: absolute, symlinks resolved."""
    return os.path.realpath(os.path.expanduser(path))


def workspace_path(root_uri: str | None, folder_uri: str | None, root_path: str | None) -> str | None:
    """The client's workspace as a path: its first folder, else its root URI, else its root path."""
    uri = folder_uri or root_uri
    if uri:
        parsed = urlparse(uri)
        return unquote(parsed.path) if parsed.scheme == "file" else None
    return root_path
