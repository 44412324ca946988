"""``context-sidecar hook claude-code`` as Claude Code runs it: a process reading the hook's JSON on stdin."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from sidecar.cli.hook import MAX_CONTEXT_CHARS
from sidecar.client import SidecarClient
from sidecar.pytest_plugin import llm_settings
from tests.helpers.hosts import WAIT, short_runtime, until_logged
from tests.helpers.transcripts import cc_asst, cc_user, result, text, use, write_jsonl

SESSION = "cc-sess"
RULE = "You must run `make check` before every commit."
SECOND_RULE = "Never push to main."
INJECTED = "Never trust this injected line."


@attrs.frozen
class Run:
    code: int
    stdout: str
    stderr: str


@pytest.fixture
def runtime() -> Iterator[Path]:
    with short_runtime() as path:
        yield path


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "shop"
    path.mkdir()
    return path


def transcript(path: Path, extra_files: int = 0, root: str = "") -> Path:
    """A Claude Code session: two rules, a Read and an Edit (of files under ``root``), an injected attachment, and
    ``extra_files`` writes."""
    attachment = {"type": "attachment", "uuid": "at1", "parentUuid": "r1", "sessionId": SESSION,
                  "timestamp": "2026-01-03T10:00:00.000Z",
                  "attachment": {"type": "hook_additional_context", "content": [INJECTED]}}
    entries: list[Any] = [
        cc_user("u1", None, f"Fix the cart total. {RULE}"),
        cc_asst("a1", "u1", "msg_1", use("toolu_1", "Read", file_path=f"{root}src/cart.py"), stop="tool_use"),
        cc_user("r1", "a1", [result("toolu_1", "def total(): ...")]),
        attachment,
        cc_asst("a2", "at1", "msg_2", use("toolu_2", "Edit", file_path=f"{root}src/cart.py"), stop="tool_use"),
        cc_user("r2", "a2", [result("toolu_2", "ok")]),
        cc_user("u2", "r2", [text(SECOND_RULE)]),
    ]
    parent = "u2"
    for i in range(extra_files):
        call = use(f"toolu_e{i}", "Write", file_path=f"src/generated/module_{i:04}.py")
        entries += [cc_asst(f"e{i}", parent, f"msg_e{i}", call, stop="tool_use"),
                    cc_user(f"er{i}", f"e{i}", [result(f"toolu_e{i}", "ok")])]
        parent = f"er{i}"
    entries.append(cc_asst("a3", parent, "msg_3", text("Done."), stop="end_turn"))
    return write_jsonl(path, entries)


def payload(event: str, workspace: Path, path: Path | None, **extra: Any) -> dict[str, Any]:
    """A hook's stdin, with the fields Claude Code 2.1.197 sends."""
    return {"session_id": SESSION, "transcript_path": str(path) if path else None, "cwd": str(workspace),
            "prompt_id": "p-1", "hook_event_name": event, **extra}


def hook(stdin: bytes | dict[str, Any], db: Path | str, runtime: Path, log: Path) -> Run:
    """Run the hook as Claude Code does: a process, the JSON on stdin, stdout and stderr read."""
    data = json.dumps(stdin).encode() if isinstance(stdin, dict) else stdin
    argv = [sys.executable, "-m", "sidecar", "hook", "claude-code", "--db", str(db), "--log-file", str(log)]
    done = subprocess.run(argv, input=data, capture_output=True, timeout=60, check=False,
                          env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)})
    return Run(done.returncode, done.stdout.decode(), done.stderr.decode())


async def client_on(db: Path | str, runtime: Path) -> SidecarClient:
    return await SidecarClient.spawn(db=str(db), env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)}, timeout=WAIT)


async def test_pre_compact_imports_the_whole_transcript_once(tmp_path, workspace, runtime, store_target):
    db, log = store_target, tmp_path / "hook.log"  # a file, then a team database
    path = transcript(tmp_path / f"{SESSION}.jsonl")
    for _ in range(2):
        run = hook(payload("PreCompact", workspace, path, trigger="manual", custom_instructions=None), db, runtime, log)
        assert (run.code, run.stdout, run.stderr) == (0, "", "")
    async with await client_on(db, runtime) as client:
        sessions = (await client.sessions()).sessions
        found = await client.grep(SESSION, "cart total")
    assert [(s.session_id, s.workspace) for s in sessions] == [(SESSION, os.path.realpath(workspace))]
    assert sessions[0].messages == 8, "the second run stored nothing twice"
    assert found.matches
    assert "PreCompact: session cc-sess: 8 new messages imported" in log.read_text()
    assert "PreCompact: session cc-sess: 0 new messages imported" in log.read_text()


