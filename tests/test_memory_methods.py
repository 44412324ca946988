"""memory/* methods through the real server: ingest, expand, grep, describe, sessions, deleteSession."""

from __future__ import annotations

import json

import pytest
from pygls.exceptions import JsonRpcException

from protocol import errors, methods
from sidecar.cli.synthetic import coding_session
from tests.conftest import call, ingest

TOOL_TURN = [
    {"id": "u1", "role": "user", "content": "Fix the crash in src/app.py please"},
    {"id": "a1", "role": "assistant", "content": None,
     "tool_calls": [{"id": "c1", "type": "function",
                     "function": {"name": "read", "arguments": '{"path":"src/app.py"}'}}]},
    {"id": "t1", "role": "tool", "tool_call_id": "c1", "content": "def main():\n    raise KeyError('Boom')\n"},
    {"id": "a2", "role": "assistant", "content": "The KeyError comes from main().", "metadata": {"model": "m1"}},
]


async def snapshot(client, session_id):
    """Everything observable about a session, to prove a failed call changed nothing."""
    sessions = await call(client, methods.MEMORY_SESSIONS, {})
    assembled = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": session_id})
    return sessions, assembled["messages"], assembled["items"]


async def test_ingest_returns_ids_in_order_and_keeps_messages_verbatim(sidecar):
    result = await ingest(sidecar, "s1", TOOL_TURN)
    assert result["ids"] == ["u1", "a1", "t1", "a2"]
    assert result["duplicates"] == 0
    assert result["usage"]["messages"] == 4
    expanded = await call(sidecar, methods.MEMORY_EXPAND, {"sessionId": "s1", "id": "a2"})
    assert expanded["items"][0]["message"] == TOOL_TURN[3]  # metadata and id kept


async def test_ingest_generates_ids_when_the_client_gives_none(sidecar):
    result = await ingest(sidecar, "s1", [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    assert len(set(result["ids"])) == 2 and all(result["ids"])


async def test_ingest_is_idempotent_on_client_ids(sidecar):
    await ingest(sidecar, "s1", TOOL_TURN)
    again = await ingest(sidecar, "s1", [*TOOL_TURN, {"id": "u2", "role": "user", "content": "next"}])
    assert again["duplicates"] == 4
    assert again["ids"] == ["u1", "a1", "t1", "a2", "u2"]
    assembled = await call(sidecar, methods.CONTEXT_ASSEMBLE, {"sessionId": "s1"})
    assert [item["id"] for item in assembled["items"]] == ["u1", "a1", "t1", "a2", "u2"]


async def test_the_same_id_twice_in_one_batch_is_stored_once(sidecar):
    result = await ingest(sidecar, "s1", [{"id": "x", "role": "user", "content": "a"},
                                          {"id": "x", "role": "user", "content": "b"}])
    assert result["duplicates"] == 1
    assert result["usage"]["messages"] == 1


async def test_ids_are_scoped_per_session(sidecar):
    await ingest(sidecar, "s1", TOOL_TURN)
    other = await ingest(sidecar, "s2", TOOL_TURN)
    assert other["duplicates"] == 0
    with pytest.raises(JsonRpcException) as caught:
        await call(sidecar, methods.MEMORY_EXPAND, {"sessionId": "s3", "id": "u1"})
    assert caught.value.code == errors.UNKNOWN_SESSION


@pytest.mark.parametrize(("bad", "field"), [
    ({"role": "robot", "content": "x"}, "messages[1].role"),
    ({"role": "user"}, "messages[1].content"),
    ({"role": "user", "content": 5}, "messages[1].content"),
    ({"role": "tool", "content": "x"}, "messages[1].tool_call_id"),
    ({"role": "user", "content": "x", "tool_calls": []}, "messages[1].tool_calls"),
    ({"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": {}}]},
     "messages[1].tool_calls[0].function.name"),
    ({"role": "user", "content": "x", "id": ""}, "messages[1].id"),
    ({"role": "user", "content": "x", "metadata": []}, "messages[1].metadata"),
    ("not a message", "messages[1]"),
])
async def test_a_batch_with_one_bad_message_stores_nothing(duckdb_sidecar, bad, field):
    sidecar = duckdb_sidecar
    await ingest(sidecar, "s1", TOOL_TURN[:1])
    before = await snapshot(sidecar, "s1")
    with pytest.raises(JsonRpcException) as caught:
        await ingest(sidecar, "s1", [{"id": "ok", "role": "user", "content": "fine"}, bad])
    assert caught.value.code == errors.INVALID_PARAMS
    assert caught.value.data["field"] == field
    assert await snapshot(sidecar, "s1") == before


