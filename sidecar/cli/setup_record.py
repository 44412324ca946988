"""What ``setup`` created, so that ``--remove`` takes out exactly that: the files it made, and the keys it added
that hold an object or array (``hooks``, ``permissions.allow``, …). A container the user had, even an empty one,
and a file the user had, even one left empty, are never removed.

The record is ``$XDG_STATE_HOME/context-sidecar/setup.json`` (default ``~/.local/state``), each config file by its
real path; an unreadable record is reported and taken as none (``--remove`` then takes out the entries only).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from sidecar.agents import jsonedit


@attrs.define
class Made:
    """What setup created in one config file."""

    file: bool = False
    keys: list[list[str]] = attrs.field(factory=list)
    """Paths of object keys whose object or array value setup added."""


def record_path(env: Mapping[str, str]) -> Path:
    """Where the record is kept for a user with environment ``env``."""
    state = env.get("XDG_STATE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".local", "state")
    return Path(state) / "context-sidecar" / "setup.json"


class RecordUnreadable(Exception):
    """The record is there but cannot be read; the message says why."""


def load(env: Mapping[str, str]) -> dict[str, Made]:
    """The record (empty when there is none); RecordUnreadable when it is there but cannot be read."""
    path = record_path(env)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {str(path): Made(bool(entry.get("file")), [list(map(str, key)) for key in entry.get("keys", [])])
                for path, entry in data.items()}
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise RecordUnreadable(f"cannot read {path}: {error.strerror or error}") from None
    except (ValueError, AttributeError, TypeError):
        raise RecordUnreadable(f"{path} is not a record setup wrote") from None


def save(env: Mapping[str, str], record: dict[str, Made]) -> None:
    """Replace the record at once; without entries it goes (with its folder when that is empty)."""
    path = record_path(env)
    if not record:
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            path.parent.rmdir()
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=".setup.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump({key: attrs.asdict(made) for key, made in sorted(record.items())}, out, indent=2)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def container_keys(value: Any, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """The paths of object keys (through objects only) whose value is an object or array."""
    found: set[tuple[str, ...]] = set()
    if isinstance(value, dict):
        for key, child in value.items():
            if isinstance(child, (dict, list)):
                found.add((*prefix, key))
                found |= container_keys(child, (*prefix, key))
    return found


def note(made: Made | None, before: str | None, after: str) -> Made:
    """``made`` (a new record when None) with what setup created going from ``before`` to ``after``."""
    made = made if made is not None else Made(file=before is None)
    old = container_keys(jsonedit.loads(before)[0]) if before is not None else set()
    added = container_keys(jsonedit.loads(after)[0]) - old
    made.keys = [list(key) for key in sorted({*(tuple(key) for key in made.keys), *added})]
    return made


def prune(text: str, made: Made | None) -> str:
    """``text`` without the containers setup created that are empty now, deepest first."""
    for key in sorted(made.keys if made else [], key=len, reverse=True):
        with contextlib.suppress(KeyError, IndexError, TypeError):
            if jsonedit.value_at(text, key) in ({}, []):
                text = jsonedit.drop_key(text, key[:-1], key[-1])
    return text
