"""``context-sidecar setup claude-code|codex``: the agents' own config files edited in place, and undone exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import attrs
import pytest

from sidecar.agents.config import CODEX_ENV_VARS, CODEX_LAUNCHER, CODEX_STAND_IN, is_our_hook

COMMAND = str(Path(sys.executable).parent / "context-sidecar")
HOOK = f"{COMMAND} hook claude-code"
# ~/.claude.json as Claude Code 2.1 writes it: two-space indentation, no final newline, its own state beside.
CLAUDE_JSON = json.dumps({
    "numStartups": 3,
    "mcpServers": {"github": {"type": "stdio", "command": "gh-mcp", "args": [], "env": {"TOKEN_FILE": "~/.gh"}}},
    "projects": {"/srv/shop": {"allowedTools": [], "hasTrustDialogAccepted": True}},
    "userID": "0f3c",
}, indent=2)
SETTINGS = """{
    "model": "opus",
    "hooks": {
        "PreCompact": [
            {"hooks": [{"type": "command", "command": "notify-send compacting"}]}
        ],
        "Stop": [{"hooks": [{"type": "command", "command": "say done"}]}]
    },
    "permissions": {"allow": ["Bash(npm test)"], "deny": ["Read(.env)"]}
}
"""
CODEX_TOML = """\
model = "gpt-5.1-codex"  # the default
approval_policy = "on-request"

[model_providers.local]
base_url = "http://localhost:8080/v1"
wire_api = "responses"

[mcp_servers.docs]
command = "docs-mcp"
args = ["--stdio"]

[projects."/srv/shop"]
trust_level = "trusted"
"""


@attrs.frozen
class Run:
    code: int
    out: str
    err: str


def setup(home: Path, *args: str, cwd: Path | None = None, **env: str) -> Run:
    """The command as a user runs it, with ``home`` as HOME."""
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("CLAUDE_CONFIG_DIR", "CODEX_HOME")}
    environment.update(HOME=str(home), XDG_STATE_HOME=str(home.parent / "state"), **env)
    done = subprocess.run([sys.executable, "-m", "sidecar", "setup", *args], capture_output=True, text=True,
                          timeout=60, env=environment, cwd=cwd or home, check=False)
    return Run(done.returncode, done.stdout, done.stderr)


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` and its bytes."""
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    (path / ".claude").mkdir(parents=True)
    (path / ".claude.json").write_text(CLAUDE_JSON)
    (path / ".claude" / "settings.json").write_text(SETTINGS)
    (path / ".codex").mkdir()
    (path / ".codex" / "config.toml").write_text(CODEX_TOML)
    return path


def our_groups(settings: dict, event: str) -> list[dict]:
    return [group for group in settings["hooks"][event] if any(is_our_hook(h) for h in group["hooks"])]


def test_claude_code_user_config_gets_the_server_hooks_and_permission(home):
    run = setup(home, "claude-code")
    assert run.code == 0, run.err
    config = json.loads((home / ".claude.json").read_text())
    assert config["mcpServers"]["context-sidecar"] == {"type": "stdio", "command": COMMAND, "args": ["mcp"]}
    assert config["mcpServers"]["github"]["env"] == {"TOKEN_FILE": "~/.gh"} and config["userID"] == "0f3c"
    settings = json.loads((home / ".claude" / "settings.json").read_text())
    for event, matcher in (("PreCompact", None), ("SessionStart", "compact"), ("PostCompact", None)):
        [group] = our_groups(settings, event)
        assert group.get("matcher") == matcher
        assert group["hooks"] == [{"type": "command", "command": HOOK, "timeout": 30}]
    assert settings["hooks"]["PreCompact"][0]["hooks"][0]["command"] == "notify-send compacting", "theirs stays first"
    assert settings["hooks"]["Stop"] and settings["model"] == "opus"
    assert settings["permissions"] == {"allow": ["Bash(npm test)", "mcp__context-sidecar"], "deny": ["Read(.env)"]}
    assert "added the MCP server context-sidecar" in run.out and "added the hooks PreCompact" in run.out
    assert (home / ".claude.json").read_text().startswith('{\n  "numStartups": 3,\n  "mcpServers": {\n    "github"')
    assert '\n        "PreCompact": [\n            {"hooks"' in (home / ".claude" / "settings.json").read_text()


