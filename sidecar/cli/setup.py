"""``context-sidecar setup claude-code|codex``: the memory tools (and Claude Code's hooks) in the agent's own config.

Every file is read and edited in memory first; if any cannot be edited safely (not valid JSON or TOML, a key of
another type than the agent reads), nothing is written. Each file is then replaced at once (a new file renamed
over it, its mode kept), so the agent never reads half a file.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs

from sidecar.agents import config as agent_config
from sidecar.agents.config import SERVER, claude_files, codex_file
from sidecar.agents.jsonedit import JsonEditError, loads, new_document
from sidecar.agents.tomledit import TomlEditError
from sidecar.cli import setup_record
from sidecar.cli.setup_record import Made
from sidecar.config.database import is_url

AGENTS = ("claude-code", "codex")
Edit = Callable[[str, str], tuple[str, list[str]]]
"""(text, the file's name in messages) -> (new text, what was done)."""


class SetupError(Exception):
    """Setup cannot go on; the message says why and what to do."""


@attrs.define
class Change:
    """One config file: its text before and after (None: no such file), and what changed, in words."""

    path: Path
    before: str | None
    after: str | None
    done: list[str]
    private: bool
    """Created readable by its owner only (a user config; a project's files follow the umask)."""


def command_path() -> str:
    """The absolute path of this ``context-sidecar`` command, as the agents are to start it."""
    argv0 = Path(sys.argv[0])
    if argv0.name == SERVER and argv0.is_file():
        return str(argv0.absolute())
    beside = Path(sys.executable).parent / SERVER  # python -m sidecar in the same environment
    if beside.is_file():
        return str(beside)
    found = shutil.which(SERVER)
    if found:
        return str(Path(found).absolute())
    raise SetupError(f"cannot find the {SERVER} command (install the package so that it is on PATH)")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise SetupError(f"cannot read {path}: {error}") from None


def _edit(path: Path, edit: Edit, kind: str, remove: bool, private: bool, made: Made | None) -> Change:
    """``edit`` applied to the file's text (or, when there is none and something is to be added, to an empty one);
    ``--remove`` also takes out what ``made`` says setup created."""
    before = _read(path)
    if before is None and remove:
        return Change(path, None, None, [], private)
    empty = new_document({}) if kind == "JSON" else ""
    try:
        if kind == "JSON" and before is not None:
            loads(before)
        after, done = edit(before if before is not None else empty, str(path))
        if remove and done and kind == "JSON":
            after = setup_record.prune(after, made)
    except (JsonEditError, TomlEditError) as error:
        raise SetupError(f"{path}: {error}") from None
    except ValueError as error:  # json.JSONDecodeError
        raise SetupError(f"{path} is not valid {kind} ({error})") from None
    if before is None and not done:
        return Change(path, None, None, [], private)
    if remove and made is not None and made.file and after.strip() in ("{}", ""):
        after_text: str | None = None  # setup made it and nothing else is in it: the file goes
    else:
        after_text = after
    return Change(path, before, after_text, done, private)


def plan(agent: str, env: Mapping[str, str], project: Path | None, remove: bool, command: str,
         db: str | None, record: dict[str, Made], allow: bool = True) -> list[Change]:
    """What setup would change, every file checked first; ``record``: what setup created before."""
    private = project is None

    def made(path: Path) -> Made | None:
        return record.get(os.path.realpath(path))

    if agent == "claude-code":
        mcp_path, settings_path = claude_files(env, project)
        return [
            _edit(mcp_path, lambda text, name: agent_config.claude_mcp(text, name, command, db, remove),
                  "JSON", remove, private, made(mcp_path)),
            _edit(settings_path, lambda text, name: agent_config.claude_settings(
                text, name, command, db, remove, project is not None, allow), "JSON", remove, private,
                  made(settings_path)),
        ]
    path = codex_file(env, project)
    return [_edit(path, lambda text, _: agent_config.codex_server(text, command, db, remove), "TOML", remove,
                  private, made(path))]


def remember(env: Mapping[str, str], record: dict[str, Made], changes: list[Change], remove: bool) -> None:
    """Record what the written changes created (``--remove``: forget what they took out)."""
    for change in changes:
        if not change.done:
            continue
        key = os.path.realpath(change.path)
        if remove:
            record.pop(key, None)
        elif change.after is not None:
            json_file = change.path.suffix == ".json"
            made = record.get(key) or Made(file=change.before is None)
            record[key] = setup_record.note(made, change.before, change.after) if json_file else made
    setup_record.save(env, record)


def write(change: Change) -> None:
    """Replace (or create, or delete) the file at once; its mode is kept."""
    path = Path(os.path.realpath(change.path))  # a symlinked dotfile keeps its link
    if change.after is None:
        path.unlink(missing_ok=True)
        if path.parent.name in (".claude", ".codex"):
            with contextlib.suppress(OSError):
                path.parent.rmdir()  # the agent's folder setup created for it, now empty (never one holding anything)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o600 if change.private else 0o666 & ~_umask()
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
            out.write(change.after)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def diff(change: Change) -> str:
    """The change as a unified diff."""
    before = (change.before or "").splitlines(keepends=True)
    after = (change.after or "").splitlines(keepends=True)
    lines = difflib.unified_diff(before, after, fromfile=str(change.path) if change.before is not None else "/dev/null",
                                 tofile=str(change.path) if change.after is not None else "/dev/null")
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def notes(agent: str, env: Mapping[str, str], project: Path | None) -> list[str]:
    """What else the agent needs before it uses a project's files."""
    if project is None:
        return []
    where = os.path.realpath(project)
    if agent == "claude-code":
        if agent_config.claude_trusts(env, where):
            return []
        return [f"Claude Code reads a project's .mcp.json and .claude/settings.json only in a folder you trust: "
                f"run `claude` in {where} once and accept."]
    if agent_config.codex_trusts(env, where):
        return []
    return [f"Codex reads .codex/config.toml only in a trusted project: trust {where} when Codex asks, "
            f"or run `context-sidecar setup codex` for the user config."]


def run_setup(agent: str, project: str | None, dry_run: bool, remove: bool, db: str | None, allow: bool = True) -> int:
    """The command; 0 when everything is (or would be) in place, 1 when nothing could be changed."""
    env = os.environ
    scope = Path(project).resolve() if project is not None else None
    where = f"project {scope}" if scope else "user config"
    title = f"context-sidecar setup {agent}{' --remove' if remove else ''} ({where})"
    try:
        if scope is not None and not scope.is_dir():
            raise SetupError(f"no folder {scope}")
        command = command_path()
        try:
            record = setup_record.load(env)
        except setup_record.RecordUnreadable as error:
            print(f"{title}: {error}; taken as empty"
                  + (": the keys and files setup created stay" if remove else ""), file=sys.stderr)
            record = {}
        target = (db if is_url(db) else os.path.abspath(db)) if db else None  # a team URL goes on as it is
        changes = plan(agent, env, scope, remove, command, target, record, allow)
    except SetupError as error:
        print(f"{title}: {error}; nothing was changed", file=sys.stderr)
        return 1
    print(f"{title}:")
    for change in changes:
        if not change.done:
            state = "no such file" if change.before is None else "nothing of context-sidecar's" if remove \
                else "already set up"
            print(f"  {change.path}: {state}, unchanged")
            continue
        print(f"  {change.path}: {'; '.join(change.done)}" + ("; file removed" if change.after is None else ""))
        if dry_run:
            print("".join(f"    {line}" for line in diff(change).splitlines(keepends=True)), end="")
    if dry_run:
        print("Dry run: nothing was written.")
        return 0
    written: list[Path] = []
    try:
        for change in changes:
            if change.done:
                write(change)
                written.append(change.path)
    except OSError as error:
        print(f"{title}: cannot write {error.filename or ''}: {error.strerror or error}"
              + (f" (written before it: {', '.join(map(str, written))})" if written else "; nothing was changed"),
              file=sys.stderr)
        return 1
    try:
        remember(env, record, changes, remove)
    except OSError as error:
        print(f"{title}: cannot record what setup created in {setup_record.record_path(env)}: "
              f"{error.strerror or error} (--remove will leave its empty keys and files)", file=sys.stderr)
    for note in notes(agent, env, scope) if not remove else []:
        print(f"Note: {note}")
    return 0
