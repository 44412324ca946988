"""What ``setup`` writes into Claude Code's and Codex's own config files, and how it finds its entries again.

Each function takes a file's text and returns the new text with what was done, in words; the text is edited in
place (``jsonedit``, ``tomledit``), so everything else in the file keeps its bytes.
"""

from __future__ import annotations

import functools
import operator
import os
import shlex
from collections.abc import Callable, Sequence
from typing import Any

from sidecar.agents.locations import ENV_NAMES
from sidecar.tools import jsonedit
from sidecar.tools.tomledit import TomlEditError, loads, remove_table, set_table

SERVER = "context-sidecar"
TOOLS_PERMISSION = f"mcp__{SERVER}"
"""Claude Code's permission rule for every tool of the server (``-p`` calls nothing without one)."""
HOOK_EVENTS = (("PreCompact", None), ("SessionStart", "compact"), ("PostCompact", None))
"""Claude Code events the hook handles, with their matcher."""
HOOK_TIMEOUT = 30
"""Seconds Claude Code lets the hook run (the hook gives up after 20)."""
CODEX_TABLE = ("mcp_servers", SERVER)
CODEX_ENV_VARS = ("XDG_RUNTIME_DIR", "XDG_DATA_HOME", "XDG_STATE_HOME", *(name for name in ENV_NAMES if name != "HOME"))
"""Passed on to the server by name when Codex has them (``env_vars``): Codex 0.169 starts an MCP server with HOME,
PATH, LANG, SHELL and TERM only, and these decide the database, its host's socket and the log the server uses, and
where the agents keep their transcripts. Without them the server would miss the host an editor or Claude Code
started. Unset ones stay unset."""


class ConfigError(ValueError):
    """A config file setup cannot edit safely: not valid, or a key of another type than Claude Code reads."""


def server_args(db: str | None) -> list[str]:
    """The MCP server's arguments after the command."""
    return ["mcp", "--db", db] if db else ["mcp"]


def hook_command(command: str, db: str | None) -> str:
    """The shell command Claude Code runs for each hook."""
    argv = [command, "hook", "claude-code", *(["--db", db] if db else [])]
    return " ".join(shlex.quote(arg) for arg in argv)


def is_our_hook(hook: Any) -> bool:
    """A Claude Code command hook that runs some ``context-sidecar hook claude-code``."""
    if not isinstance(hook, dict) or not isinstance(hook.get("command"), str):
        return False
    try:
        argv = shlex.split(hook["command"])
    except ValueError:
        return False
    return len(argv) >= 3 and os.path.basename(argv[0]) == SERVER and argv[1:3] == ["hook", "claude-code"]


def _value(text: str, path: Sequence[str | int]) -> Any:
    value = jsonedit.loads(text)[0]
    for step in path:
        value = value[step]
    return value


def _objects(text: str, name: str, path: list[str]) -> tuple[list[str], Any]:
    """(the part of ``path`` that exists, its value); ConfigError when a step is not an object."""
    value = jsonedit.loads(text)[0]
    if not isinstance(value, dict):
        raise ConfigError(f"{name} does not hold a JSON object")
    found: list[str] = []
    for key in path:
        if key not in value:
            break
        value = value[key]
        found.append(key)
        if not isinstance(value, dict) and len(found) < len(path):
            raise ConfigError(f"{name}: {'.'.join(found)} is not an object")
    return found, value


def _nest(keys: list[str], leaf: Any) -> Any:
    for key in reversed(keys):
        leaf = {key: leaf}
    return leaf


