"""memory/ingest extensions for faces that mirror an agent's conversation: ``after`` and each message's ``original``."""

from __future__ import annotations

import pytest
from pygls.exceptions import JsonRpcException

from protocol import errors as codes
from protocol import methods
from tests.conftest import call, ingest


def user(msg_id: str, text: str, **extra: object) -> dict[str, object]:
    return {"role": "user", "content": text, "id": msg_id, **extra}


async def test_after_appends_only_behind_the_newest_message(sidecar) -> None:
    await call(sidecar, methods.MEMORY_INGEST, {"sessionId": "s", "messages": [user("a", "one")], "after": ""})
    await call(sidecar, methods.MEMORY_INGEST, {"sessionId": "s", "messages": [user("b", "two")], "after": "a"})
    with pytest.raises(JsonRpcException) as caught:
        await call(sidecar, methods.MEMORY_INGEST, {"sessionId": "s", "messages": [user("c", "three")], "after": "a"})
    assert caught.value.code == codes.CONVERSATION_MOVED
    assert caught.value.data == {"lastId": "b"}
    with pytest.raises(JsonRpcException) as opened:
        await call(sidecar, methods.MEMORY_INGEST, {"sessionId": "s", "messages": [user("c", "three")], "after": ""})
    assert opened.value.data == {"lastId": "b"}
    context = await call(sidecar, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
    assert [item["id"] for item in context["items"]] == ["a", "b"]  # nothing stored by the refused ingests


async def test_after_on_an_unknown_session_must_be_empty(sidecar) -> None:
    with pytest.raises(JsonRpcException) as caught:
        await call(sidecar, methods.MEMORY_INGEST, {"sessionId": "new", "messages": [user("a", "x")], "after": "z"})
    assert caught.value.code == codes.CONVERSATION_MOVED
    assert caught.value.data == {"lastId": None}
    sessions = await call(sidecar, methods.MEMORY_SESSIONS, {})
    assert sessions["sessions"] == []


async def test_original_is_kept_beside_the_message_and_not_in_it(sidecar) -> None:
    provider = '{"role":"user","content":[{"type":"text","text":"one"}]}'
    await ingest(sidecar, "s", [user("a", "one", original=[provider]), user("b", "two")])
    expanded = await call(sidecar, methods.MEMORY_EXPAND, {"sessionId": "s", "id": "a"})
    assert expanded["items"][0]["original"] == [provider]
    assert "original" not in expanded["items"][0]["message"]
    plain = await call(sidecar, methods.MEMORY_EXPAND, {"sessionId": "s", "id": "b"})
    assert plain["items"][0].get("original") is None
    # A duplicate keeps the original it was stored with.
    result = await ingest(sidecar, "s", [user("a", "one", original=["other"])])
    assert result["duplicates"] == 1
    again = await call(sidecar, methods.MEMORY_EXPAND, {"sessionId": "s", "id": "a"})
    assert again["items"][0]["original"] == [provider]


async def test_original_of_the_wrong_type_is_invalid_params(sidecar) -> None:
    with pytest.raises(JsonRpcException) as caught:
        await ingest(sidecar, "s", [user("a", "one", original="not a list")])
    assert caught.value.code == codes.INVALID_PARAMS
    assert caught.value.data == {"field": "messages[0].original"}