def test_no_allow_leaves_the_permission_out_takes_it_back_and_remove_still_gives_back_the_original(home):
    original = snapshot(home)
    run = setup(home, "claude-code", "--no-allow")
    assert run.code == 0, run.err
    settings = json.loads((home / ".claude" / "settings.json").read_text())
    assert settings["permissions"] == {"allow": ["Bash(npm test)"], "deny": ["Read(.env)"]}
    assert our_groups(settings, "PreCompact") and "allowed its tools" not in run.out
    assert setup(home, "claude-code").code == 0  # a yes later
    said_no = setup(home, "claude-code", "--no-allow")  # and a no again
    assert "removed permissions.allow mcp__context-sidecar" in said_no.out
    assert json.loads((home / ".claude" / "settings.json").read_text())["permissions"]["allow"] == ["Bash(npm test)"]
    assert setup(home, "claude-code", "--remove").code == 0
    assert snapshot(home) == original


def test_no_allow_in_an_empty_home_and_remove_leave_nothing(tmp_path):
    home = tmp_path / "empty-home"
    home.mkdir()
    assert setup(home, "claude-code", "--no-allow").code == 0
    settings = json.loads((home / ".claude" / "settings.json").read_text())
    assert "permissions" not in settings and set(settings["hooks"]) == {"PreCompact", "SessionStart", "PostCompact"}
    assert setup(home, "claude-code", "--remove").code == 0
    assert list(home.iterdir()) == []


def test_no_allow_is_for_claude_code_only(home):
    original = snapshot(home)
    run = setup(home, "codex", "--no-allow")
    assert run.code == 2 and "--no-allow is for claude-code" in run.err and snapshot(home) == original


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_twice_changes_nothing_and_remove_gives_back_the_original_bytes(home, agent):
    original = snapshot(home)
    assert setup(home, agent).code == 0
    once = snapshot(home)
    assert once != original
    again = setup(home, agent)
    assert again.code == 0 and snapshot(home) == once
    assert again.out.count("already set up, unchanged") == (2 if agent == "claude-code" else 1)
    removed = setup(home, agent, "--remove")
    assert removed.code == 0 and "removed" in removed.out
    assert snapshot(home) == original
    assert setup(home, agent, "--remove").out.count("nothing of context-sidecar's, unchanged") >= 1


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_files_setup_created_are_gone_after_remove(tmp_path, agent):
    home = tmp_path / "empty-home"
    home.mkdir()
    assert setup(home, agent).code == 0
    assert snapshot(home)
    assert setup(home, agent, "--remove").code == 0
    assert list(home.iterdir()) == [], "no file and no folder of setup's is left"


def test_claude_config_dir_is_honoured(home, tmp_path):
    config_dir = tmp_path / "claude-config"
    before = snapshot(home)
    assert setup(home, "claude-code", CLAUDE_CONFIG_DIR=str(config_dir)).code == 0
    assert snapshot(home) == before
    assert "context-sidecar" in json.loads((config_dir / ".claude.json").read_text())["mcpServers"]
    assert our_groups(json.loads((config_dir / "settings.json").read_text()), "PostCompact")


def test_a_legacy_config_json_is_where_the_servers_go(home):
    legacy = home / ".claude" / ".config.json"
    legacy.write_text("{}")
    assert setup(home, "claude-code").code == 0
    assert "context-sidecar" in json.loads(legacy.read_text())["mcpServers"]
    assert "context-sidecar" not in (home / ".claude.json").read_text()


