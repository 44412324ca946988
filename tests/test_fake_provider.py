"""FakeProvider speaks each API as the official SDKs read it: streamed and not, tool calls, thinking, usage, errors."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from sidecar.testing import FakeProvider, Reply, ToolCall, Usage, reference_policy

NAMESPACED = {"type": "namespace", "name": "mcp__context_sidecar", "description": "memory",
              "tools": [{"type": "function", "name": "memory_grep", "parameters": {"type": "object"}}]}


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as provider:
        yield provider


def claude(fake: FakeProvider) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="dummy", base_url=fake.url, max_retries=0)


def gpt(fake: FakeProvider) -> openai.OpenAI:
    return openai.OpenAI(api_key="dummy", base_url=fake.base_url, max_retries=0)


def ask(client: anthropic.Anthropic, **extra: Any) -> Any:
    return client.messages.create(model="claude-x", max_tokens=100,
                                  messages=[{"role": "user", "content": "hi"}], **extra)


THINKING_AND_TOOL = Reply(text="Let me look.", thinking="The user wants a listing.", signature="sig-1",
                          tool_calls=(ToolCall("Bash", {"command": "ls -la"}, id="toolu_1"),),
                          usage=Usage(input=11, output=7, cache_read=100, cache_write=20))


def test_anthropic_stream_builds_the_message_the_sdk_expects(fake: FakeProvider) -> None:
    fake.script(THINKING_AND_TOOL)
    with claude(fake).messages.stream(model="claude-x", max_tokens=100,
                                      messages=[{"role": "user", "content": "list"}]) as stream:
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    thinking, text, call = message.content
    assert (thinking.thinking, thinking.signature) == ("The user wants a listing.", "sig-1")  # type: ignore[union-attr]
    assert text.text == "Let me look."  # type: ignore[union-attr]
    assert (call.id, call.name, call.input) == ("toolu_1", "Bash", {"command": "ls -la"})  # type: ignore[union-attr]
    assert message.stop_reason == "tool_use"
    assert (message.usage.input_tokens, message.usage.output_tokens, message.usage.cache_read_input_tokens,
            message.usage.cache_creation_input_tokens) == (11, 7, 100, 20)
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds
    raw = fake.model_requests[0]
    assert raw.api == "anthropic" and raw.body["stream"] is True and raw.last_user_text == "list"


def test_anthropic_wire_order_and_ping(fake: FakeProvider) -> None:
    fake.script(Reply(text="one two three four five six seven eight nine ten"))
    body = json.dumps({"model": "m", "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "x"}]})
    request = urllib.request.Request(fake.url + "/v1/messages?beta=true", data=body.encode(),
                                     headers={"content-type": "application/json", "anthropic-version": "2023-06-01"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        text = response.read().decode()
    names = [line.removeprefix("event: ") for line in text.splitlines() if line.startswith("event: ")]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert names.count("content_block_delta") > 1
    assert fake.requests[0].query == {"beta": ["true"]} and fake.requests[0].path == "/v1/messages"


def test_anthropic_json_and_count_tokens(fake: FakeProvider) -> None:
    fake.script(Reply(text="plain", finish_reason="length"))
    message = ask(claude(fake))
    assert (message.content[0].text, message.stop_reason) == ("plain", "max_tokens")  # type: ignore[union-attr]
    short, long = (claude(fake).messages.count_tokens(model="m", messages=[{"role": "user", "content": "x" * n}])
                   for n in (400, 800))
    assert long.input_tokens - short.input_tokens == 100, "four characters a token"
    assert [r.api for r in fake.requests] == ["anthropic", "count_tokens", "count_tokens"]


@pytest.mark.parametrize(("status", "error"), [(529, anthropic.InternalServerError), (429, anthropic.RateLimitError),
                                               (400, anthropic.BadRequestError)])
def test_anthropic_errors_have_anthropics_shape(fake: FakeProvider, status: int, error: type[Exception]) -> None:
    fake.script(Reply(status=status, error_message="try later"))
    with pytest.raises(error) as caught:
        ask(claude(fake))
    body = caught.value.body  # type: ignore[attr-defined]
    assert body["type"] == "error" and body["error"]["message"] == "try later"
    assert body["error"]["type"] == {529: "overloaded_error", 429: "rate_limit_error", 400: "invalid_request_error"}[
        status]


def test_anthropic_error_event_mid_stream(fake: FakeProvider) -> None:
    fake.script(Reply(text="partial", stream_error="Overloaded"))
    with pytest.raises(anthropic.APIStatusError, match="Overloaded"), claude(fake).messages.stream(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]) as stream:
        for _ in stream:
            pass


def test_responses_stream_with_a_namespaced_tool_call(fake: FakeProvider) -> None:
    fake.responder = reference_policy(arguments={"pattern": "PLATYPUS"})
    stream = gpt(fake).responses.create(model="m", input="USE_TOOL please", tools=[NAMESPACED], stream=True)
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    call = events[-1].response.output[0]  # type: ignore[union-attr]
    assert (call.type, call.name, json.loads(call.arguments)) == ("function_call", "memory_grep",
                                                                  {"pattern": "PLATYPUS"})
    raw = json.loads(fake.requests[0].raw)
    assert raw["tools"][0]["type"] == "namespace"
    sent = next(e for e in events if e.type == "response.output_item.done")
    assert sent.model_dump()["item"]["namespace"] == "mcp__context_sidecar"


def test_responses_text_reasoning_usage_and_the_tool_result_turn(fake: FakeProvider) -> None:
    fake.responder = reference_policy()
    fake.script(Reply(text="hello there", thinking="hmm", usage=Usage(input=10, output=3, cache_read=90)))
    stream = gpt(fake).responses.create(model="m", input="hi", stream=True)
    events = list(stream)
    kinds = [e.type for e in events]
    for kind in ("response.output_item.added", "response.content_part.added", "response.output_text.delta",
                 "response.output_text.done", "response.content_part.done", "response.output_item.done",
                 "response.reasoning_summary_text.delta"):
        assert kind in kinds
    done = events[-1].response  # type: ignore[union-attr]
    assert done.output_text == "hello there" and done.output[0].type == "reasoning"
    assert (done.usage.input_tokens, done.usage.input_tokens_details.cached_tokens, done.usage.output_tokens) == (
        100, 90, 3)
    answer = gpt(fake).responses.create(model="m", input=[
        {"type": "function_call", "call_id": "c1", "name": "memory_grep", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "MEMHIT"}])
    assert answer.output_text == "FINAL: tool said: MEMHIT"


def test_responses_errors_have_openais_shape(fake: FakeProvider) -> None:
    fake.script(Reply(status=500, error_message="boom"))
    with pytest.raises(openai.InternalServerError) as caught:
        gpt(fake).responses.create(model="m", input="hi")
    assert caught.value.body == {"message": "boom", "type": "server_error", "param": None, "code": None}


def test_chat_streams_tool_calls_and_usage(fake: FakeProvider) -> None:
    fake.script(Reply(tool_calls=(ToolCall("read", {"path": "README.md"}),
                                  ToolCall("bash", '{"command": "pwd"}', id="call_b"))))
    stream = gpt(fake).chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}], stream=True,
                                               stream_options={"include_usage": True})
    chunks = list(stream)
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for delta in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            entry = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += delta.id or ""
            entry["name"] += (delta.function.name or "") if delta.function else ""
            entry["arguments"] += (delta.function.arguments or "") if delta.function else ""
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("read", {"path": "README.md"}), ("bash", {"command": "pwd"})]
    assert calls[1]["id"] == "call_b"
    assert len([c for c in chunks if c.choices and c.choices[0].delta.tool_calls]) > 2, "arguments in pieces"
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["tool_calls"] and chunks[-1].usage is not None and not chunks[-1].choices


def test_chat_json_with_cached_usage(fake: FakeProvider) -> None:
    fake.script(Reply(text="ok", usage=Usage(input=5, output=1, cache_read=50)))
    completion = gpt(fake).chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}])
    assert completion.choices[0].message.content == "ok" and completion.usage is not None
    assert completion.usage.prompt_tokens == 55 and completion.usage.prompt_tokens_details.cached_tokens == 50  # type: ignore[union-attr]


def test_a_dropped_stream_reaches_the_client_as_a_broken_connection(fake: FakeProvider) -> None:
    fake.script(Reply(text="never finished " * 10, drop_after=4))
    with pytest.raises(Exception, match="incomplete chunked read"), claude(fake).messages.stream(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]) as stream:
        stream.get_final_message()
    fake.script(Reply(drop_after=0))
    with pytest.raises(openai.APIConnectionError):
        gpt(fake).chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}])


def test_models_paths_and_unknown_paths_are_answered_and_recorded(fake: FakeProvider) -> None:
    assert [m.id for m in gpt(fake).models.list()] == ["fake-model"]
    assert [m.id for m in claude(fake).models.list()] == ["fake-model"]
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(fake.url + "/api/unknown?x=1", timeout=10)
    assert caught.value.code == 404 and "error" in json.loads(caught.value.read())
    assert [(r.method, r.path) for r in fake.requests][-1] == ("GET", "/api/unknown")


def test_the_window_rejects_long_prompts_in_each_apis_words(fake: FakeProvider) -> None:
    fake.context_window = 50
    long = "word " * 400
    with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
        claude(fake).messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": long}])
    with pytest.raises(openai.BadRequestError) as caught:
        gpt(fake).responses.create(model="m", input=[{"role": "user", "content": long}])
    assert caught.value.code == "context_length_exceeded" and len(fake.rejected) == 2


def test_wait_for_returns_when_the_request_arrives(fake: FakeProvider) -> None:
    fake.script(Reply(delay=0.2))
    with pytest.raises(TimeoutError):
        fake.wait_for(timeout=0.01)
    ask(claude(fake))
    assert fake.wait_for(lambda r: r.api == "anthropic", timeout=1)[0].body["model"] == "claude-x"


def test_as_a_process_it_prints_its_port_and_logs(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    process = subprocess.Popen([sys.executable, "-m", "sidecar.testing.provider", "--port", "0", "--log", str(log),
                                "--tool", "Bash", "--tool-args", '{"command": "true"}'],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        client = anthropic.Anthropic(api_key="dummy", base_url=f"http://127.0.0.1:{port}", max_retries=0)
        message = client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "USE_TOOL"}],
                                         tools=[{"name": "Bash", "input_schema": {"type": "object"}}])
        assert message.content[0].type == "tool_use" and message.content[0].input == {"command": "true"}
    finally:
        process.terminate()
        assert process.wait(10) == 0
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["method"], e["path"]) for e in entries] == [("POST", "/v1/messages")]
    assert entries[0]["headers"]["authorization"] == "Bearer dummy"


def test_stop_releases_the_port() -> None:
    with FakeProvider() as provider:
        port = provider.port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))