def ensure_member(text: str, name: str, path: list[str], key: str, value: dict[str, Any]) -> tuple[str, str | None]:
    """``path.key`` holding ``value``'s keys (other keys of an existing entry kept); (text, "added"/"updated"/None)."""
    found, node = _objects(text, name, [*path, key])
    if len(found) == len(path) + 1:
        if not isinstance(node, dict):
            raise ConfigError(f"{name}: {'.'.join([*path, key])} is not an object")
        if all(node.get(k) == v for k, v in value.items()):
            return text, None
        return jsonedit.replace(text, [*path, key], {**node, **value}), "updated"
    if found != path:
        nested = _nest([*path[len(found) + 1:], key], value)
        return jsonedit.append(text, list(found), path[len(found)], nested), "added"
    return jsonedit.append(text, list(path), key, value), "added"


def ensure_item(text: str, name: str, path: list[str], item: Any,
                stale: Callable[[Any], bool] = lambda _: False) -> tuple[str, str | None]:
    """The array at ``path`` holding ``item``, items ``stale`` says are ours taken out; (text, what was done)."""
    found, node = _objects(text, name, path)
    if len(found) == len(path):
        if not isinstance(node, list):
            raise ConfigError(f"{name}: {'.'.join(path)} is not an array")
        if item in node:
            return text, None
        text, removed = drop_items(text, name, path, stale, prune=False)
        return jsonedit.append(text, list(path), None, item), "updated" if removed else "added"
    return jsonedit.append(text, list(found), path[len(found)], _nest(path[len(found) + 1:], [item])), "added"


def drop_items(text: str, name: str, path: Sequence[str | int], ours: Callable[[Any], bool],
               prune: bool = True) -> tuple[str, bool]:
    """The array at ``path`` without the items ``ours`` picks (emptied containers removed); (text, any removed)."""
    try:
        node = _value(text, path)
    except (KeyError, IndexError, TypeError):
        return text, False
    if not isinstance(node, list):
        raise ConfigError(f"{name}: {'.'.join(map(str, path))} is not an array")
    removed = False
    for index in reversed(range(len(node))):
        if ours(node[index]):
            text = jsonedit.remove(text, path, index)
            removed = True
    return (_prune(text, path) if prune and removed else text), removed


def drop_member(text: str, name: str, path: list[str], key: str) -> tuple[str, bool]:
    """``path`` without ``key`` (emptied containers removed); (text, whether it was there)."""
    try:
        node = _value(text, path)
    except (KeyError, TypeError):
        return text, False
    if not isinstance(node, dict) or key not in node:
        return text, False
    text = jsonedit.remove(text, path, list(node).index(key))
    return _prune(text, path), True


def _prune(text: str, path: Sequence[str | int]) -> str:
    """Remove the containers along ``path`` that are now empty, deepest first (never the document itself)."""
    while path and _value(text, path) in ({}, []):
        parent, step = path[:-1], path[-1]
        container = _value(text, parent)
        index = list(container).index(step) if isinstance(step, str) else step
        text = jsonedit.remove(text, parent, index)
        path = parent
    return text


# Claude Code

def claude_mcp(text: str, name: str, command: str, db: str | None, remove: bool) -> tuple[str, list[str]]:
    """``mcpServers.context-sidecar`` in ``~/.claude.json`` or a project's ``.mcp.json``."""
    if remove:
        _objects(text, name, ["mcpServers", SERVER])
        text, removed = drop_member(text, name, ["mcpServers"], SERVER)
        return text, [f"removed the MCP server {SERVER}"] if removed else []
    entry = {"type": "stdio", "command": command, "args": server_args(db)}
    text, done = ensure_member(text, name, ["mcpServers"], SERVER, entry)
    return text, [f"{done} the MCP server {SERVER} ({shlex.join([command, *server_args(db)])})"] if done else []