def test_codex_config_gets_a_required_server_whose_tools_need_no_approval(home):
    run = setup(home, "codex")
    assert run.code == 0, run.err
    config = tomllib.loads((home / ".codex" / "config.toml").read_text())
    server = config["mcp_servers"]["context-sidecar"]
    passed = server.pop("env_vars")  # Codex gives its MCP servers few variables: these find the shared host
    assert server == {"command": "/bin/sh", "args": ["-c", CODEX_LAUNCHER, COMMAND, CODEX_STAND_IN, "mcp"],
                      "required": True, "default_tools_approval_mode": "approve", "startup_timeout_sec": 30}
    assert {"XDG_RUNTIME_DIR", "XDG_DATA_HOME", "XDG_STATE_HOME", "CODEX_HOME", "CLAUDE_CONFIG_DIR"} <= set(passed)
    assert config["mcp_servers"]["docs"] == {"command": "docs-mcp", "args": ["--stdio"]}
    assert config["projects"]["/srv/shop"]["trust_level"] == "trusted" and config["approval_policy"] == "on-request"
    assert (home / ".codex" / "config.toml").read_text().startswith(CODEX_TOML)


def test_an_older_install_is_updated_and_what_the_user_added_kept(home):
    config = json.loads(CLAUDE_JSON)
    config["mcpServers"]["context-sidecar"] = {"type": "stdio", "command": "/old/bin/context-sidecar", "args": ["mcp"],
                                               "env": {"CONTEXT_SIDECAR_X": "1"}}
    (home / ".claude.json").write_text(json.dumps(config, indent=2))
    old_hook = {"type": "command", "command": "/old/bin/context-sidecar hook claude-code"}
    mine = {"type": "command", "command": "my-precompact-script"}
    settings = {"hooks": {"PreCompact": [{"hooks": [mine, old_hook]}], "PostCompact": [{"hooks": [old_hook]}]}}
    (home / ".claude" / "settings.json").write_text(json.dumps(settings, indent=2))
    old_table = '[mcp_servers.context-sidecar]\ncommand = "/old/bin/context-sidecar"\nstartup_timeout_sec = 20\n'
    (home / ".codex" / "config.toml").write_text(CODEX_TOML + "\n" + old_table)
    assert setup(home, "claude-code").code == 0
    assert setup(home, "codex").code == 0
    server = json.loads((home / ".claude.json").read_text())["mcpServers"]["context-sidecar"]
    assert server == {"type": "stdio", "command": COMMAND, "args": ["mcp"], "env": {"CONTEXT_SIDECAR_X": "1"}}
    hooks = json.loads((home / ".claude" / "settings.json").read_text())["hooks"]
    assert hooks["PreCompact"][0] == {"hooks": [mine]}, "only ours left the user's group"
    assert [group["hooks"][0]["command"] for group in hooks["PostCompact"]] == [HOOK], "the old one replaced"
    codex = tomllib.loads((home / ".codex" / "config.toml").read_text())["mcp_servers"]["context-sidecar"]
    assert codex["args"][2] == COMMAND and codex["startup_timeout_sec"] == 20 and codex["required"] is True
    assert "XDG_DATA_HOME" in codex["env_vars"]


def test_names_the_user_passes_to_the_codex_server_are_kept_and_ours_added(home):
    mine = ('[mcp_servers.context-sidecar]\ncommand = "/old/bin/context-sidecar"\n'
            'env_vars = ["OPENAI_API_KEY", { name = "XDG_DATA_HOME", source = "local" }]\n')
    (home / ".codex" / "config.toml").write_text(CODEX_TOML + "\n" + mine)
    assert setup(home, "codex").code == 0
    once = snapshot(home)
    passed = tomllib.loads((home / ".codex" / "config.toml").read_text())["mcp_servers"]["context-sidecar"]["env_vars"]
    assert passed[:2] == ["OPENAI_API_KEY", {"name": "XDG_DATA_HOME", "source": "local"}]
    assert passed[2:] == [name for name in CODEX_ENV_VARS if name != "XDG_DATA_HOME"], "each name once"
    again = setup(home, "codex")
    assert again.code == 0 and "already set up" in again.out and snapshot(home) == once
    (home / ".codex" / "config.toml").write_text('[mcp_servers.context-sidecar]\nenv_vars = "HOME"\n')
    wrong = setup(home, "codex")
    assert wrong.code == 1 and "env_vars is not an array" in wrong.err and "nothing was changed" in wrong.err


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_dry_run_shows_a_diff_and_writes_nothing(home, agent):
    before = snapshot(home)
    run = setup(home, agent, "--dry-run")
    assert run.code == 0
    assert snapshot(home) == before
    assert "Dry run: nothing was written." in run.out
    assert ("+[mcp_servers.context-sidecar]" if agent == "codex" else '+    "context-sidecar": {') in run.out
    assert setup(home, agent).code == 0
    installed = snapshot(home)
    run = setup(home, agent, "--remove", "--dry-run")
    assert snapshot(home) == installed
    assert ("-[mcp_servers.context-sidecar]" if agent == "codex" else '-    "context-sidecar": {') in run.out