@pytest.mark.parametrize(("method", "params", "field"), [
    (methods.MEMORY_INGEST, {"sessionId": 5, "messages": []}, "sessionId"),
    (methods.MEMORY_INGEST, {"sessionId": "s", "messages": {}}, "messages"),
    (methods.MEMORY_INGEST, {"sessionId": "", "messages": []}, "sessionId"),
    (methods.MEMORY_INGEST, {"sessionId": "s", "messages": [], "session": {"contextWindow": "x"}},
     "session.contextWindow"),
    (methods.MEMORY_INGEST, {"sessionId": "s", "messages": [], "session": {"contextWindow": 0}},
     "session.contextWindow"),
    (methods.MEMORY_INGEST, {"sessionId": "s", "messages": [], "session": {"contextWindow": 2**40}},
     "session.contextWindow"),
    (methods.MEMORY_INGEST, {"sessionId": "s", "messages": [{"role": "user", "content": "bad \ud800 text"}]},
     "messages[0]"),
    (methods.MEMORY_INGEST, {"sessionId": "s", "messages": [], "session": {"title": "bad \udfff"}}, None),
    (methods.MEMORY_INGEST, {"sessionId": "s1", "messages": [{"role": "tool", "tool_call_id": "c\ud800",
                                                               "content": "x"}]}, "messages[0].tool_call_id"),
    (methods.MEMORY_IMPORT, {"path": "/no/such/transcript.jsonl"}, "path"),
    (methods.MEMORY_IMPORT, {"path": "/etc/hostname", "format": "pi"}, "path"),
    (methods.CONTEXT_ASSEMBLE, {"sessionId": "s1", "budget": "10"}, "budget"),
    (methods.CONTEXT_ASSEMBLE, {"sessionId": "s1", "budget": -1}, "budget"),
    (methods.CONTEXT_ASSEMBLE, {"sessionId": "s1", "freshTail": 1.5}, "freshTail"),
    (methods.CONTEXT_ASSEMBLE, {"sessionId": "s1", "prune": "yes"}, "prune"),
    (methods.MEMORY_EXPAND, {"sessionId": "s1"}, "id"),
    (methods.MEMORY_EXPAND, {"sessionId": "s1", "id": "u1", "tokenCap": 0}, "tokenCap"),
    (methods.MEMORY_GREP, {"sessionId": "s1", "pattern": 3}, "pattern"),
    (methods.MEMORY_GREP, {"sessionId": "s1", "pattern": ""}, "pattern"),
    (methods.MEMORY_GREP, {"sessionId": "s1", "pattern": "x", "scope": "all"}, "scope"),
    (methods.MEMORY_GREP, {"sessionId": "s1", "pattern": "x", "limit": 0}, "limit"),
    (methods.MEMORY_GREP, {"sessionId": "s1", "pattern": "(", "regex": True}, "pattern"),
    (methods.MEMORY_DESCRIBE, {"sessionId": "s1", "id": None}, "id"),
    (methods.MEMORY_DELETE_SESSION, {"sessionId": ["s1"]}, "sessionId"),
    (methods.CONTEXT_USAGE, {}, "sessionId"),
])
async def test_ill_typed_params_get_invalid_params_and_change_nothing(duckdb_sidecar, method, params, field):
    sidecar = duckdb_sidecar
    await ingest(sidecar, "s1", TOOL_TURN)
    before = await snapshot(sidecar, "s1")
    with pytest.raises(JsonRpcException) as caught:
        await call(sidecar, method, params)
    assert caught.value.code == errors.INVALID_PARAMS
    assert caught.value.data == ({"field": field} if field else None)
    assert await snapshot(sidecar, "s1") == before


