"""memory/import on the fixtures through a real sidecar: valid sequences, counts, re-import after growth."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from protocol import errors as codes
from sidecar.client import SidecarClient, SidecarRequestError
from tests.helpers.openai_checks import assert_valid_openai_sequence

FIXTURES = Path(__file__).parent / "fixtures"
FILES = ["claude-code-2.1-parallel.jsonl", "agent-a241764.jsonl", "codex-0.46-rollout.jsonl",
         "pi-v3-thinking.jsonl", "swe-agent-1.0.traj"]
SETTINGS = {"compaction": {"auto": False}, "prune": {"enabled": False}}
HUGE = 10_000_000
# Counts in the source files, by hand: user messages (prompts, user context), assistant responses, tool results.
EXPECTED = {
    # attachment selected_lines_in_ide, the prompt, the image message; 5 responses (API error not one); 5 results
    "claude-code-2.1-parallel.jsonl": {"user": 3, "assistant": 5, "tool": 5},
    "agent-a241764.jsonl": {"user": 1, "assistant": 2, "tool": 1},
    # environment context and the prompt; 4 assistant turns (call, text+patch, call, text); 3 outputs
    "codex-0.46-rollout.jsonl": {"user": 2, "assistant": 4, "tool": 3},
    # two prompts; the aborted empty assistant is listed as skipped; 2 results
    "pi-v3-thinking.jsonl": {"user": 2, "assistant": 3, "tool": 2},
    "swe-agent-1.0.traj": {"system": 1, "user": 1, "assistant": 3, "tool": 3},
}


async def stored(client: SidecarClient, session_id: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The whole stored context as assembled with a huge budget and no pruning: (messages, item ids)."""
    result = await client.assemble(session_id, budget=HUGE, prune=False)
    return result.messages, [item.id for item in result.items]


@pytest.fixture
async def client(tmp_path: Path) -> Any:
    """A real sidecar on a fresh DB."""
    async with await SidecarClient.spawn(db=str(tmp_path / "memory.duckdb"), settings=SETTINGS) as client:
        yield client


@pytest.mark.parametrize("name", FILES)
async def test_fixture_imports_into_a_valid_sequence_with_the_source_counts(client: SidecarClient,
                                                                          name: str) -> None:
    result = await client.import_transcript(str(FIXTURES / name))
    messages, ids = await stored(client, result.session_id)
    assert_valid_openai_sequence(messages)
    assert dict(Counter(m["role"] for m in messages)) == EXPECTED[name]
    assert not any("no result recorded" in str(m.get("content")) for m in messages)  # every call answered
    assert ids == result.ids and result.duplicates == 0
    again = await client.import_transcript(str(FIXTURES / name))
    assert again.duplicates == len(again.ids) and not again.replaced


@pytest.mark.parametrize("name", FILES[:4])
async def test_every_prefix_then_the_full_file_equals_one_import(tmp_path: Path, name: str) -> None:
    lines = (FIXTURES / name).read_text().splitlines(keepends=True)
    growing = tmp_path / name
    async with await SidecarClient.spawn(db=str(tmp_path / "grown.duckdb"), settings=SETTINGS) as client:
        for cut in range(1, len(lines) + 1):
            growing.write_text("".join(lines[:cut]))
            try:
                await client.import_transcript(str(growing), session_id="grown")
            except SidecarRequestError as error:
                assert "no messages could be read" in str(error)  # a prefix of harness lines only
        await client.import_transcript(str(FIXTURES / name), session_id="once")
        grown, once = await stored(client, "grown"), await stored(client, "once")
        assert grown == once
        assert_valid_openai_sequence(grown[0])
        counts = {s.session_id: s.messages for s in (await client.sessions()).sessions}
        assert counts["grown"] == counts["once"]  # nothing stored twice


async def test_claude_code_parallel_calls_reasoning_attachments_and_originals(client: SidecarClient) -> None:
    path = FIXTURES / "claude-code-2.1-parallel.jsonl"
    result = await client.import_transcript(str(path))
    messages, ids = await stored(client, result.session_id)
    first = next(m for m in messages if m.get("tool_calls"))
    assert [c["id"] for c in first["tool_calls"]] == ["toolu_01Read", "toolu_02Read"]
    assert "reasoning" not in first  # not sent unless asked
    with_reasoning = (await client.assemble(result.session_id, budget=HUGE, prune=False, reasoning=True)).messages
    chosen = next(m for m in with_reasoning if m.get("tool_calls"))
    assert chosen["reasoning"] == "Need both the module and its test; read them in parallel."
    assert messages[0]["content"].startswith("The user selected lines 40 to 44 from /srv/dev/shop/cart.py")
    image = next(m for m in messages if isinstance(m["content"], list))
    assert image["content"][1]["image_url"]["url"].startswith("data:image/png;base64,iVBOR")
    failed = next(m for m in messages if m.get("tool_call_id") == "toolu_03Bash")
    expanded = await client.expand(result.session_id, ids[messages.index(failed)])
    assert expanded.items[0].message["metadata"]["isError"] is True
    expanded = await client.expand(result.session_id, ids[messages.index(first)])
    original = expanded.items[0].original
    assert [json.loads(line)["uuid"][-2:] for line in original] == ["02", "03", "04", "05", "06"]
    assert original == [line for line in path.read_text().splitlines() if '"msg_01Par"' in line]
    assert expanded.items[0].message["metadata"]["redactedThinking"] == 1
    hits = await client.grep(result.session_id, "read them in parallel")
    assert [hit.id for hit in hits.matches] == [expanded.items[0].id]
    skipped = " | ".join(result.skipped)
    for reason in ("'last-prompt' entry", "'permission-mode' entry", "attachment 'task_reminder'", "API Error: 529"):
        assert reason in skipped