BROKEN = {
    "claude-code settings not JSON": ("claude-code", ".claude/settings.json", '{"hooks": {}', "is not valid JSON"),
    "claude-code config not JSON": ("claude-code", ".claude.json", "{'mcpServers': {}}", "is not valid JSON"),
    "claude-code hooks an array": ("claude-code", ".claude/settings.json", '{"hooks": []}', "hooks is not an object"),
    "claude-code event an object": ("claude-code", ".claude/settings.json", '{"hooks": {"PreCompact": {}}}',
                                    "hooks.PreCompact is not an array"),
    "claude-code servers a string": ("claude-code", ".claude.json", '{"mcpServers": "x"}',
                                     "mcpServers is not an object"),
    "claude-code allow a string": ("claude-code", ".claude/settings.json", '{"permissions": {"allow": "x"}}',
                                   "permissions.allow is not an array"),
    "claude-code config an array": ("claude-code", ".claude.json", "[]", "does not hold a JSON object"),
    "codex not TOML": ("codex", ".codex/config.toml", 'model = "o3\n', "not valid TOML"),
    "codex inline server": ("codex", ".codex/config.toml", 'mcp_servers = { context-sidecar = { command = "x" } }\n',
                            "by hand"),
    "codex servers a string": ("codex", ".codex/config.toml", 'mcp_servers = "x"\n', "mcp_servers is not a table"),
}


@pytest.mark.parametrize("case", list(BROKEN))
@pytest.mark.parametrize("remove", [False, True])
def test_a_config_setup_cannot_edit_safely_is_refused_and_nothing_changes(home, case, remove):
    agent, name, text, reason = BROKEN[case]
    (home / name).write_text(text)
    before = snapshot(home)
    run = setup(home, agent, *(["--remove"] if remove else []))
    assert run.code == 1, run
    assert str(home / name) in run.err and reason in run.err and "nothing was changed" in run.err
    assert run.out == ""
    assert snapshot(home) == before


def test_claude_code_project_files(home, tmp_path):
    project = tmp_path / "shop"
    project.mkdir()
    before = snapshot(home)
    run = setup(home, "claude-code", "--project", cwd=project)
    assert run.code == 0, run.err
    assert snapshot(home) == before, "the user config is left alone"
    servers = json.loads((project / ".mcp.json").read_text())["mcpServers"]
    assert servers == {"context-sidecar": {"type": "stdio", "command": COMMAND, "args": ["mcp"]}}
    settings = json.loads((project / ".claude" / "settings.json").read_text())
    assert settings["enabledMcpjsonServers"] == ["context-sidecar"]
    assert settings["permissions"]["allow"] == ["mcp__context-sidecar"] and our_groups(settings, "SessionStart")
    assert f"run `claude` in {project} once" in run.out, "an untrusted folder is named"
    assert setup(home, "claude-code", "--project", str(project), "--remove").code == 0
    assert list(project.iterdir()) == []


def test_codex_project_file_and_its_trust(home, tmp_path):
    project = tmp_path / "shop"
    project.mkdir()
    run = setup(home, "codex", "--project", str(project))
    assert run.code == 0, run.err
    assert tomllib.loads((project / ".codex" / "config.toml").read_text())["mcp_servers"]["context-sidecar"]
    assert f"trust {project} when Codex asks" in run.out
    (home / ".codex" / "config.toml").write_text(CODEX_TOML + f'\n[projects."{tmp_path}"]\ntrust_level = "trusted"\n')
    assert "Note" not in setup(home, "codex", "--project", str(project)).out, "a trusted parent folder counts"


