"""The command line builds only the parser of the command it runs: the same answers as the whole parser, and none
of the other commands' modules loaded (an agent waits for ``mcp`` and ``hook`` to start)."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys

import pytest

from sidecar.cli.main import ALL, build_parser, command_named

PARSED = [
    [], ["--stdio"], ["--no-share", "--db", "x.duckdb", "--clientProcessId", "12"], ["--client-p", "12"],
    ["--db", "mcp"], ["--db=hook"], ["--db", "hook", "mcp"], ["--lo", "f", "-vv", "mcp"], ["mcp"],
    ["mcp", "--db", "x", "--settings", '{"llm": {}}', "-v"], ["hook", "claude-code"], ["-v", "hook", "codex"],
    ["import", "f.jsonl", "--format", "pi", "--follow"], ["replay", "f", "--mode", "full", "-q"], ["demo"],
    ["proxy", "--port", "0"], ["wrap", "claude", "-p", "hi"], ["wrap", "claude", "--clientProcessId", "x", "-h"],
    ["wrap", "--port", "0", "codex", "--", "exec"], ["status", "--json"], ["db", "migrate"],
    ["db", "copy", "--from", "a", "--to", "b"], ["team", "list"], ["team", "grant", "bob", "--project", "x/y/z"],
    ["setup", "codex", "--dry-run"], ["host", "--socket", "s"],
]
"""Command lines that parse: each names its command (or none) in a different way."""
REFUSED = [
    ["bogus"], ["mcp", "--bogus"], ["--db"], ["--clientProcessId", "abc"], ["hook"], ["replay", "f", "--mode", "x"],
    ["-h"], ["mcp", "-h"], ["-h", "mcp"], ["--client", "12"], ["--version"], ["--help", "hook", "claude-code"],
    ["db"], ["--stdio", "x"],
]
"""Command lines that end in help, the version or a usage error (exit 0 or 2)."""


def outcome(command: str | None, argv: list[str]) -> tuple[object, str, str]:
    """What ``build_parser(command)`` makes of ``argv``: the namespace or the exit code, and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            result: object = vars(build_parser(command).parse_args(argv))
        except SystemExit as exit_:
            result = ("exit", exit_.code)
    return result, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("argv", PARSED + REFUSED, ids=" ".join)
def test_the_command_s_own_parser_answers_as_the_whole_one(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")  # the same help layout however the test runs
    whole = outcome(ALL, argv)
    assert outcome(command_named(argv), argv) == whole
    assert isinstance(whole[0], tuple) == (argv in REFUSED), whole


def test_the_command_is_found_past_the_options_before_it() -> None:
    assert command_named(["--db", "mcp"]) is None  # a value, not the command: serving
    assert command_named(["--db", "hook", "-v", "mcp", "--settings", "{}"]) == "mcp"
    assert command_named(["--log", "f", "team", "list"]) == "team"  # argparse's abbreviations as well
    for everything in (["-h", "mcp"], ["mcp", "-h"], ["bogus"], ["--db"], ["--client", "1"]):  # help, mistakes
        assert command_named(everything) == ALL, everything


@pytest.mark.parametrize("argv", [["mcp"], ["hook", "claude-code"], [], ["--no-share"]], ids=" ".join)
def test_a_start_loads_no_other_command_and_no_protocol_types(argv: list[str]) -> None:
    probe = (f"import sys, json, sidecar.cli.main as cli\nargv = {argv!r}\n"
             "cli.build_parser(cli.command_named(argv)).parse_args(argv)\n"
             "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('sidecar.cli.', 'protocol', 'attr', "
             "'cattrs', 'asyncio')))))")
    loaded = subprocess.run([sys.executable, "-P", "-c", probe], capture_output=True, text=True, timeout=60,
                            check=True)
    assert json.loads(loaded.stdout) == ["sidecar.cli.main"]
