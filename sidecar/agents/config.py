"""What ``context-sidecar setup`` writes into Claude Code's and Codex's own config files, which files those are,
and how it finds its entries again.

Each edit takes a file's text and returns the new text with what was done, in words; the text is edited in place
(``jsonedit``, ``tomledit``), so everything else in the file keeps its bytes.
"""

from __future__ import annotations

import functools
import operator
import os
import shlex
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sidecar.agents import jsonedit, locations
from sidecar.agents.jsonedit import JsonEditError, drop_items, drop_member, ensure_item, ensure_member, walk
from sidecar.agents.locations import ENV_NAMES
from sidecar.agents.tomledit import TomlEditError, loads, remove_table, set_table

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


def claude_files(env: Mapping[str, str], project: Path | None) -> tuple[Path, Path]:
    """(where Claude Code reads MCP servers, its settings file), of the user or of a project."""
    if project is not None:
        return project / ".mcp.json", project / ".claude" / "settings.json"
    return locations.claude_user_config(env), locations.claude_settings(env)


def codex_file(env: Mapping[str, str], project: Path | None) -> Path:
    """Codex's config.toml: the user's, or a project's ``.codex/config.toml``."""
    return project / ".codex" / "config.toml" if project is not None else locations.codex_config(env)


def claude_trusts(env: Mapping[str, str], folder: str) -> bool:
    """Whether the user accepted Claude Code's trust dialog for ``folder`` (it reads the project's files then)."""
    config, _ = claude_files(env, None)
    try:
        projects = jsonedit.loads(config.read_text(encoding="utf-8"))[0].get("projects", {})
        return bool(projects.get(folder, {}).get("hasTrustDialogAccepted"))
    except (OSError, ValueError, AttributeError):
        return False


def codex_trusts(env: Mapping[str, str], folder: str) -> bool:
    """Whether the user config trusts ``folder`` or a folder above it (Codex reads a project's config then)."""
    try:
        projects = tomllib.loads(codex_file(env, None).read_text(encoding="utf-8")).get("projects", {})
    except (OSError, tomllib.TOMLDecodeError):
        return False
    folders = [folder, *map(str, Path(folder).parents)]
    return any(isinstance(projects.get(f), dict) and projects[f].get("trust_level") == "trusted" for f in folders)


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


# Claude Code

def claude_mcp(text: str, name: str, command: str, db: str | None, remove: bool) -> tuple[str, list[str]]:
    """``mcpServers.context-sidecar`` in ``~/.claude.json`` or a project's ``.mcp.json``."""
    if remove:
        walk(text, name, ["mcpServers", SERVER])
        text, removed = drop_member(text, name, ["mcpServers"], SERVER)
        return text, [f"removed the MCP server {SERVER}"] if removed else []
    entry = {"type": "stdio", "command": command, "args": server_args(db)}
    text, done = ensure_member(text, name, ["mcpServers"], SERVER, entry)
    return text, [f"{done} the MCP server {SERVER} ({shlex.join([command, *server_args(db)])})"] if done else []


def claude_settings(text: str, name: str, command: str, db: str | None, remove: bool,
                    project: bool, allow: bool = True) -> tuple[str, list[str]]:
    """The hooks, the permission for the server's tools (unless not ``allow``: then one there is taken out) and, in
    a project, the approval of its ``.mcp.json`` entry."""
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
        if remove or (not allow and value == TOOLS_PERMISSION):
            walk(text, name, path)
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
    found, groups = walk(text, name, ["hooks", event])
    if len(found) < 2:
        groups = []
    elif not isinstance(groups, list):
        raise JsonEditError(f"{name}: hooks.{event} is not an array")
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
        return text, changed
    text, _ = ensure_item(text, name, ["hooks", event], group)
    return text, True


# Codex

CODEX_SHELL = "/bin/sh"
CODEX_LAUNCHER = 'c=$0 f=$1; shift; "$c" "$@" && exit 0; exec python3 -Ic "$f" "$c" "$?"'
"""How Codex starts the server (``sh -c LAUNCHER COMMAND STAND_IN ARGS…``): the command, and should it not run or
end in error (its checkout moved, its Python gone), ``CODEX_STAND_IN`` in its place. Codex waits only for a
required server, and starts no session when one fails."""
CODEX_STAND_IN = """\
import json, sys
why = (f"context-sidecar cannot run here: {sys.argv[1]} exited {sys.argv[2]} (moved, or its Python gone?); "
       "install it again, then run `context-sidecar setup codex`")
print(why, file=sys.stderr, flush=True)
results = {"tools/list": {"tools": []}, "ping": {},
           "tools/call": {"content": [{"type": "text", "text": "Error: " + why}], "isError": True}}
def reply(m):
    if not isinstance(m, dict) or "id" not in m or "method" not in m:
        return None
    if m["method"] == "initialize":
        version = (m.get("params") or {}).get("protocolVersion") or "2025-06-18"
        return {"jsonrpc": "2.0", "id": m["id"], "result": {"protocolVersion": version, "instructions": why,
                "capabilities": {"tools": {}}, "serverInfo": {"name": "context-sidecar", "version": "unavailable"}}}
    if m["method"] in results:
        return {"jsonrpc": "2.0", "id": m["id"], "result": results[m["method"]]}
    return {"jsonrpc": "2.0", "id": m["id"], "error": {"code": -32601, "message": why}}
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    out = [r for r in map(reply, m) if r] if isinstance(m, list) else reply(m)
    if out:
        print(json.dumps(out), flush=True)
"""
"""A stand-in MCP server of the standard library (``python3 -I``): it initializes, offers no tool, and says why."""
CODEX_STARTUP_SECONDS = 30
"""``startup_timeout_sec`` (Codex's default is 10): a required server's start, on a busy machine, may take longer."""


def codex_server(text: str, command: str, db: str | None, remove: bool) -> tuple[str, list[str]]:
    """``[mcp_servers.context-sidecar]``: required (``codex exec`` waits for no optional server), started through
    ``CODEX_LAUNCHER`` so that a broken install never stops Codex, tools approved, the variables of
    ``CODEX_ENV_VARS`` passed on."""
    if remove:
        new = remove_table(text, CODEX_TABLE)
        return new, [f"removed [mcp_servers.{SERVER}]"] if new != text else []
    servers = loads(text).get(CODEX_TABLE[0])
    existing = servers.get(SERVER) if isinstance(servers, dict) else None
    values = {"command": CODEX_SHELL, "args": ["-c", CODEX_LAUNCHER, command, CODEX_STAND_IN, *server_args(db)],
              "required": True, "default_tools_approval_mode": "approve", "env_vars": _codex_env_vars(text)}
    if not (isinstance(existing, dict) and "startup_timeout_sec" in existing):  # the user's own is kept
        values["startup_timeout_sec"] = CODEX_STARTUP_SECONDS
    new = set_table(text, CODEX_TABLE, values)
    if new == text:
        return text, []
    verb = "updated" if f"[mcp_servers.{SERVER}]" in text else "added"
    return new, [f"{verb} [mcp_servers.{SERVER}] ({shlex.join([command, *server_args(db)])}, through {CODEX_SHELL}: "
                 "a stand-in without tools should it not run; required, its tools approved, its variables passed on)"]


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