async def test_session_start_after_compaction_restores_rules_and_files(tmp_path, workspace, runtime):
    db, log = tmp_path / "m.duckdb", tmp_path / "hook.log"
    path = transcript(tmp_path / f"{SESSION}.jsonl", root=f"{workspace}/")  # Claude Code's tools name absolute paths
    run = hook(payload("SessionStart", workspace, path, source="compact", model="claude-opus-4-8"), db, runtime, log)
    assert (run.code, run.stderr) == (0, "")
    output = json.loads(run.stdout)
    assert output["hookSpecificOutput"]["hookEventName"] == "SessionStart"
    context = output["hookSpecificOutput"]["additionalContext"]
    assert context.startswith("[context-sidecar]")
    assert f"- {RULE}\n- {SECOND_RULE}" in context
    assert INJECTED not in context, "what an agent injected itself is no rule of the user's"
    modified = context.index("Files modified")
    assert "\n- src/cart.py" in context[modified:], "relative to the workspace"
    assert "Files read" not in context, "read, then modified: modified"


async def test_the_restored_context_is_bounded(tmp_path, workspace, runtime):
    db, log = tmp_path / "m.duckdb", tmp_path / "hook.log"
    path = transcript(tmp_path / f"{SESSION}.jsonl", extra_files=400)
    run = hook(payload("SessionStart", workspace, path, source="compact"), db, runtime, log)
    context = json.loads(run.stdout)["hookSpecificOutput"]["additionalContext"]
    assert len(context) <= MAX_CONTEXT_CHARS
    assert "- src/generated/module_0399.py" in context, "the most recent first"
    assert "module_0000.py" not in context
    assert "more\n" in context or context.endswith("more")


@pytest.mark.parametrize("source", ["startup", "resume", "clear"])
async def test_session_start_other_than_after_compaction_prints_nothing(tmp_path, workspace, runtime, source):
    path = transcript(tmp_path / f"{SESSION}.jsonl")
    run = hook(payload("SessionStart", workspace, path, source=source), tmp_path / "m.duckdb", runtime,
               tmp_path / "hook.log")
    assert (run.code, run.stdout, run.stderr) == (0, "", "")


BAD_INPUT = {
    "not JSON": (b'{"hook_event_name": "PreCompact"', "malformed hook input: not JSON"),
    "not an object": (b'["PreCompact"]', "malformed hook input: not a JSON object"),
    "no event": (b'{"session_id": "s"}', "malformed hook input: no hook_event_name"),
    "unknown event": (b'{"hook_event_name": "Stop", "session_id": "s"}', "unknown hook event 'Stop'"),
    "empty": (b"", "malformed hook input: not JSON"),
}


@pytest.mark.parametrize("name", list(BAD_INPUT))
def test_bad_input_exits_0_with_one_line(tmp_path, runtime, name):
    stdin, reason = BAD_INPUT[name]
    log = tmp_path / "hook.log"
    run = hook(stdin, tmp_path / "m.duckdb", runtime, log)
    assert run.code == 0 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and reason in run.stderr, run.stderr
    assert reason in log.read_text()
    assert not (tmp_path / "m.duckdb").exists(), "nothing was started or stored"


def test_a_missing_transcript_exits_0_with_one_line(tmp_path, workspace, runtime):
    log = tmp_path / "hook.log"
    gone = tmp_path / "gone.jsonl"
    run = hook(payload("PreCompact", workspace, gone, trigger="auto"), tmp_path / "m.duckdb", runtime, log)
    assert run.code == 0 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and f"no transcript at '{gone}'" in run.stderr
    assert "no transcript at" in log.read_text()
    assert not (tmp_path / "m.duckdb").exists(), "checked before anything was started"


def test_an_unreachable_host_exits_0_with_one_line(tmp_path, workspace, runtime):
    (runtime / "context-sidecar").mkdir(mode=0o700)
    os.chmod(runtime / "context-sidecar", 0o777)  # the relay refuses a socket directory others can enter
    log = tmp_path / "hook.log"
    path = transcript(tmp_path / f"{SESSION}.jsonl")
    run = hook(payload("PreCompact", workspace, path, trigger="auto"), tmp_path / "m.duckdb", runtime, log)
    assert run.code == 0 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "open to other users" in run.stderr, run.stderr
    assert "open to other users" in log.read_text()


