"""A workspace's project: its git ``origin`` remote as host/owner/repo, so that two clones are one project.

Read from the repository's config file, without running git (a process start per session would cost more
than the rest of an ingest). A workspace with no repository, or a repository with no ``origin``, has no
project: its sessions are private to their owner in a team database.
"""

from __future__ import annotations

import configparser
import os
import re
from collections.abc import Callable
from pathlib import Path

from sidecar.config.paths import workspace_key
from sidecar.rows import SessionRow

_SCP_LIKE = re.compile(r"^(?:[^@/]+@)?(?P<host>[^:/]+):(?P<path>(?!/).+)$")
"""``git@github.com:owner/repo.git``: git's scp-like syntax (no scheme, a colon before the path)."""


def git_dir(workspace: str) -> Path | None:
    """The git directory of the repository holding ``workspace`` (a worktree's or submodule's main one)."""
    here = Path(workspace).resolve()
    for directory in (here, *here.parents):
        dot_git = directory / ".git"
        if dot_git.is_dir():
            return dot_git
        if dot_git.is_file():  # a worktree or a submodule: "gitdir: PATH"
            try:
                text = dot_git.read_text(errors="replace").strip()
            except OSError:
                return None
            if not text.startswith("gitdir:"):
                return None
            linked = (directory / text.removeprefix("gitdir:").strip()).resolve()
            common = linked / "commondir"  # a worktree shares the main repository's config
            if common.is_file():
                try:
                    return (linked / common.read_text().strip()).resolve()
                except OSError:
                    return linked
            return linked
    return None


def origin_url(workspace: str) -> str | None:
    """The ``origin`` remote's URL in the repository's config, or None."""
    directory = git_dir(workspace)
    if directory is None:
        return None
    parser = configparser.RawConfigParser(strict=False)
    try:
        parser.read(directory / "config", encoding="utf-8")
    except (configparser.Error, OSError, UnicodeDecodeError):
        return None
    section = 'remote "origin"'
    if not parser.has_section(section):
        return None
    url = parser.get(section, "url", fallback="").strip().strip('"')
    return url or None


def normalize_remote(url: str) -> str | None:
    """A remote URL as ``host/owner/repo``: no scheme, user, password, port or ``.git``; the host lower-cased.

    ``git@github.com:Acme/App.git``, ``https://user:token@github.com/Acme/App`` and
    ``ssh://git@github.com:22/Acme/App.git`` are all ``github.com/Acme/App``. A local path is None (no project
    two machines can share).
    """
    url = url.strip()
    if "://" in url:
        scheme, _, rest = url.partition("://")
        if scheme.lower() == "file":
            return None
        authority, _, path = rest.partition("/")
        host = authority.rpartition("@")[2]
        # An IPv6 literal keeps its brackets and loses its port, as any host does.
        host = host[:host.index("]") + 1] if host.startswith("[") else host.split(":", 1)[0]
    else:
        match = _SCP_LIKE.match(url)
        if match is None or os.path.exists(url):
            return None
        host, path = match.group("host"), match.group("path")
    path = path.strip("/")
    if path.endswith(".git"):
        path = path[:-4]
    path = path.rstrip("/")
    if not host or not path:
        return None
    return f"{host.lower()}/{path}"


def project_of(workspace: str | None) -> str | None:
    """The project of a workspace directory: its normalized ``origin`` remote, or None."""
    if not workspace:
        return None
    url = origin_url(workspace)
    return normalize_remote(url) if url else None


def of_workspace(workspace: str) -> Callable[[SessionRow], bool]:
    """Whether a session belongs to ``workspace``: stored from it, or from another clone of its project."""
    key = workspace_key(workspace)
    project = project_of(key)
    return lambda row: row.workspace == key or (project is not None and row.project == project)
