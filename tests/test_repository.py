"""What the repository tracks stays inside it: no symbolic link points to an absolute path or out of the tree."""

from __future__ import annotations

import os
import posixpath
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GIT = shutil.which("git")


def links_out(repo: Path) -> list[str]:
    """Tracked symbolic links of ``repo`` whose target is absolute or leaves the repository, as 'path -> target'."""
    listing = subprocess.run([GIT or "git", "-C", str(repo), "ls-files", "-s", "-z"], capture_output=True,
                             check=True).stdout.decode("utf-8", "surrogateescape")
    found = []
    for entry in filter(None, listing.split("\0")):
        meta, path = entry.split("\t", 1)
        mode, blob, _ = meta.split()
        if mode != "120000":
            continue
        target = subprocess.run([GIT or "git", "-C", str(repo), "cat-file", "blob", blob], capture_output=True,
                                check=True).stdout.decode("utf-8", "surrogateescape")
        inside = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
        if posixpath.isabs(target) or inside == ".." or inside.startswith("../"):
            found.append(f"{path} -> {target}")
    return found


def git_repo(tmp_path: Path) -> Path:
    subprocess.run([GIT or "git", "init", "-q", str(tmp_path)], check=True)
    return tmp_path


pytestmark = pytest.mark.skipif(GIT is None or not (ROOT / ".git").exists(), reason="not a git checkout")


def test_no_tracked_link_points_outside_the_repository() -> None:
    assert links_out(ROOT) == []


def test_links_out_finds_absolute_and_escaping_links_and_keeps_inner_ones(tmp_path: Path) -> None:
    repo = git_repo(tmp_path)
    (repo / "docs").mkdir()
    (repo / "docs" / "a.md").write_text("a\n")
    os.symlink("/usr/lib", repo / "absolute")
    os.symlink("../../elsewhere", repo / "docs" / "escaping")
    os.symlink("..", repo / "docs" / "root")
    os.symlink("a.md", repo / "docs" / "inner")
    os.symlink("../docs/a.md", repo / "sideways")
    (repo / "docs" / "sub").mkdir()
    os.symlink("../a.md", repo / "docs" / "sub" / "up")
    subprocess.run([GIT or "git", "-C", str(repo), "add", "-A"], check=True)
    assert sorted(links_out(repo)) == ["absolute -> /usr/lib", "docs/escaping -> ../../elsewhere",
                                       "sideways -> ../docs/a.md"]