def claude_settings(text: str, name: str, command: str, db: str | None, remove: bool,
                    project: bool) -> tuple[str, list[str]]:
    """The hooks, the permission for the server's tools and, in a project, the approval of its ``.mcp.json`` entry."""
    done: list[str] = []
    hooks: list[str] = []
    for event, matcher in HOOK_EVENTS:
        label = f"{event} ({matcher})" if matcher else event
        text, changed = _claude_hook(text, name, event, matcher, hook_command(command, db), remove)
        if changed:
            hooks.append(label)
    if hooks:
        done.append(f"{'removed' if remove else 'added'} the hooks {', '.join(hooks)}")
    entries = [("permissions.allow", ["permissions", "allow"], TOOLS_PERMISSION, "allowed its tools")]
    if project:
        entries.append(("enabledMcpjsonServers", ["enabledMcpjsonServers"], SERVER, "approved .mcp.json's server"))
    for label, path, value, what in entries:
        if remove:
            _objects(text, name, path)
            text, removed = drop_items(text, name, path, functools.partial(operator.eq, value))
            if removed:
                done.append(f"removed {label} {value}")
        else:
            text, added = ensure_item(text, name, path, value)
            if added:
                done.append(f"{what} ({label} {value})")
    return text, done


def _claude_hook(text: str, name: str, event: str, matcher: str | None, command: str,
                 remove: bool) -> tuple[str, bool]:
    """One event's matcher group running the hook; groups of ours that differ (another path) taken out first."""
    found, groups = _objects(text, name, ["hooks", event])
    if len(found) < 2:
        groups = []
    elif not isinstance(groups, list):
        raise ConfigError(f"{name}: hooks.{event} is not an array")
    group: dict[str, Any] = {"matcher": matcher} if matcher else {}
    group["hooks"] = [{"type": "command", "command": command, "timeout": HOOK_TIMEOUT}]
    if not remove and group in groups:
        return text, False
    changed = False
    for index in reversed(range(len(groups))):
        inner = groups[index].get("hooks") if isinstance(groups[index], dict) else None
        if not isinstance(inner, list) or not any(is_our_hook(hook) for hook in inner):
            continue
        if all(is_our_hook(hook) for hook in inner):
            text = jsonedit.remove(text, ["hooks", event], index)
        else:  # a group of the user's that also runs ours: only ours goes
            for position in reversed(range(len(inner))):
                if is_our_hook(inner[position]):
                    text = jsonedit.remove(text, ["hooks", event, index, "hooks"], position)
        changed = True
    if remove:
        return (_prune(text, ["hooks", event]) if changed else text), changed
    text, _ = ensure_item(text, name, ["hooks", event], group)
    return text, True


# Codex

def codex_server(text: str, command: str, db: str | None, remove: bool) -> tuple[str, list[str]]:
    """``[mcp_servers.context-sidecar]``: required (``codex exec`` starts no optional server), tools approved, the
    variables of ``CODEX_ENV_VARS`` passed on."""
    if remove:
        new = remove_table(text, CODEX_TABLE)
        return new, [f"removed [mcp_servers.{SERVER}]"] if new != text else []
    values = {"command": command, "args": server_args(db), "required": True, "default_tools_approval_mode": "approve",
              "env_vars": _codex_env_vars(text)}
    new = set_table(text, CODEX_TABLE, values)
    if new == text:
        return text, []
    verb = "updated" if f"[mcp_servers.{SERVER}]" in text else "added"
    return new, [f"{verb} [mcp_servers.{SERVER}] ({shlex.join([command, *server_args(db)])}, required, "
                 "its tools approved, its variables passed on)"]


def _codex_env_vars(text: str) -> list[Any]:
    """The server's ``env_vars``: those already there (a user's own kept, in their order), then ours missing."""
    servers = loads(text).get(CODEX_TABLE[0])
    server = servers.get(SERVER) if isinstance(servers, dict) else None
    existing = server.get("env_vars", []) if isinstance(server, dict) else []  # set_table names a wrong type
    if not isinstance(existing, list):
        raise TomlEditError(f"mcp_servers.{SERVER}.env_vars is not an array")
    # An entry is a name, or a table naming one ({name = "X", source = "local"}).
    named = {entry if isinstance(entry, str) else entry.get("name") for entry in existing
             if isinstance(entry, (str, dict))}
    return [*existing, *(name for name in CODEX_ENV_VARS if name not in named)]
