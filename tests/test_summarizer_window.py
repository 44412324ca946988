"""The summarizer fits its model's window; an endpoint's own error reaches the client."""

from __future__ import annotations

import pytest
from pygls.exceptions import JsonRpcException

from protocol import errors, methods
from sidecar.cli.synthetic import coding_session
from sidecar.config.settings import LlmSettings, read_settings
from sidecar.summarizers.fitting import summarizer_window
from sidecar.testing import FakeOpenAIServer, Reply
from sidecar.testing.openai_server import prompt_tokens
from tests.conftest import PI_SESSION, call, ingest, running_sidecar, settings_for

WINDOW = 8192
SUMMARY = "## Progress\nThe agent changed src/importers/pi.py and ran the tests; 3 failed, then passed."


def settings(db_path, llm: FakeOpenAIServer, **extra):
    return settings_for(db_path, compaction={"auto": False, "maxTokens": 20_000, "freshTail": 4, "keepRecentTokens": 0},
                        llm={"baseUrl": llm.base_url, "model": "fake-model", "timeoutSeconds": 30, **extra})


@pytest.mark.skipif(not PI_SESSION.exists(), reason="the pi session (shared/data) is not beside the project")
@pytest.mark.parametrize("mode", ["incremental", "full", "handoff"])
async def test_no_summarizer_prompt_is_over_the_window_on_the_pi_session(db_path, mode):
    with FakeOpenAIServer(context_window=WINDOW, responder=lambda request: SUMMARY) as llm:
        async with running_sidecar(settings=settings(db_path, llm, contextWindow=WINDOW)) as client:
            await call(client, methods.MEMORY_IMPORT, {"path": str(PI_SESSION), "sessionId": "pi"})
            result = await call(client, methods.CONTEXT_COMPACT, {"sessionId": "pi", "mode": mode})
        sizes = [prompt_tokens(r.body) for r in llm.chat_requests]
    assert result["compacted"], result
    assert llm.rejected == [], "the endpoint rejected prompts over its window"
    assert sizes and max(sizes) <= WINDOW * 0.9 - 64, "room is left for the answer"
    if mode == "handoff":
        # 87k tokens of history cannot go in one call: rounds, each updating the previous round's summary.
        updates = [r for r in llm.chat_requests if "<previous_summary>" in r.body["messages"][-1]["content"]]
        assert len(updates) >= 5


async def test_the_window_defaults_to_a_conservative_size_for_an_unknown_model(db_path):
    with FakeOpenAIServer(context_window=WINDOW, responder=lambda request: SUMMARY) as llm:
        async with running_sidecar(settings=settings(db_path, llm)) as client:
            await ingest(client, "s", coding_session(400, tool_output_bytes=6000))
            result = await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s", "mode": "handoff"})
    assert result["compacted"] and llm.rejected == [] and len(llm.chat_requests) > 1


async def test_an_over_window_rejection_is_reported_with_the_endpoints_error(db_path):
    # The model claims a large window the endpoint does not have: its 400 must reach the client as it is.
    with FakeOpenAIServer(context_window=2048, responder=lambda request: SUMMARY) as llm:
        async with running_sidecar(settings=settings(db_path, llm, contextWindow=200_000)) as client:
            await ingest(client, "s", coding_session(200))
            before = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
            with pytest.raises(JsonRpcException) as raised:
                await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s", "mode": "handoff"})
            after = await call(client, methods.CONTEXT_ASSEMBLE, {"sessionId": "s"})
    error = raised.value
    assert error.code == errors.SUMMARIZER_FAILED
    assert "HTTP 400" in error.message and "maximum context length is 2048 tokens" in error.message
    assert "empty summary response" not in error.message
    assert error.data["status"] == 400 and error.data["code"] == "context_length_exceeded"
    assert "maximum context length is 2048 tokens" in error.data["message"]
    assert after["messages"] == before["messages"], "nothing changed"


async def test_an_error_in_the_middle_of_a_stream_is_reported_as_that_error(db_path):
    text = "context length exceeded while generating"
    with FakeOpenAIServer(responder=lambda request: Reply(text="partial", stream_error=text)) as llm:
        async with running_sidecar(settings=settings(db_path, llm)) as client:
            await ingest(client, "s", coding_session(60))
            with pytest.raises(JsonRpcException) as raised:
                await call(client, methods.CONTEXT_COMPACT, {"sessionId": "s", "mode": "handoff"})
    assert raised.value.code == errors.SUMMARIZER_FAILED
    assert text in raised.value.message and "empty summary response" not in raised.value.message
    assert raised.value.data == {"status": None, "code": "stream_error", "message": text}


@pytest.mark.parametrize("value, problem", [
    (100, "llm.contextWindow: 100 is outside 1024..2147483647; using the default None"),
    ("8k", "llm.contextWindow: expected an integer, got the string '8k'; using the default None"),
])
def test_a_bad_context_window_setting_is_reported_and_replaced(value, problem):
    settings, problems = read_settings({"llm": {"model": "gpt-4o-mini", "contextWindow": value}})
    assert problems == [problem] and settings.llm.context_window is None
    assert summarizer_window(settings.llm) == 128_000, "the model table's window"


def test_the_window_comes_from_the_setting_then_the_model_table_then_8192():
    assert summarizer_window(LlmSettings(model="gpt-4o-mini", context_window=4096)) == 4096
    assert summarizer_window(LlmSettings(model="openrouter/anthropic/claude-sonnet-4-5")) == 200_000
    assert summarizer_window(LlmSettings(model="my-local-llama")) == 8192
