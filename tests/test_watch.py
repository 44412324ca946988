"""memory/watch: a server follows a workspace's agent transcripts (Claude Code, Codex, pi) while a client asks."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from protocol import errors as codes
from protocol import methods
from protocol.types import Usage
from sidecar.agents.locations import claude_project_name, pi_project_name
from sidecar.client import SidecarClient, SidecarRequestError
from sidecar.testing.transcripts import ClaudeCodeWriter

CLI = [sys.executable, "-m", "sidecar", "--no-share"]
WAIT = 30.0
"""Upper bound of every wait for an event; each ends as soon as the event comes."""


class Agents:
    """A home directory where agents keep transcripts, and the workspace they ran in."""

    def __init__(self, root: Path) -> None:
        self.home = root / "home"
        self.workspace = root / "project"
        self.workspace.mkdir(parents=True)
        self.home.mkdir()

    @property
    def env(self) -> dict[str, str]:
        return {"HOME": str(self.home)}

    def claude(self, session_id: str) -> ClaudeCodeWriter:
        directory = self.home / ".claude" / "projects" / claude_project_name(str(self.workspace))
        directory.mkdir(parents=True, exist_ok=True)
        return ClaudeCodeWriter(directory / f"{session_id}.jsonl", str(self.workspace), session_id=session_id)

    def codex(self, name: str, lines: list[dict[str, Any]]) -> Path:
        directory = self.home / ".codex" / "sessions" / "2026" / "11" / "20"
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"rollout-2026-11-20T09-00-00-{name}.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        return path

    def pi(self, session_id: str, lines: list[dict[str, Any]]) -> Path:
        directory = self.home / ".pi" / "agent" / "sessions" / pi_project_name(str(self.workspace))
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"2026-11-20T09-00-00-000Z_{session_id}.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        return path


@pytest.fixture
def agents(tmp_path: Path) -> Agents:
    return Agents(tmp_path)


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[SidecarClient]:
    async with await SidecarClient.spawn(command=CLI, db=str(tmp_path / "m.duckdb"), timeout=WAIT) as started:
        yield started


def usage_of(client: SidecarClient, session_id: str, predicate: Any = None) -> asyncio.Future[Usage]:
    """The next context/didChangeUsage of the session that satisfies ``predicate`` (a future, to await later)."""
    return client.wait_for_notification(
        methods.CONTEXT_DID_CHANGE_USAGE,
        lambda usage: usage.session_id == session_id and (predicate is None or predicate(usage)), timeout=WAIT)


def codex_meta(cwd: str, session_id: str) -> dict[str, Any]:
    return {"timestamp": "2026-11-20T09:00:00.000Z", "type": "session_meta",
            "payload": {"id": session_id, "timestamp": "2026-11-20T09:00:00.000Z", "cwd": cwd,
                        "originator": "codex_exec", "cli_version": "0.169.0"}}


def codex_item(kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {"timestamp": "2026-11-20T09:00:01.000Z", "type": kind, "payload": payload}


def codex_message(role: str, text: str) -> dict[str, Any]:
    part = "output_text" if role == "assistant" else "input_text"
    return codex_item("response_item", {"type": "message", "role": role, "content": [{"type": part, "text": text}]})


def pi_lines(cwd: str, session_id: str) -> list[dict[str, Any]]:
    header = {"type": "session", "version": 3, "id": session_id, "timestamp": "2026-11-20T09:00:00.000Z", "cwd": cwd}
    user = {"type": "message", "id": "p1", "parentId": None, "timestamp": "2026-11-20T09:00:01.000Z",
            "message": {"role": "user", "content": "pi remembers the PELICAN", "timestamp": 1}}
    return [header, user]


async def test_earlier_sessions_of_every_agent_are_imported_and_a_new_line_is_found(
        client: SidecarClient, agents: Agents) -> None:
    earlier = agents.claude("cc-earlier")
    earlier.user("The deploy key lives in VAULT_OTTER, never in the repository.")
    earlier.assistant("Noted: VAULT_OTTER.")
    agents.codex("cx", [codex_meta(str(agents.workspace), "cx-1"), codex_message("user", "codex saw a HERON")])
    agents.codex("other", [codex_meta("/srv/elsewhere", "cx-2"), codex_message("user", "not this workspace")])
    agents.pi("pi-1", pi_lines(str(agents.workspace), "pi-1"))
    await client.follow(workspace=str(agents.workspace))
    imported = {name: usage_of(client, name) for name in ("cc-earlier", "cx-1", "pi-1")}

    watched = await client.watch(str(agents.workspace), env=agents.env)

    assert watched.watching and watched.workspace == os.path.realpath(agents.workspace)
    assert sorted((t.agent, Path(t.path).name) for t in watched.transcripts) == [
        ("claude-code", "cc-earlier.jsonl"), ("codex", "rollout-2026-11-20T09-00-00-cx.jsonl"),
        ("pi", "2026-11-20T09-00-00-000Z_pi-1.jsonl")]
    assert {(Path(d.path).name, d.exists) for d in watched.directories} >= {("sessions", True)}
    for future in imported.values():
        await future
    for session_id, word in (("cc-earlier", "VAULT_OTTER"), ("cx-1", "HERON"), ("pi-1", "PELICAN")):
        assert (await client.grep(session_id, word)).matches, session_id
    listed = (await client.request(methods.MEMORY_SESSIONS, {"workspace": str(agents.workspace)}))["sessions"]
    assert sorted(s["sessionId"] for s in listed) == ["cc-earlier", "cx-1", "pi-1"]

    live = agents.claude("cc-live")  # a session that starts after the watch did
    live.user("Where does the ZEBRA crash come from?")
    await usage_of(client, "cc-live")
    assert [m.snippet for m in (await client.grep("cc-live", "ZEBRA")).matches] == [
        "Where does the ZEBRA crash come from?"]
    grown = usage_of(client, "cc-live", lambda usage: usage.messages == 2)
    live.assistant("The ZEBRA crash comes from parser.py line 12.")
    await grown
    assert len((await client.grep("cc-live", "parser.py line 12")).matches) == 1


async def test_usage_is_the_providers_count_of_the_last_answer(client: SidecarClient, agents: Agents) -> None:
    writer = agents.claude("cc-usage")
    writer.turn(0)
    await client.follow(workspace=str(agents.workspace))
    first = usage_of(client, "cc-usage", lambda usage: usage.source == "provider")
    await client.watch(str(agents.workspace), env=agents.env)
    answer = json.loads(writer.path.read_text().splitlines()[-2])["message"]["usage"]
    counted = answer["input_tokens"] + answer["cache_read_input_tokens"] + answer["cache_creation_input_tokens"] \
        + answer["output_tokens"]
    assert (await first).tokens == counted
    assert (await client.usage("cc-usage")).reported_tokens == counted

    estimate = usage_of(client, "cc-usage", lambda usage: usage.messages == 5)
    writer.user("one more question")
    assert (await estimate).source == "estimate"  # a message after the answer: the provider has not counted it
    again = usage_of(client, "cc-usage", lambda usage: usage.source == "provider" and usage.tokens != counted)
    writer.assistant("one more answer")
    moved = await again
    last = json.loads(writer.path.read_text().splitlines()[-1])["message"]["usage"]
    assert moved.tokens == sum(last[key] for key in ("input_tokens", "cache_read_input_tokens",
                                                     "cache_creation_input_tokens", "output_tokens"))


async def test_a_compaction_in_the_transcript_is_recorded_with_the_session(client: SidecarClient,
                                                                           agents: Agents) -> None:
    writer = agents.claude("cc-compact")
    for turn in range(3):
        writer.turn(turn)
    await client.follow(workspace=str(agents.workspace))
    imported = usage_of(client, "cc-compact")
    await client.watch(str(agents.workspace), env=agents.env)
    before = await imported
    compacted = client.wait_for_notification(methods.CONTEXT_DID_COMPACT, timeout=WAIT)
    summary = "The user asked for three fixes; all three are done. Always run pytest before saying done."
    writer.compact(summary, trigger="auto")
    event = await compacted
    assert (event.session_id, event.mode, event.trigger, event.source) == ("cc-compact", "handoff", "auto",
                                                                           "claude-code")
    described = await client.describe("cc-compact", event.summary_ids[0])
    assert described.content.startswith(summary) and described.kind == "handoff"
    assert described.message_count == before.messages
    hits = (await client.grep("cc-compact", "three fixes", scope="summaries")).matches
    assert [hit.id for hit in hits] == event.summary_ids
    # Claude Code hands the same summary to its PostCompact hook, unwrapped: recorded once.
    again = await client.record_compaction("cc-compact", summary, "claude-code", trigger="auto")
    assert (again.recorded, again.summary_id) == (False, event.summary_ids[0])
    assert (await client.usage("cc-compact")).summaries == 1


async def test_record_compaction_first_then_the_transcript_stores_it_once(client: SidecarClient,
                                                                          agents: Agents) -> None:
    writer = agents.claude("cc-hook")
    for turn in range(2):
        writer.turn(turn)
    await client.follow(workspace=str(agents.workspace))
    imported = usage_of(client, "cc-hook")
    await client.watch(str(agents.workspace), env=agents.env)
    await imported
    summary = "Two turns: the login fix and the retry. Never commit the VAULT key."
    recorded = await client.record_compaction("cc-hook", summary, "claude-code", trigger="manual")
    assert recorded.recorded and recorded.summary_id
    assert recorded.usage.summaries == 1
    assert (await client.describe("cc-hook", recorded.summary_id)).message_count == 8  # the whole session so far
    grown = usage_of(client, "cc-hook", lambda usage: usage.messages == 9)
    writer.compact(summary)
    writer.user("next question after the compaction")
    await grown
    assert (await client.usage("cc-hook")).summaries == 1
    described = await client.describe("cc-hook", recorded.summary_id)
    assert described.content.startswith(summary)


@pytest.mark.parametrize(("params", "field"), [
    ({"workspace": ""}, "workspace"),
    ({"workspace": 3}, "workspace"),
    ({"workspace": "/tmp", "watch": "yes"}, "watch"),
    ({"workspace": "/tmp", "env": {"HOME": 3}}, "env.HOME"),
    ({"workspace": "/tmp", "env": ["HOME"]}, "env"),
    ({"workspace": "/tmp", "directories": [""]}, "directories[0]"),
    ({"workspace": "/tmp", "directories": "/tmp"}, "directories"),
])
async def test_watch_rejects_bad_params(client: SidecarClient, params: dict[str, Any], field: str) -> None:
    with pytest.raises(SidecarRequestError) as raised:
        await client.request(methods.MEMORY_WATCH, params)
    assert raised.value.code == codes.INVALID_PARAMS and raised.value.data["field"] == field
    assert (await client.sessions()).sessions == []


@pytest.mark.parametrize(("params", "code", "field"), [
    ({"sessionId": "s", "summary": "", "source": "claude-code"}, codes.INVALID_PARAMS, "summary"),
    ({"sessionId": "s", "summary": "   ", "source": "claude-code"}, codes.INVALID_PARAMS, "summary"),
    ({"sessionId": "s", "summary": "text", "source": ""}, codes.INVALID_PARAMS, "source"),
    ({"sessionId": "s", "summary": "text"}, codes.INVALID_PARAMS, "source"),
    ({"sessionId": "s", "summary": "text", "source": "x", "trigger": "later"}, codes.INVALID_PARAMS, "trigger"),
    ({"sessionId": "s", "summary": 7, "source": "x"}, codes.INVALID_PARAMS, "summary"),
    ({"sessionId": "s", "summary": "text", "source": "x", "id": ""}, codes.INVALID_PARAMS, "id"),
    ({"sessionId": "", "summary": "text", "source": "x"}, codes.INVALID_PARAMS, "sessionId"),
    ({"sessionId": "nope", "summary": "text", "source": "x"}, codes.UNKNOWN_SESSION, None),
])
async def test_record_compaction_rejects_bad_params_and_changes_nothing(
        client: SidecarClient, params: dict[str, Any], code: int, field: str | None) -> None:
    await client.ingest("s", [{"id": f"m{n}", "role": "user", "content": f"message {n}"} for n in range(4)])
    with pytest.raises(SidecarRequestError) as raised:
        await client.request(methods.MEMORY_RECORD_COMPACTION, params)
    assert raised.value.code == code
    if field is not None:
        assert raised.value.data["field"] == field
    usage = await client.usage("s")
    assert (usage.messages, usage.summaries) == (4, 0)
    assert [item.id for item in (await client.assemble("s")).items] == ["m0", "m1", "m2", "m3"]


async def test_record_compaction_by_id_and_by_text(client: SidecarClient) -> None:
    await client.ingest("s", [{"id": f"m{n}", "role": "user", "content": f"message {n}"} for n in range(4)])
    first = await client.record_compaction("s", "Summary of four messages.", "pi", id="c1")
    assert first.recorded and first.usage.summaries == 1
    assert [item.kind for item in (await client.assemble("s")).items] == ["summary"]
    same_id = await client.record_compaction("s", "A different text, same compaction.", "pi", id="c1")
    same_text = await client.record_compaction("s", "  Summary of four\nmessages. ", "pi")
    assert [(r.recorded, r.summary_id) for r in (same_id, same_text)] == [(False, first.summary_id)] * 2
    await client.ingest("s", [{"id": "m4", "role": "user", "content": "after the first compaction"}])
    second = await client.record_compaction("s", "The second compaction's own summary.", "pi", id="c2")
    assert second.recorded and second.summary_id != first.summary_id
    described = await client.describe("s", second.summary_id)
    assert described.children == [first.summary_id, "m4"] and described.depth == 1


async def test_a_workspace_with_no_sessions_and_missing_or_unreadable_directories(
        client: SidecarClient, agents: Agents, tmp_path: Path) -> None:
    not_a_directory = tmp_path / "transcripts.txt"
    not_a_directory.write_text("a file, not a directory")
    watched = await client.watch(str(agents.workspace), env=agents.env,
                                 directories=[str(not_a_directory), str(tmp_path / "nowhere")])
    assert watched.watching and watched.transcripts == []
    by_path = {Path(d.path): d for d in watched.directories}
    assert not by_path[tmp_path / "nowhere"].exists and by_path[tmp_path / "nowhere"].problem is None
    problem = by_path[not_a_directory].problem
    assert problem is not None and str(not_a_directory) in problem and "Not a directory" in problem
    assert all(not d.exists for d in watched.directories if d.agent != "any")

    (tmp_path / "nowhere").mkdir()  # a directory that appears later is looked at again
    session = tmp_path / "nowhere" / "later.jsonl"
    seen = usage_of(client, "cc-later")
    writer = ClaudeCodeWriter(session, str(agents.workspace), session_id="cc-later")
    await client.follow(workspace=str(agents.workspace))
    writer.user("found in a directory the client named")
    assert (await seen).messages == 1
    again = await client.watch(str(agents.workspace), env=agents.env,
                               directories=[str(not_a_directory), str(tmp_path / "nowhere")])
    assert [(Path(t.path).name, t.agent, t.state, t.session_id) for t in again.transcripts] == [
        ("later.jsonl", "any", "following", "cc-later")]


async def test_a_variable_the_client_did_not_send_is_unset_not_the_servers(tmp_path: Path, agents: Agents) -> None:
    hosts_claude = tmp_path / "hosts-claude"  # as when the host was started under another Claude Code
    directory = hosts_claude / "projects" / claude_project_name(str(agents.workspace))
    directory.mkdir(parents=True)
    ClaudeCodeWriter(directory / "cc-other.jsonl", str(agents.workspace), session_id="cc-other").user("not ours")
    env = {**os.environ, "CLAUDE_CONFIG_DIR": str(hosts_claude)}
    async with await SidecarClient.spawn(command=CLI, db=str(tmp_path / "m.duckdb"), env=env,
                                         timeout=WAIT) as client:
        watched = await client.watch(str(agents.workspace), env=agents.env)
    assert watched.transcripts == []
    claude = [Path(d.path) for d in watched.directories if d.agent == "claude-code"]
    assert claude == [agents.home / ".claude" / "projects" / claude_project_name(str(agents.workspace))]


async def test_workspaces_whose_claude_project_directories_share_a_name_keep_their_own_sessions(
        client: SidecarClient, agents: Agents, tmp_path: Path) -> None:
    ours, theirs = tmp_path / "foo_bar", tmp_path / "foo-bar"
    ours.mkdir()
    theirs.mkdir()
    directory = agents.home / ".claude" / "projects" / claude_project_name(str(ours))
    assert directory.name == claude_project_name(str(theirs))
    directory.mkdir(parents=True)
    ClaudeCodeWriter(directory / "cc-ours.jsonl", str(ours), session_id="cc-ours").user("ours")
    ClaudeCodeWriter(directory / "cc-theirs.jsonl", str(theirs), session_id="cc-theirs").user("theirs")
    for workspace, session in ((ours, "cc-ours"), (theirs, "cc-theirs")):
        watched = await client.watch(str(workspace), env=agents.env)
        assert [t.path for t in watched.transcripts] == [str(directory / f"{session}.jsonl")]


async def test_a_codex_rollout_without_session_meta_is_skipped(client: SidecarClient, agents: Agents) -> None:
    agents.codex("nometa", [codex_message("user", "a rollout cut before its meta")])
    agents.codex("empty", [])
    good = agents.codex("good", [codex_meta(str(agents.workspace), "cx-good"), codex_message("user", "GOOD one")])
    await client.follow(workspace=str(agents.workspace))
    imported = usage_of(client, "cx-good")
    watched = await client.watch(str(agents.workspace), env=agents.env)
    assert [Path(t.path).name for t in watched.transcripts] == [good.name]
    await imported
    assert [s.session_id for s in (await client.sessions()).sessions] == ["cx-good"]


async def test_a_transcript_rewritten_or_deleted_under_the_follower_loses_nothing(
        client: SidecarClient, agents: Agents) -> None:
    writer = agents.claude("cc-rewrite")
    for turn in range(3):
        writer.turn(turn)
    whole = writer.path.read_text()
    await client.follow(workspace=str(agents.workspace))
    imported = usage_of(client, "cc-rewrite", lambda usage: usage.messages == 12)
    await client.watch(str(agents.workspace), env=agents.env)
    await imported
    stored = [item.id for item in (await client.assemble("cc-rewrite", prune=False)).items]

    # Truncated to its first turn, then written anew with a different second turn: both branches stay.
    first_turn = "".join(whole.splitlines(keepends=True)[:8])  # a turn is 8 lines, ending with last-prompt
    writer.path.write_text(first_turn)
    replaced = usage_of(client, "cc-rewrite", lambda usage: usage.messages == 13)
    rewritten = ClaudeCodeWriter(writer.path, writer.cwd, session_id="cc-rewrite",
                                 parent=json.loads(first_turn.splitlines()[-2])["uuid"])
    rewritten.user("a different second question, about the WALRUS")
    await replaced
    ids = [item.id for item in (await client.assemble("cc-rewrite", prune=False)).items]
    assert ids[:len(stored)] == stored and len(ids) == len(stored) + 1
    assert (await client.grep("cc-rewrite", "WALRUS")).matches

    writer.path.unlink()  # deleted: what was stored stays, and the server serves on
    assert (await client.usage("cc-rewrite")).messages == 13
    back = usage_of(client, "cc-rewrite", lambda usage: usage.messages == 14)
    writer.path.write_text(whole)
    ClaudeCodeWriter(writer.path, writer.cwd, session_id="cc-rewrite", parent=writer.parent).user("back again")
    await back
    assert (await client.grep("cc-rewrite", "back again")).matches
    assert (await client.usage("cc-rewrite")).messages == 14


async def test_watch_false_stops_and_a_second_watch_is_the_same(client: SidecarClient, agents: Agents) -> None:
    agents.claude("cc-one").user("hello")
    first = await client.watch(str(agents.workspace), env=agents.env)
    second = await client.watch(str(agents.workspace), env=agents.env)
    assert [t.path for t in first.transcripts] == [t.path for t in second.transcripts]
    stopped = await client.watch(str(agents.workspace), watch=False)
    assert (stopped.watching, stopped.transcripts) == (False, [])


def pi_message(entry_id: str, parent: str | None, role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "id": entry_id, "parentId": parent, "timestamp": "2026-11-20T09:00:01.000Z",
            "message": {"role": role, "content": [{"type": "text", "text": text}], "timestamp": 1}}


async def test_a_pi_compaction_keeping_entries_read_before_is_recorded_as_pi_made_it(
        client: SidecarClient, agents: Agents) -> None:
    header = pi_lines(str(agents.workspace), "pi-kept")[0]
    turns = [pi_message("u1", None, "user", "first"), pi_message("a1", "u1", "assistant", "one"),
             pi_message("u2", "a1", "user", "second"), pi_message("a2", "u2", "assistant", "two"),
             pi_message("u3", "a2", "user", "third"), pi_message("a3", "u3", "assistant", "three")]
    path = agents.pi("pi-kept", [header, *turns])
    await client.follow(workspace=str(agents.workspace))
    imported = usage_of(client, "pi-kept", lambda usage: usage.messages == 6)
    await client.watch(str(agents.workspace), env=agents.env)
    await imported
    compacted = client.wait_for_notification(methods.CONTEXT_DID_COMPACT, timeout=WAIT)
    compaction = {"type": "compaction", "id": "c1", "parentId": "a3", "timestamp": "2026-11-20T09:00:02.000Z",
                  "summary": "pi summarized the first turn.", "firstKeptEntryId": "u2", "tokensBefore": 900}
    with path.open("a") as fh:  # the kept entries were written before where the last read of the file started
        fh.write(json.dumps(compaction) + "\n")
    event = await compacted
    assert event.source == "pi"
    described = await client.describe("pi-kept", event.summary_ids[0])
    assert described.children == ["u1", "a1"]  # u2 onwards are kept verbatim, as pi keeps them
    assert [item.id for item in (await client.assemble("pi-kept")).items] == [
        event.summary_ids[0], "u2", "a2", "u3", "a3"]


async def test_a_session_the_proxy_writes_is_not_imported_again(client: SidecarClient, agents: Agents) -> None:
    await client.ingest("cc-proxied", [{"id": "px-1", "role": "user", "content": "through the proxy"}],
                        session={"metadata": {"proxy": "anthropic", "agentSession": "cc-proxied"}})
    writer = agents.claude("cc-proxied")
    writer.turn(0)
    other = agents.claude("cc-direct")
    other.user("not through the proxy")
    later = os.stat(other.path).st_mtime + 60
    os.utime(writer.path, (later, later))  # the newest: looked at first, before the direct one is imported
    await client.follow(workspace=str(agents.workspace))
    direct = usage_of(client, "cc-direct")
    await client.watch(str(agents.workspace), env=agents.env)
    await direct
    watched = await client.watch(str(agents.workspace), env=agents.env)
    states = {t.session_id: (t.state, t.problem) for t in watched.transcripts}
    assert states.get("cc-direct") == ("following", None)
    assert (await client.usage("cc-proxied")).messages == 1  # the proxy's own message, and nothing else
    skipped = next(t for t in watched.transcripts if Path(t.path).name == "cc-proxied.jsonl")
    assert skipped.state == "skipped" and skipped.problem and "proxy" in skipped.problem


async def test_a_transcript_imported_first_is_not_followed_once_the_proxy_writes_a_branch_of_it(
        client: SidecarClient, agents: Agents) -> None:
    writer = agents.claude("cc-first")
    writer.turn(0)
    await client.follow(workspace=str(agents.workspace))
    imported = usage_of(client, "cc-first")
    await client.watch(str(agents.workspace), env=agents.env)
    before = (await imported).messages
    # The proxy found the session imported, and stores the conversation as a branch of it (core.Proxy._resync).
    await client.ingest("cc-first~0a1b2c3d", [{"id": "px-1", "role": "user", "content": "through the proxy"}],
                        session={"metadata": {"proxy": "anthropic", "agentSession": "cc-first"}})
    writer.turn(1)
    other = agents.claude("cc-other")
    other.user("not through the proxy")
    later = os.stat(other.path).st_mtime + 60
    os.utime(writer.path, (later, later))  # the newest: looked at first, before the other one is imported
    direct = usage_of(client, "cc-other")
    await direct
    watched = await client.watch(str(agents.workspace), env=agents.env)
    assert (await client.usage("cc-first")).messages == before  # what was imported stays, no more comes
    skipped = next(t for t in watched.transcripts if Path(t.path).name == "cc-first.jsonl")
    assert skipped.state == "skipped" and skipped.problem and "cc-first~0a1b2c3d" in skipped.problem


async def test_a_session_deleted_while_followed_is_stored_again_whole_at_its_next_line(
        client: SidecarClient, agents: Agents) -> None:
    writer = agents.claude("cc-deleted")
    for turn in range(2):
        writer.turn(turn)
    await client.follow(workspace=str(agents.workspace))
    imported = usage_of(client, "cc-deleted", lambda usage: usage.messages == 8)
    await client.watch(str(agents.workspace), env=agents.env)
    await imported
    assert (await client.delete_session("cc-deleted")).deleted
    again = usage_of(client, "cc-deleted", lambda usage: usage.messages == 9)
    writer.user("after the delete")  # the transcript still holds the whole session: a window would store a part
    await again
    assert (await client.grep("cc-deleted", "Turn 0")).matches


async def test_a_transcript_that_is_no_transcript_waits_and_the_others_are_followed(
        client: SidecarClient, agents: Agents) -> None:
    good = agents.claude("cc-good")
    good.user("a real session")
    garbage = good.path.with_name("garbage.jsonl")
    garbage.write_bytes(b"\x00\xff not json at all\n{\"neither\": \"this\"}\n")
    os.utime(garbage, (os.stat(good.path).st_mtime + 60,) * 2)  # looked at first
    await client.follow(workspace=str(agents.workspace))
    imported = usage_of(client, "cc-good")
    await client.watch(str(agents.workspace), env=agents.env)
    await imported
    watched = await client.watch(str(agents.workspace), env=agents.env)
    states = {Path(t.path).name: (t.state, t.problem or "") for t in watched.transcripts}
    assert states["cc-good.jsonl"] == ("following", "")
    state, problem = states["garbage.jsonl"]
    assert state == "waiting" and "cannot tell the transcript format" in problem
    assert [s.session_id for s in (await client.sessions()).sessions] == ["cc-good"]