@pytest.mark.parametrize("method", [methods.CONTEXT_ASSEMBLE, methods.MEMORY_GREP, methods.MEMORY_EXPAND,
                                    methods.MEMORY_DESCRIBE, methods.CONTEXT_USAGE])
async def test_unknown_session_gets_32001(duckdb_sidecar, method):
    sidecar = duckdb_sidecar
    params = {"sessionId": "nope", "id": "u1", "pattern": "x"}
    with pytest.raises(JsonRpcException) as caught:
        await call(sidecar, method, params)
    assert caught.value.code == errors.UNKNOWN_SESSION


async def test_ids_of_another_session_are_not_found(sidecar):
    await ingest(sidecar, "s1", TOOL_TURN)
    await ingest(sidecar, "s2", [{"id": "other", "role": "user", "content": "secret of s2"}])
    for method in (methods.MEMORY_EXPAND, methods.MEMORY_DESCRIBE):
        with pytest.raises(JsonRpcException) as caught:
            await call(sidecar, method, {"sessionId": "s1", "id": "other"})
        assert caught.value.code == errors.ID_NOT_FOUND
        assert "secret" not in caught.value.message
    grep = await call(sidecar, methods.MEMORY_GREP, {"sessionId": "s1", "pattern": "secret"})
    assert grep["matches"] == []


async def test_grep_literal_regex_and_case(sidecar):
    await ingest(sidecar, "s1", TOOL_TURN)
    literal = await call(sidecar, methods.MEMORY_GREP, {"sessionId": "s1", "pattern": "keyerror"})
    assert {m["id"] for m in literal["matches"]} == {"t1", "a2"}
    assert all("keyerror" in m["snippet"].lower() for m in literal["matches"])
    sensitive = await call(sidecar, methods.MEMORY_GREP,
                           {"sessionId": "s1", "pattern": "boom", "caseSensitive": True})
    assert sensitive["matches"] == []
    dotted = await call(sidecar, methods.MEMORY_GREP, {"sessionId": "s1", "pattern": "app.py"})
    assert {m["id"] for m in dotted["matches"]} == {"u1", "a1"}
    not_regex = await call(sidecar, methods.MEMORY_GREP, {"sessionId": "s1", "pattern": "app.p."})
    assert not_regex["matches"] == []
    regex = await call(sidecar, methods.MEMORY_GREP,
                       {"sessionId": "s1", "pattern": r"raise \w+Error", "regex": True})
    assert [m["id"] for m in regex["matches"]] == ["t1"]
    assert all("coveredBy" not in m for m in regex["matches"])


async def test_grep_limit_and_truncation(sidecar):
    await ingest(sidecar, "s1", coding_session(120))
    result = await call(sidecar, methods.MEMORY_GREP, {"sessionId": "s1", "pattern": "src/", "limit": 5})
    assert len(result["matches"]) == 5 and result["truncated"] is True
    summaries_only = await call(sidecar, methods.MEMORY_GREP,
                                {"sessionId": "s1", "pattern": "src/", "scope": "summaries"})
    assert summaries_only == {"matches": [], "truncated": False}


async def test_expand_caps_tokens_and_describe_a_message(sidecar):
    await ingest(sidecar, "s1", TOOL_TURN)
    described = await call(sidecar, methods.MEMORY_DESCRIBE, {"sessionId": "s1", "id": "t1"})
    assert described["kind"] == "message" and described["messageCount"] == 1
    assert described["content"]["tool_call_id"] == "c1"
    assert described["parents"] == [] and described["children"] == []
    assert described["tokens"] > 0 and described["earliestAt"].endswith("Z")


