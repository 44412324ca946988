"""Where Claude Code, Codex and pi keep their transcripts and config, from the environment of the client that asks.

The one place this knowledge lives: the host follows these files (``memory/watch``), the hooks and the MCP server
name them. Every function takes the environment as a mapping, so a host serves clients whose HOME or agent
directories differ from its own.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

ENV_NAMES = ("HOME", "CLAUDE_CONFIG_DIR", "CODEX_HOME", "PI_CODING_AGENT_DIR", "PI_CODING_AGENT_SESSION_DIR")
"""The environment variables that decide where the agents write their transcripts."""
AGENTS = ("claude-code", "codex", "pi")
CLAUDE_NAME_LIMIT = 200
"""Claude Code cuts a project directory's name at this many characters and appends a hash of the whole path."""
_NOT_ALPHANUMERIC = re.compile(r"[^a-zA-Z0-9]")


def agent_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of ``ENV_NAMES`` set in ``env`` (this process's environment when None)."""
    source = os.environ if env is None else env
    return {name: source[name] for name in ENV_NAMES if source.get(name)}


def home(env: Mapping[str, str]) -> Path:
    """The user's home directory as the agents see it."""
    return Path(env.get("HOME") or os.path.expanduser("~"))


def _expand(value: str, env: Mapping[str, str]) -> Path:
    """A configured directory, with ``~`` meaning the home of ``env``."""
    if value == "~" or value.startswith("~/"):
        return home(env) / value[2:]
    return Path(value)


def claude_config_dir(env: Mapping[str, str]) -> Path:
    """Claude Code's configuration directory: ``$CLAUDE_CONFIG_DIR``, else ``~/.claude``."""
    configured = env.get("CLAUDE_CONFIG_DIR")
    return _expand(configured, env) if configured else home(env) / ".claude"


def claude_user_config(env: Mapping[str, str]) -> Path:
    """The file of Claude Code's user-scope MCP servers and its own state (2.1): ``<config dir>/.config.json`` where
    that exists, else ``.claude.json`` in ``$CLAUDE_CONFIG_DIR``, else in the home directory."""
    legacy = claude_config_dir(env) / ".config.json"
    if legacy.is_file():
        return legacy
    configured = env.get("CLAUDE_CONFIG_DIR")
    return (_expand(configured, env) if configured else home(env)) / ".claude.json"


def claude_settings(env: Mapping[str, str]) -> Path:
    """Claude Code's user settings (hooks, permissions): ``<config dir>/settings.json``."""
    return claude_config_dir(env) / "settings.json"


def claude_project_name(cwd: str) -> str:
    """The directory name Claude Code gives the sessions started in ``cwd``: every non-alphanumeric character as -.

    Longer names are cut at 200 characters and get a hash of the path appended (see ``claude_project_dirs``).
    """
    return _NOT_ALPHANUMERIC.sub("-", cwd)


def claude_project_dirs(env: Mapping[str, str], workspace: str) -> list[Path]:
    """The directories holding the Claude Code transcripts of sessions started in ``workspace``.

    The workspace as given and with symlinks resolved (Claude Code names the directory after its working
    directory); for a path whose name is cut, every directory with the cut name and a hash (which one is the
    workspace's is told by the ``cwd`` its transcripts record).
    """
    projects = claude_config_dir(env) / "projects"
    found: list[Path] = []
    for path in dict.fromkeys((os.path.abspath(workspace), os.path.realpath(workspace))):
        name = claude_project_name(path)
        if len(name) <= CLAUDE_NAME_LIMIT:
            found.append(projects / name)
            continue
        prefix = name[:CLAUDE_NAME_LIMIT] + "-"
        try:
            found += sorted(entry for entry in projects.iterdir() if entry.name.startswith(prefix))
        except OSError:
            continue
    return list(dict.fromkeys(found))


def codex_home(env: Mapping[str, str]) -> Path:
    """Codex's home: ``$CODEX_HOME``, else ``~/.codex``."""
    configured = env.get("CODEX_HOME")
    return _expand(configured, env) if configured else home(env) / ".codex"


def codex_config(env: Mapping[str, str]) -> Path:
    """Codex's user config: ``<CODEX_HOME>/config.toml``."""
    return codex_home(env) / "config.toml"


def codex_sessions_dir(env: Mapping[str, str]) -> Path:
    """Where Codex writes its rollouts, as ``YYYY/MM/DD/rollout-*.jsonl`` (the workspace is ``session_meta.cwd``)."""
    return codex_home(env) / "sessions"


def pi_agent_dir(env: Mapping[str, str]) -> Path:
    """pi's agent directory: ``$PI_CODING_AGENT_DIR``, else ``~/.pi/agent``."""
    configured = env.get("PI_CODING_AGENT_DIR")
    return _expand(configured, env) if configured else home(env) / ".pi" / "agent"


def pi_project_name(cwd: str) -> str:
    """The directory name pi gives the sessions started in ``cwd``: ``--`` + the path without its leading
    separator, separators and colons as ``-``, + ``--``."""
    return "--" + re.sub(r"[/\\:]", "-", re.sub(r"^[/\\]", "", cwd)) + "--"


def pi_session_dirs(env: Mapping[str, str], workspace: str) -> list[Path]:
    """pi's directories of the workspace's sessions (as given and with symlinks resolved)."""
    sessions = pi_agent_dir(env) / "sessions"
    return list(dict.fromkeys(sessions / pi_project_name(path)
                              for path in (os.path.abspath(workspace), os.path.realpath(workspace))))


def pi_custom_session_dir(env: Mapping[str, str]) -> Path | None:
    """``$PI_CODING_AGENT_SESSION_DIR``: one directory for the sessions of every working directory, if set."""
    configured = env.get("PI_CODING_AGENT_SESSION_DIR")
    return _expand(configured, env) if configured else None
