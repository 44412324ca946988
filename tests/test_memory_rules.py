"""memory/rules through the real server: a session's standing rules and files, as its footers carry them."""

from __future__ import annotations

import json

import pytest
from pygls.exceptions import JsonRpcException

from protocol import errors, methods
from sidecar.cli.synthetic import coding_session
from tests.conftest import call, ingest, running_sidecar, settings_for

MANUAL = {"auto": False}


def calls(message_id: str, *pairs: tuple[str, str]) -> list[dict]:
    """An assistant message calling ``(tool, path)`` pairs, and a result for each."""
    tool_calls = [{"id": f"{message_id}c{i}", "type": "function",
                   "function": {"name": tool, "arguments": json.dumps({"file_path": path})}}
                  for i, (tool, path) in enumerate(pairs)]
    results = [{"id": f"{message_id}r{i}", "role": "tool", "tool_call_id": call["id"], "content": "ok"}
               for i, call in enumerate(tool_calls)]
    return [{"id": message_id, "role": "assistant", "content": None, "tool_calls": tool_calls}, *results]


SESSION = [
    {"id": "sys", "role": "system", "content": "You are a coding agent. Always answer in English."},
    {"id": "u1", "role": "user",
     "content": "Fix the parser. You must run the tests before committing. What must I do?"},
    *calls("a1", ("Read", "src/parser.py"), ("Read", "README.md")),
    {"id": "t-note", "role": "assistant", "content": "I must never touch the lockfile, noted."},
    {"id": "env", "role": "user", "content": "<environment_context>Never use the network.</environment_context>",
     "metadata": {"injected": True}},
    {"id": "meta", "role": "user", "content": "Caveat: DO NOT respond to these messages.",
     "metadata": {"isMeta": True}},
    *calls("a2", ("Edit", "src/parser.py"), ("Read", "src/lexer.py")),
    {"id": "u2", "role": "user", "content": "Never push to main.\n- You must run the tests before committing."},
    *calls("a3", ("Write", "tests/test_parser.py")),
]


async def test_rules_and_files_of_the_whole_session(sidecar):
    await ingest(sidecar, "s", SESSION)
    result = await call(sidecar, methods.MEMORY_RULES, {"sessionId": "s"})
    assert result["sessionId"] == "s"
    assert result["rules"] == ["Always answer in English.", "You must run the tests before committing.",
                               "Never push to main."], "user and system text only, deduplicated, no questions"
    assert result["rulesLeftOut"] == []
    assert result["modified"] == ["tests/test_parser.py", "src/parser.py"], "most recent first"
    assert result["read"] == ["src/lexer.py", "README.md"], "a file also modified is listed as modified only"


async def test_rules_of_compacted_messages_are_those_the_summary_carries(db_path):
    session = coding_session(200)
    async with running_sidecar(settings=settings_for(db_path, compaction=MANUAL)) as client:
        await ingest(client, "s", session)
        compacted = await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s", "mode": "incremental"})
        assert compacted["compacted"], compacted
        summary = await call(client, methods.MEMORY_DESCRIBE, {"sessionId": "s", "id": compacted["summaryIds"][0]})
        result = await call(client, methods.MEMORY_RULES, {"sessionId": "s"})
    assert summary["rules"] and set(summary["rules"]) <= set(result["rules"])
    footer_modified = summary["content"].split("<modified-files>\n")[1].split("\n</modified-files>")[0].splitlines()
    assert set(footer_modified) <= set(result["modified"])


async def test_the_rule_cap_keeps_the_earliest(sidecar):
    rules = [f"Never change module{i}.py without asking." for i in range(45)]
    await ingest(sidecar, "s", [{"id": f"u{i}", "role": "user", "content": rule} for i, rule in enumerate(rules)])
    result = await call(sidecar, methods.MEMORY_RULES, {"sessionId": "s"})
    assert result["rules"] == rules[:40]
    assert result["rulesLeftOut"] == rules[40:]


async def test_a_session_without_rules_or_files(sidecar):
    await ingest(sidecar, "s", [{"id": "u", "role": "user", "content": "hello"}])
    result = await call(sidecar, methods.MEMORY_RULES, {"sessionId": "s"})
    assert result == {"sessionId": "s", "rules": [], "rulesLeftOut": [], "read": [], "modified": []}


@pytest.mark.parametrize(("params", "code"), [
    ({"sessionId": "nope"}, errors.UNKNOWN_SESSION),
    ({}, errors.INVALID_PARAMS),
    ({"sessionId": 5}, errors.INVALID_PARAMS),
])
async def test_bad_params_change_nothing(sidecar, params, code):
    await ingest(sidecar, "s", SESSION)
    before = await call(sidecar, methods.MEMORY_SESSIONS, {})
    with pytest.raises(JsonRpcException) as caught:
        await call(sidecar, methods.MEMORY_RULES, params)
    assert caught.value.code == code
    assert await call(sidecar, methods.MEMORY_SESSIONS, {}) == before