async def test_sessions_list_and_delete(sidecar):
    await ingest(sidecar, "old", TOOL_TURN[:1], title="first", contextWindow=32000)
    await ingest(sidecar, "new", TOOL_TURN, model="gpt-4o")
    listed = (await call(sidecar, methods.MEMORY_SESSIONS, {}))["sessions"]
    assert [s["sessionId"] for s in listed] == ["new", "old"]
    assert listed[1]["title"] == "first" and listed[1]["contextWindow"] == 32000
    assert listed[0]["messages"] == 4 and listed[0]["tokens"] > 0
    assert (await call(sidecar, methods.MEMORY_DELETE_SESSION, {"sessionId": "new"})) == {"deleted": True}
    assert (await call(sidecar, methods.MEMORY_DELETE_SESSION, {"sessionId": "new"})) == {"deleted": False}
    with pytest.raises(JsonRpcException) as caught:
        await call(sidecar, methods.CONTEXT_ASSEMBLE, {"sessionId": "new"})
    assert caught.value.code == errors.UNKNOWN_SESSION
    assert [s["sessionId"] for s in (await call(sidecar, methods.MEMORY_SESSIONS, {}))["sessions"]] == ["old"]
    again = await ingest(sidecar, "new", TOOL_TURN)
    assert again["duplicates"] == 0  # nothing of the deleted session lingers


async def test_usage_states_and_the_suggest_hint(sidecar):
    # Window 40000: suggest from 28000 (70%), threshold min(30000, 40000 - 8192, 80000) = 30000.
    result = await ingest(sidecar, "s1", [{"role": "user", "content": "x" * 400}], contextWindow=40000)
    assert result["usage"]["state"] == "ok" and "hint" not in result["usage"]
    assert result["usage"]["threshold"] == 30000
    waiter = sidecar.protocol.wait_for_notification_async(methods.CONTEXT_DID_CHANGE_USAGE)
    result = await ingest(sidecar, "s1", [{"role": "user", "content": "x" * 113_000}])
    usage = result["usage"]
    assert usage["state"] == "suggest", usage
    assert "/compact" in usage["hint"] and "71%" in usage["hint"]
    notified = await waiter
    assert notified["state"] == "suggest"
    over = await ingest(sidecar, "s1", [{"role": "user", "content": "x" * 8000}])
    assert over["usage"]["state"] in ("compact", "compacting")
    await call(sidecar, methods.CONTEXT_COMPACT, {"sessionId": "s1"})  # waits for the one that ingest started
    usage = await call(sidecar, methods.CONTEXT_USAGE, {"sessionId": "s1"})
    # Over the window, whatever compaction left; the automatic compaction this ingest starts shows first when
    # it has work (overflow with compaction off: test_pruning_usage, test_auto_compaction).
    too_big = await ingest(sidecar, "s1", [{"role": "user", "content": "x" * 4 * (40_000 - usage["tokens"] + 2000)}])
    assert too_big["usage"]["state"] in ("overflow", "compacting") and too_big["usage"]["percent"] > 100, too_big


async def test_out_of_range_timestamps_are_kept_without_a_time(sidecar):
    message = {"id": "old", "role": "user", "content": "x", "metadata": {"timestamp": "0001-01-01T00:00:00+14:00"}}
    await ingest(sidecar, "s1", [message])
    described = await call(sidecar, methods.MEMORY_DESCRIBE, {"sessionId": "s1", "id": "old"})
    assert described["content"] == message and described["earliestAt"].endswith("Z")


async def test_content_parts_and_unicode_are_stored_and_counted(sidecar):
    message = {"id": "p", "role": "user", "content": [{"type": "text", "text": "héllo wörld ✓ " * 10},
                                                       {"type": "image_url", "image_url": {"url": "data:x"}}]}
    result = await ingest(sidecar, "s1", [message])
    expanded = await call(sidecar, methods.MEMORY_EXPAND, {"sessionId": "s1", "id": "p"})
    assert json.dumps(expanded["items"][0]["message"], sort_keys=True) == json.dumps(message, sort_keys=True)
    assert result["usage"]["tokens"] > len("héllo wörld ✓ " * 10) // 4