def test_the_db_option_reaches_the_server_and_the_hooks(home, tmp_path):
    db = tmp_path / "team.duckdb"
    assert setup(home, "claude-code", "--db", str(db)).code == 0
    server = json.loads((home / ".claude.json").read_text())["mcpServers"]["context-sidecar"]
    assert server["args"] == ["mcp", "--db", str(db)]
    settings = json.loads((home / ".claude" / "settings.json").read_text())
    assert our_groups(settings, "PreCompact")[0]["hooks"][0]["command"] == f"{HOOK} --db {db}"


def test_a_missing_project_folder_is_refused(home, tmp_path):
    run = setup(home, "codex", "--project", str(tmp_path / "nowhere"))
    assert run.code == 1 and "no folder" in run.err


@pytest.mark.parametrize(("name", "original"), [
    ("settings.json", '{\n  "permissions": {\n    "allow": [],\n    "deny": []\n  }\n}\n'),
    ("settings.json", '{\n  "hooks": {}\n}\n'),
    ("settings.json", '{}\n'),
    ("settings.json", '{"permissions": {"allow": []}, "hooks": {"PreCompact": []}}'),
    (".claude.json", '{\n  "mcpServers": {}\n}'),
    (".claude.json", '{"mcpServers": {"x": 1, "x": 2}}'),
])
def test_remove_keeps_the_users_own_empty_keys_and_files(tmp_path, name, original):
    home = tmp_path / "home"
    path = home / (".claude" if name == "settings.json" else "") / name
    path.parent.mkdir(parents=True)
    path.write_text(original)
    assert setup(home, "claude-code").code == 0
    assert path.read_text() != original
    assert setup(home, "claude-code", "--remove").code == 0
    assert path.read_text() == original
    assert not (tmp_path / "state" / "context-sidecar").exists(), "the record of what setup made goes with it"


def test_an_unreadable_record_is_reported_and_remove_takes_out_only_setups_entries(tmp_path):
    home = tmp_path / "home"
    settings = home / ".claude" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text("{}\n")
    assert setup(home, "claude-code").code == 0
    record = tmp_path / "state" / "context-sidecar" / "setup.json"
    record.write_text("not json")
    run = setup(home, "claude-code", "--remove")
    assert run.code == 0, run.err
    assert f"{record} is not a record setup wrote; taken as empty" in run.err
    # Setup's entries are gone; the keys it made for them stay, empty, as nothing says they were not the user's.
    assert json.loads(settings.read_text()) == {"hooks": {"PreCompact": [], "SessionStart": [], "PostCompact": []},
                                                "permissions": {"allow": []}}
    assert "context-sidecar" not in (home / ".claude.json").read_text()


def test_a_user_config_emptied_of_ours_stays_when_the_user_had_it(tmp_path):
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text("")
    assert setup(home, "codex").code == 0
    assert setup(home, "codex", "--remove").code == 0
    assert (home / ".codex" / "config.toml").read_text() == ""


def test_codex_keys_the_user_rewrapped_or_commented_keep_their_bytes_when_setup_runs_again(home):
    assert setup(home, "codex").code == 0
    path = home / ".codex" / "config.toml"
    config = tomllib.loads(path.read_text())["mcp_servers"]["context-sidecar"]
    wrapped = "env_vars = [\n" + "".join(f'    "{name}",\n' for name in config["env_vars"]) + "]  # for the host\n"
    text = path.read_text()
    start = text.index("env_vars = [")
    text = text[:start] + wrapped + text[text.index("\n", start) + 1:]
    text = text.replace("required = true\n", "required = true  # Codex waits for it\n")
    path.write_text(text)
    run = setup(home, "codex", "--db", str(home / "other.duckdb"))  # the args change; nothing else does
    assert run.code == 0, run.err
    after = path.read_text()
    assert wrapped in after and "required = true  # Codex waits for it\n" in after
    args = tomllib.loads(after)["mcp_servers"]["context-sidecar"]["args"]
    assert args[2] == COMMAND and args[4:] == ["mcp", "--db", str(home / "other.duckdb")]
