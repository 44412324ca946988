"""Finding a workspace's transcripts: where each agent keeps them, and which of those files are the workspace's.

A file is the workspace's when the working directory its first lines record is (read once per file): Codex's dated
tree, pi's custom session directory and the directories a client names hold every working directory's, and a Claude
Code or pi project directory is named after its workspace lossily (``foo_bar``, ``foo-bar`` and ``foo.bar`` share
one), so a file there counts by name only when it records no working directory. Directories are listed again only
when their modification time changed (or was within RACY_NS of the last listing), so a look costs a stat per
directory and no read of what was seen before.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from sidecar.agents import locations

log = logging.getLogger(__name__)

PROBE_LINES = 20
"""Lines read at most to find the working directory a transcript records."""
PROBE_BYTES = 1 << 20
"""Bytes read at most for that (a first prompt with a pasted image can be long)."""
PROBE_CHUNK = 1 << 16
RACY_NS = 2_000_000_000
"""A listing taken less than this after the directory's mtime is not cached (the mtime's granularity may be coarse)."""


@attrs.frozen
class Source:
    """A directory where an agent keeps transcripts."""

    agent: str
    """claude-code, codex, pi, or ``any`` for a directory the client named (each file's format is detected)."""
    path: Path
    by_cwd: bool
    """Files of other working directories are here too: a file is the workspace's when its recorded cwd is."""
    named: bool = False
    """The directory is named after the workspace: a file that records no cwd is the workspace's."""
    pattern: str = "*.jsonl"
    recursive: bool = False
    nested: str | None = None
    """When set, files in subdirectories count only under a directory of this name (Claude Code's subagents)."""


def sources(workspace: str, env: Mapping[str, str], directories: Sequence[str] = ()) -> list[Source]:
    """Where the workspace's transcripts may be, for a client with environment ``env``."""
    found = [Source("claude-code", path, by_cwd=True, named=len(path.name) <= locations.CLAUDE_NAME_LIMIT,
                    recursive=True, nested="subagents") for path in locations.claude_project_dirs(env, workspace)]
    found.append(Source("codex", locations.codex_sessions_dir(env), by_cwd=True, pattern="rollout-*.jsonl",
                        recursive=True))
    found += [Source("pi", path, by_cwd=True, named=True) for path in locations.pi_session_dirs(env, workspace)]
    custom = locations.pi_custom_session_dir(env)
    if custom is not None:
        found.append(Source("pi", custom, by_cwd=True))
    found += [Source("any", Path(directory).expanduser(), by_cwd=True, recursive=True) for directory in directories]
    return list(dict.fromkeys(found))


@attrs.define
class DirectoryState:
    """What the last look found of a source directory."""

    source: Source
    exists: bool = False
    problem: str | None = None


def _key(path: str) -> str:
    """A working directory compared as the sidecar compares workspaces: absolute, symlinks resolved."""
    return os.path.realpath(os.path.expanduser(path))


class Scanner:
    """Finds the transcript files of one workspace in its sources, looking again only at what changed."""

    def __init__(self, workspace: str, found: list[Source]) -> None:
        self.workspace = _key(workspace)
        self.sources = found
        self.states = [DirectoryState(source) for source in found]
        self._listings: dict[str, tuple[int, list[str], list[str]]] = {}
        """Per directory: (mtime_ns, its transcript files, its subdirectories) when last listed."""
        self._cwds: dict[tuple[int, int], str | None] = {}
        """Per file (device, inode): the working directory its first lines record (None: none, or no file of ours)."""
        self._unsure: dict[tuple[int, int], int] = {}
        """Per file whose first lines do not tell yet: its size then (read again once it changed)."""
        self._said: set[str] = set()

    def scan(self) -> dict[Path, str]:
        """Every transcript file of the workspace now, with the agent it belongs to."""
        files: dict[Path, str] = {}
        for state in self.states:
            source = state.source
            try:
                listed = self._walk(source.path, source)
            except OSError as error:
                exists = not isinstance(error, FileNotFoundError)
                problem = None if not exists else f"cannot read {source.path}: {error.strerror or error}"
                if problem and problem not in self._said:
                    self._said.add(problem)
                    log.warning("%s", problem)
                state.exists, state.problem = exists, problem
                continue
            state.exists, state.problem = True, None
            for path in listed:
                if not source.by_cwd or self._belongs(path, source.agent, source.named):
                    files.setdefault(path, source.agent)
        return files

    def _walk(self, top: Path, source: Source) -> list[Path]:
        """The source's transcript files under ``top`` (raises OSError for ``top`` itself only)."""
        found: list[Path] = []
        pending: list[tuple[str, bool]] = [(str(top), True)]
        first = True
        while pending:
            directory, counts = pending.pop()
            try:
                files, subdirectories = self._list(directory, source.pattern)
            except OSError:
                if first:
                    raise
                continue  # a subdirectory that went away or cannot be read: its files are not ours to see
            first = False
            if counts:
                found += (Path(directory, name) for name in files)
            if source.recursive:
                pending += ((os.path.join(directory, name), source.nested is None or name == source.nested or
                             (counts and directory != str(top))) for name in subdirectories)
        return found

    def _list(self, directory: str, pattern: str) -> tuple[list[str], list[str]]:
        """(transcript files, subdirectories) of a directory, from the cache while its mtime is unchanged."""
        mtime = os.stat(directory).st_mtime_ns
        cached = self._listings.get(directory)
        if cached is not None and cached[0] == mtime:
            return cached[1], cached[2]
        listed_at = time.time_ns()
        files: list[str] = []
        subdirectories: list[str] = []
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    subdirectories.append(entry.name)
                elif fnmatch.fnmatchcase(entry.name, pattern):
                    files.append(entry.name)
        files.sort()
        if listed_at - mtime >= RACY_NS:
            self._listings[directory] = (mtime, files, subdirectories)
        else:  # a file made later within the same mtime tick would not change the mtime (git's racy rule)
            self._listings.pop(directory, None)
        return files, subdirectories

    def _belongs(self, path: Path, agent: str, named: bool) -> bool:
        """Whether the working directory the file records is the workspace (read once per file); ``named``: a file
        recording none is."""
        try:
            info = os.stat(path)
        except OSError:
            return False
        key = (info.st_dev, info.st_ino)
        if key not in self._cwds:
            if self._unsure.get(key) == info.st_size:
                return False
            cwd, final = recorded_cwd(path, agent)
            if not final:
                self._unsure[key] = info.st_size  # no whole line yet: looked at again once it grew
                return False
            self._unsure.pop(key, None)
            if cwd is None and agent == "codex" and str(path) not in self._said:
                self._said.add(str(path))
                log.info("%s has no session_meta on its first line: not a rollout of a known workspace; skipped",
                         path)
            self._cwds[key] = None if cwd is None else _key(cwd)
        return self._cwds[key] == self.workspace or (named and self._cwds[key] is None)


def recorded_cwd(path: Path, agent: str) -> tuple[str | None, bool]:
    """The working directory a transcript's first lines record, and whether that is final.

    Codex: ``session_meta.cwd`` of the first line (a rollout without it is no workspace's). Claude Code and pi: the
    first ``cwd`` of the first lines (none when the first is no JSON object). Not final while the whole lines read
    name no cwd and are fewer than PROBE_LINES.
    """
    head = b""
    try:
        with path.open("rb") as fh:
            while len(head) < PROBE_BYTES:
                chunk = fh.read(PROBE_CHUNK)
                head += chunk
                if not chunk or head.count(b"\n") >= (1 if agent == "codex" else PROBE_LINES):
                    break
    except OSError:
        return None, False
    lines = head.split(b"\n")
    complete = lines[:-1] if len(head) < PROBE_BYTES else lines[:-1] or lines
    if not complete:
        return None, False
    for index, line in enumerate(complete[:PROBE_LINES]):
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            obj = None
        if not isinstance(obj, dict):
            if index == 0 and agent in ("claude-code", "pi"):
                return None, True  # no transcript of theirs: it records no cwd, ever
            continue
        if obj.get("type") == "session_meta" and isinstance(obj.get("payload"), dict):
            cwd = obj["payload"].get("cwd")
            return (cwd if isinstance(cwd, str) and cwd else None), True
        if agent == "codex" and index == 0:
            return None, True  # a rollout opens with its session_meta
        if isinstance(obj.get("cwd"), str) and obj["cwd"]:
            return obj["cwd"], True
    return None, len(complete) >= PROBE_LINES or len(head) >= PROBE_BYTES
