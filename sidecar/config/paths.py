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