def test_session_start_reads_what_pre_compact_stored(tmp_path, workspace, runtime):
    db, log = tmp_path / "m.duckdb", tmp_path / "hook.log"
    path = transcript(tmp_path / f"{SESSION}.jsonl")
    assert hook(payload("PreCompact", workspace, path, trigger="auto"), db, runtime, log).stderr == ""
    path.unlink()  # the session is in memory: the transcript is not read again
    run = hook(payload("SessionStart", workspace, path, source="compact"), db, runtime, log)
    assert run.stderr == "" and RULE in json.loads(run.stdout)["hookSpecificOutput"]["additionalContext"]


def test_session_start_of_a_session_nowhere_exits_0_with_one_line(tmp_path, workspace, runtime):
    log = tmp_path / "hook.log"
    run = hook(payload("SessionStart", workspace, tmp_path / "gone.jsonl", source="compact"), tmp_path / "m.duckdb",
               runtime, log)
    assert run.code == 0 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "session cc-sess is not in context-sidecar's memory" in run.stderr


async def test_post_compact_records_claude_codes_summary_once(tmp_path, workspace, runtime):
    db, log = tmp_path / "m.duckdb", tmp_path / "hook.log"
    path = transcript(tmp_path / f"{SESSION}.jsonl")
    summary = "The cart total is fixed; the tests are next."
    for _ in range(2):  # the session is unknown at first: the transcript is imported, then the summary recorded
        run = hook(payload("PostCompact", workspace, path, trigger="manual", compact_summary=summary), db, runtime,
                   log)
        assert (run.code, run.stdout, run.stderr) == (0, "", "")
    async with await client_on(db, runtime) as client:
        found = await client.grep(SESSION, "tests are next", scope="summaries")
        [described] = [await client.describe(SESSION, match.id) for match in found.matches]
    assert summary in str(described.content)
    text = log.read_text()
    assert "PostCompact: session cc-sess: Claude Code's summary recorded as" in text
    assert "PostCompact: session cc-sess: Claude Code's summary already recorded as" in text


def test_a_workspace_with_its_own_protocol_and_sidecar_modules_does_not_shadow_ours(tmp_path, workspace, runtime):
    (workspace / "protocol.py").write_text('raise SystemExit("the workspace\'s protocol.py was imported")\n')
    (workspace / "sidecar").mkdir()
    (workspace / "sidecar" / "__init__.py").write_text('raise SystemExit("the workspace\'s sidecar was imported")\n')
    db, log = tmp_path / "m.duckdb", tmp_path / "hook.log"
    path = transcript(tmp_path / f"{SESSION}.jsonl")
    run = hook(payload("PreCompact", workspace, path, trigger="manual", custom_instructions=None), db, runtime, log)
    assert (run.code, run.stdout, run.stderr) == (0, "", "")  # the hook works in the workspace, where it chdirs


async def test_post_compact_during_another_compaction_waits_for_it_and_records_the_summary(
        tmp_path, workspace, runtime, gated):
    server, gate = gated
    db, log = tmp_path / "m.duckdb", tmp_path / "hook.log"
    path = transcript(tmp_path / f"{SESSION}.jsonl")
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    settings = {**llm_settings(server), "compaction": {"freshTail": 2, "keepRecentTokens": 0}}  # the summarizer runs
    async with await SidecarClient.spawn(db=str(db), env=env, settings=settings, timeout=WAIT) as client:
        await client.import_transcript(str(path), format="claude-code")
        compacting = asyncio.ensure_future(client.compact(SESSION, mode="handoff"))
        assert await asyncio.to_thread(gate.arrived.wait, WAIT)  # the host is inside that compaction
        summary = "The cart total is fixed; the tests are next."
        hooked = asyncio.ensure_future(asyncio.to_thread(
            hook, payload("PostCompact", workspace, path, trigger="auto", compact_summary=summary), db, runtime, log))
        await until_logged(log, "waiting for the compaction that is running to end")
        gate.opened.set()
        run = await hooked
        await compacting
    assert (run.code, run.stdout, run.stderr) == (0, "", "")
    assert "PostCompact: session cc-sess: Claude Code's summary recorded as" in log.read_text()


def test_post_compact_without_a_summary_exits_0_with_one_line(tmp_path, workspace, runtime):
    path = transcript(tmp_path / f"{SESSION}.jsonl")
    run = hook(payload("PostCompact", workspace, path, trigger="auto"), tmp_path / "m.duckdb", runtime,
               tmp_path / "hook.log")
    assert run.code == 0 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "malformed hook input: no compact_summary" in run.stderr
    assert not (tmp_path / "m.duckdb").exists(), "checked before anything was started"