async def test_subagent_file_is_its_own_session_linked_to_the_parent(client: SidecarClient) -> None:
    parent = await client.import_transcript(str(FIXTURES / "claude-code-2.1-parallel.jsonl"))
    agent = await client.import_transcript(str(FIXTURES / "agent-a241764.jsonl"))
    assert agent.session_id == f"{parent.session_id}:agent-a241764" and not agent.skipped
    described = await client.sessions()
    assert {s.session_id for s in described.sessions} == {parent.session_id, agent.session_id}


async def test_codex_reasoning_and_exit_codes(client: SidecarClient) -> None:
    result = await client.import_transcript(str(FIXTURES / "codex-0.46-rollout.jsonl"))
    items = [(await client.expand(result.session_id, i)).items[0].message for i in result.ids]
    tools = {m["tool_call_id"]: m["metadata"] for m in items if m["role"] == "tool"}
    assert tools["call_Kq1"]["isError"] is True and tools["call_Kq1"]["exitCode"] == 1
    assert "isError" not in tools["call_Pt2"] and tools["call_Kq3"]["exitCode"] == 0
    assert items[2]["reasoning"].startswith("**Running the tests first**")
    assert items[2]["metadata"]["encryptedReasoning"] == 1
    assert items[1]["content"][1]["type"] == "image_url"


async def test_wrong_format_says_which_lines_were_read_and_why_none_counted(client: SidecarClient,
                                                                           tmp_path: Path) -> None:
    with pytest.raises(SidecarRequestError) as raised:
        await client.import_transcript(str(FIXTURES / "codex-0.46-rollout.jsonl"), format="pi")
    assert raised.value.code == codes.INVALID_PARAMS
    assert "18 JSON lines read, none a pi message" in str(raised.value)
    assert "unknown entry type 'session_meta'" in str(raised.value)
    assert not (await client.sessions()).sessions  # nothing stored


async def test_bad_reasoning_and_follow_params_are_refused(client: SidecarClient) -> None:
    await client.ingest("s", [{"role": "user", "content": "hi", "id": "u1"}])
    with pytest.raises(SidecarRequestError) as raised:
        await client.ingest("s", [{"role": "user", "content": "x", "reasoning": "no"}])
    assert raised.value.code == codes.INVALID_PARAMS and "reasoning" in str(raised.value)
    for method, params in (("context/assemble", {"sessionId": "s", "reasoning": "yes"}),
                           ("memory/import", {"path": str(FIXTURES / FILES[0]), "follow": 1})):
        with pytest.raises(SidecarRequestError) as raised:
            await client.request(method, params)
        assert raised.value.code == codes.INVALID_PARAMS
    assert (await stored(client, "s"))[1] == ["u1"]


async def test_a_stand_in_compacted_into_a_summary_is_replaced_there_too(tmp_path: Path) -> None:
    entries = [json.dumps({"type": "session", "version": 3, "id": "grow", "timestamp": "2026-01-01T00:00:00Z"})]
    parent = None
    for turn in range(30):
        call = {"type": "toolCall", "id": f"call{turn}", "name": "bash", "arguments": {"command": f"ls {turn}"}}
        for entry_id, message in (
            (f"u{turn}", {"role": "user", "content": f"turn {turn}: " + "please look " * 30}),
            (f"a{turn}", {"role": "assistant", "content": [{"type": "text", "text": "looking"}, call]}),
            (f"t{turn}", {"role": "toolResult", "toolCallId": f"call{turn}", "toolName": "bash",
                          "content": [{"type": "text", "text": f"RESULT-{turn} " + "x" * 300}], "isError": False}),
        ):
            entries.append(json.dumps({"type": "message", "id": entry_id, "parentId": parent,
                                       "timestamp": "2026-01-01T00:00:01Z", "message": message}))
            parent = entry_id
    path = tmp_path / "grow.jsonl"
    path.write_text("\n".join(entries[:-1]) + "\n")  # the last call's result is not written yet
    settings = {**SETTINGS, "compaction": {"auto": False, "freshTail": 0, "keepRecentTokens": 0}}
    async with await SidecarClient.spawn(db=str(tmp_path / "m.duckdb"), settings=settings) as client:
        await client.import_transcript(str(path))
        assert (await client.compact("grow", mode="full")).compacted
        hits = [hit for hit in (await client.grep("grow", "no result recorded")).matches if hit.kind == "message"]
        assert [hit.id for hit in hits] == ["a29:call29:no-result"] and hits[0].covered_by
        summary = hits[0].covered_by
        before = (await client.usage("grow")).tokens

        path.write_text("\n".join(entries) + "\n")
        result = await client.import_transcript(str(path))
        assert result.replaced == 1 and result.duplicates == len(result.ids) - 1
        hits = await client.grep("grow", "RESULT-29 ", scope="messages")
        assert [(hit.id, hit.covered_by) for hit in hits.matches] == [("t29", summary)]
        # The stored message changed; a summary written from the stand-in keeps its text (summaries are not redone).
        assert not (await client.grep("grow", "no result recorded", scope="messages")).matches
        sources, queue = [], [summary]
        while queue:  # walk the summary down to its messages
            for item in (await client.expand("grow", queue.pop(), token_cap=1_000_000)).items:
                (queue if item.kind == "summary" else sources).append(item.id)
        assert "t29" in sources and "a29:call29:no-result" not in sources
        assert (await client.usage("grow")).tokens == before  # the summary stands for it: the context is as it was
        messages, _ = await stored(client, "grow")
        assert_valid_openai_sequence(messages)
