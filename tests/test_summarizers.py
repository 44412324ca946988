"""Summarizers: deterministic, prompts, escalation, and the OpenAI one against a real HTTP server."""

from __future__ import annotations

import asyncio
import logging
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import attrs
import openai
import pytest

from sidecar.config.settings import LlmSettings, Settings
from sidecar.engine.tokens import estimate_text_tokens
from sidecar.summarizers.base import SourceText, SummarizerError, SummaryRequest
from sidecar.summarizers.deterministic import (
    DeterministicSummarizer,
    changed_paths,
    extract_paths,
    truncate_to_tokens,
    truncation_marker,
)
from sidecar.summarizers.escalation import summarize_with_escalation
from sidecar.summarizers.llm import OpenAISummarizer, summarizer_from_settings
from sidecar.summarizers.prompts import HANDOFF_SECTIONS, build_prompt
from sidecar.testing import FakeOpenAIServer, Reply

KEY_ENV = "SIDECAR_TEST_SUMMARIZER_KEY"

SESSION = (
    SourceText("user", "Please refactor sidecar/engine/tokens.py to cache estimates. "
               "You must never import openai at module import.", "2025-01-02T10:00:00Z"),
    SourceText("assistant", 'I will read it first.\nread({"path": "sidecar/engine/tokens.py"})'),
    SourceText("tool result (read)", "def estimate_text_tokens(text):\n    return len(text) // 4\n"),
    SourceText("assistant", "We decided to use an LRU cache instead of a dict because memory must stay "
               'bounded.\nedit({"path": "sidecar/engine/tokens.py", "oldText": "a", "newText": "b"})'),
    SourceText("tool result (bash)", "FAILED tests/test_tokens.py::test_cache - AssertionError: 3 != 4"),
    SourceText("assistant", "Fixed the off-by-one in tests/test_tokens.py. All tests pass now. "
               "Next I will document the cache in README.md."),
)


def request(kind: str = "leaf", sources: tuple[SourceText, ...] = SESSION, target: int = 400,
            **changes: Any) -> SummaryRequest:
    return SummaryRequest(kind=kind, sources=sources, target_tokens=target, **changes)  # type: ignore[arg-type]


def summarize(req: SummaryRequest) -> str:
    return DeterministicSummarizer().summarize_now(req)


def headings(text: str) -> list[str]:
    return re.findall(r"^## (.+)$", text, re.M)


def section(text: str, title: str) -> str:
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def long_reply(lines: int = 80) -> str:
    return "\n".join(f"Line {i}: the work on module{i}.py is finished, tests pass." for i in range(lines))


# Deterministic summarizer


async def test_digest_keeps_instructions_paths_decisions_errors_and_latest_state() -> None:
    text = await DeterministicSummarizer().summarize(request())
    assert "You must never import openai at module import." in text
    for path in ("sidecar/engine/tokens.py", "tests/test_tokens.py", "README.md"):
        assert path in text
    assert "LRU cache instead of a dict" in text
    assert "AssertionError: 3 != 4" in text
    assert "Next I will document the cache in README.md." in text
    files, first = text.splitlines()[:2]
    assert files == "Files: sidecar/engine/tokens.py, tests/test_tokens.py, README.md"
    assert first.startswith("- user @ 2025-01-02 10:00: Please refactor")


def test_handoff_has_the_eight_sections_in_order() -> None:
    text = summarize(request("handoff"))
    assert headings(text) == list(HANDOFF_SECTIONS)
    assert "Please refactor sidecar/engine/tokens.py" in section(text, "Goal")
    assert "You must never import openai at module import." in section(text, "Key Instructions")
    assert "LRU cache" in section(text, "Key Decisions")
    assert "sidecar/engine/tokens.py" in section(text, "Files Changed")
    assert "All tests pass now" in section(text, "Current State")
    assert "README.md" in section(text, "Next Steps")
    assert "None noted." in section(text, "Blockers")  # the failure was fixed afterwards


def test_handoff_merges_the_previous_handoff() -> None:
    earlier = (SourceText("user", "Port the parser to Rust. Never use unsafe code."),
               SourceText("assistant", 'Created src/parser.rs with the lexer, as docs/grammar.md says.\n'
                          'write({"path": "src/parser.rs"})'))
    previous = summarize(request("handoff", earlier))
    text = summarize(request("handoff", SESSION, previous_summary=previous))
    assert headings(text) == list(HANDOFF_SECTIONS)
    assert "Port the parser to Rust." in section(text, "Goal")
    assert "Please refactor" not in section(text, "Goal")
    instructions = section(text, "Key Instructions")
    assert "Never use unsafe code." in instructions
    assert "You must never import openai at module import." in instructions
    assert instructions.index("Never use unsafe") < instructions.index("You must never")
    files = section(text, "Files Changed")
    assert "src/parser.rs" in files and "sidecar/engine/tokens.py" in files
    [also] = [line for line in files.splitlines() if "Also referenced:" in line]
    assert "docs/grammar.md" in also and "README.md" in also
    assert "All tests pass now" in section(text, "Current State")
    assert "src/parser.rs with the lexer" not in section(text, "Current State")


def test_handoff_takes_in_a_previous_summary_in_another_format() -> None:
    previous = "We ported lib/io.c and must keep C99."
    text = summarize(request("handoff", SESSION[-1:], previous_summary=previous))
    assert headings(text) == list(HANDOFF_SECTIONS)
    assert "lib/io.c" in text and "must keep C99" in text


@pytest.mark.parametrize("kind", ["leaf", "condensed", "handoff"])
def test_cuts_to_the_target_with_a_visible_marker(kind: str) -> None:
    sources = tuple(SourceText("user", f"Step {i}: you must update pkg/mod{i}.py so that value {i} is kept. "
                               "Always run the tests.") for i in range(300))
    text = summarize(request(kind, sources, target=120))
    assert estimate_text_tokens(text) <= 120
    if kind == "handoff":  # every section stays; each says how many items it left out
        assert headings(text) == list(HANDOFF_SECTIONS) and "more omitted)" in text
    else:
        assert text.endswith(truncation_marker(120)) and text.startswith("Files: pkg/mod0.py")


def test_truncation_cuts_at_a_line_then_at_a_sentence() -> None:
    lines = [f"line {i} says something fairly long about item {i}." for i in range(100)]
    cut = truncate_to_tokens("\n".join(lines), 50)
    body, marker = cut.rsplit("\n", 1)
    assert marker == "[… truncated to ~50 tokens]" and estimate_text_tokens(cut) <= 50
    assert body.splitlines() == lines[: len(body.splitlines())]
    one_line = " ".join(lines)
    cut = truncate_to_tokens(one_line, 50)
    assert cut.split("\n")[0].endswith(".") and one_line.startswith(cut.split("\n")[0])
    assert truncate_to_tokens("short text", 50) == "short text"


def test_output_is_deterministic() -> None:
    for kind in ("leaf", "handoff"):
        req = request(kind, focus="cache", previous_summary="earlier: set up the repo")
        assert summarize(req) == summarize(attrs.evolve(req)) == DeterministicSummarizer().summarize_now(req)


def test_aggressive_is_terser() -> None:
    sources = tuple(SourceText("assistant" if i % 2 else "user",
                               f"Message {i} decided to move src/m{i}.py instead of copying it because tests "
                               f"broke. It also fixed bug {i}. We will check lint next.") for i in range(40))
    for kind in ("leaf", "handoff"):
        normal = summarize(request(kind, sources, target=1500))
        terse = summarize(request(kind, sources, target=1500, aggressive=True))
        assert estimate_text_tokens(terse) <= 900 < estimate_text_tokens(normal) <= 1500


def test_focus_related_lines_come_first() -> None:
    first = summarize(request(focus="README")).splitlines()[0]
    assert first.startswith("- assistant: Fixed the off-by-one") and "README.md" in first
    assert summarize(request()).splitlines()[1].startswith("- user")
    handoff = summarize(request("handoff", focus="openai"))
    assert section(handoff, "Key Instructions").startswith("- You must never import openai")


def test_never_empty_for_non_empty_sources() -> None:
    for kind in ("leaf", "condensed", "handoff"):
        assert summarize(request(kind, (SourceText("assistant", ""),))).strip()
        assert summarize(request(kind, (SourceText("tool result (bash)", "ok"),), target=5)).strip()


def test_path_extraction() -> None:
    text = ("See https://example.com/a/b.py, and/or e.g. v1.2.3; edit a.py:12 and ./run.sh, "
            "/etc/hosts, src/, sidecar.summarizers.base, ~/.config/x.toml")
    assert extract_paths(text) == ["a.py", "./run.sh", "/etc/hosts", "src/", "~/.config/x.toml"]
    written = 'write({"path": "docs/new.md", "content": "x"})\nI read lib/a.py.'
    assert changed_paths(written) == ["docs/new.md"]


# Prompts


def test_prompts_ask_for_the_handoff_sections_and_keep_instructions_and_paths() -> None:
    prompt = build_prompt(request("handoff"))
    positions = [prompt.user.index(f"## {title}") for title in HANDOFF_SECTIONS]
    assert positions == sorted(positions)
    assert "verbatim" in prompt.user and "every file path" in prompt.user.lower()
    assert "sidecar/engine/tokens.py" in prompt.user and "<history>" in prompt.user
    assert [m["role"] for m in prompt.messages()] == ["system", "user"]


def test_prompts_differ_by_kind_and_mode_and_carry_previous_and_focus() -> None:
    users = {build_prompt(request(kind, aggressive=aggressive)).user
             for kind in ("leaf", "condensed", "handoff") for aggressive in (False, True)}
    assert len(users) == 6
    assert "much shorter" in build_prompt(request(aggressive=True)).user
    leaf = build_prompt(request(previous_summary="PREVIOUS SPAN", focus="keep the SQL")).user
    assert "do not repeat it" in leaf and "PREVIOUS SPAN" in leaf
    assert leaf.endswith("Additionally: keep the SQL")
    handoff = build_prompt(request("handoff", previous_summary="OLD HANDOFF")).user
    assert "Update that previous handoff summary" in handoff and "OLD HANDOFF" in handoff
    assert "Additionally" not in handoff


# The fake OpenAI server and the OpenAI summarizer


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as fake:
        yield fake


@pytest.fixture
async def make_llm(server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
                   ) -> AsyncIterator[Callable[..., OpenAISummarizer]]:
    monkeypatch.delenv(KEY_ENV, raising=False)
    made: list[OpenAISummarizer] = []

    def make(stream: bool = True, timeout: float = 5, concurrency: int = 4, retries: int = 2,
             base_url: str | None = None) -> OpenAISummarizer:
        settings = LlmSettings(base_url=base_url or server.base_url, model="fake-model", api_key_env=KEY_ENV,
                               timeout_seconds=timeout, max_concurrency=concurrency, temperature=0.3)
        made.append(OpenAISummarizer(settings, stream=stream, max_retries=retries, backoff_seconds=0.01))
        return made[-1]

    yield make
    for summarizer in made:
        await summarizer.aclose()


@pytest.mark.parametrize("stream", [True, False])
async def test_openai_summarizer_returns_the_reply(server: FakeOpenAIServer, make_llm: Any,
                                                   stream: bool) -> None:
    server.script(Reply(text="  A summary that keeps sidecar/engine/tokens.py.  ", chunks=None))
    text = await make_llm(stream=stream).summarize(request(focus="mention the cache"))
    assert text == "A summary that keeps sidecar/engine/tokens.py."
    [sent] = server.chat_requests
    assert sent.body["model"] == "fake-model" and sent.body["temperature"] == 0.3
    assert bool(sent.body.get("stream")) is stream
    system, user = sent.body["messages"]
    assert system["role"] == "system" and user["role"] == "user"
    assert "You must never import openai" in user["content"]
    assert user["content"].endswith("Additionally: mention the cache")


@pytest.mark.parametrize("status", [500, 502, 429])
async def test_transient_errors_are_retried(server: FakeOpenAIServer, make_llm: Any, status: int) -> None:
    server.script(Reply(status=status), Reply(text="recovered"))
    assert await make_llm().summarize(request()) == "recovered"
    assert len(server.chat_requests) == 2


async def test_persistent_500_fails_after_the_retries(server: FakeOpenAIServer, make_llm: Any) -> None:
    server.responder = lambda _: Reply(status=503, error_message="overloaded")
    with pytest.raises(SummarizerError, match=r"HTTP 503: overloaded \(after 3 attempts\)"):
        await make_llm(retries=2).summarize(request())
    assert len(server.chat_requests) == 3


async def test_client_errors_are_not_retried(server: FakeOpenAIServer, make_llm: Any) -> None:
    server.responder = lambda _: Reply(status=400, error_message="bad model")
    with pytest.raises(SummarizerError, match="HTTP 400: bad model"):
        await make_llm().summarize(request())
    assert len(server.chat_requests) == 1


@pytest.mark.parametrize("stream", [True, False])
async def test_empty_content_is_an_error(server: FakeOpenAIServer, make_llm: Any, stream: bool) -> None:
    server.script(Reply(empty=True))
    with pytest.raises(SummarizerError) as caught:
        await make_llm(stream=stream).summarize(request())
    assert str(caught.value) == "empty summary response"
    server.script(Reply(text=" \n\t "))
    with pytest.raises(SummarizerError, match=r"^empty summary response$"):
        await make_llm(stream=stream).summarize(request())


@pytest.mark.parametrize("stream", [True, False])
async def test_malformed_body_is_an_error(server: FakeOpenAIServer, make_llm: Any, stream: bool) -> None:
    server.script(Reply(malformed=True))
    with pytest.raises(SummarizerError, match="malformed summarizer response"):
        await make_llm(stream=stream).summarize(request())


async def test_slow_server_times_out(server: FakeOpenAIServer, make_llm: Any) -> None:
    server.responder = lambda _: Reply(delay=3)
    with pytest.raises(SummarizerError, match=r"timed out after 0.2s \(after 2 attempts\)"):
        await make_llm(timeout=0.2, retries=1).summarize(request())
    assert len(server.chat_requests) == 2


async def test_a_trickling_stream_still_times_out(server: FakeOpenAIServer, make_llm: Any) -> None:
    server.script(Reply(chunks=("a ", "b ", "c ", "d "), chunk_delay=0.2))
    with pytest.raises(SummarizerError, match="timed out"):
        await make_llm(timeout=0.5, retries=0).summarize(request())


async def test_unreachable_endpoint_is_an_error(make_llm: Any) -> None:
    with FakeOpenAIServer() as gone:
        url = gone.base_url
    with pytest.raises(SummarizerError, match="cannot reach the summarizer endpoint"):
        await make_llm(base_url=url, retries=1).summarize(request())


async def test_concurrency_is_bounded(server: FakeOpenAIServer, make_llm: Any) -> None:
    server.responder = lambda _: Reply(text="done", delay=0.1)
    summarizer = make_llm(concurrency=2)
    results = await asyncio.gather(*(summarizer.summarize(request()) for _ in range(8)))
    assert results == ["done"] * 8
    assert server.max_in_flight == 2


async def test_cancellation_propagates(server: FakeOpenAIServer, make_llm: Any) -> None:
    server.script(Reply(hang=True))
    summarizer = make_llm(concurrency=1)
    task = asyncio.create_task(summarizer.summarize(request()))
    while server.in_flight == 0:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    server.script("after the cancel")
    assert await asyncio.wait_for(summarizer.summarize(request()), 3) == "after the cancel"


async def test_api_key_comes_from_the_env_var_at_call_time_and_is_never_logged(
        server: FakeOpenAIServer, make_llm: Any, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    summarizer = make_llm(retries=1)
    monkeypatch.setenv(KEY_ENV, "sk-first-secret")
    await summarizer.summarize(request())
    monkeypatch.setenv(KEY_ENV, "sk-second-secret")
    server.responder = lambda _: Reply(status=500, error_message="Incorrect API key: sk-second-secret")
    with pytest.raises(SummarizerError) as caught:
        await summarizer.summarize(request())
    sent = [r.headers["authorization"] for r in server.chat_requests]
    assert sent == ["Bearer sk-first-secret", "Bearer sk-second-secret", "Bearer sk-second-secret"]
    assert "HTTP 500" in str(caught.value) and "secret" not in str(caught.value)
    assert "summarizer attempt 1 of 2 failed" in caplog.text
    assert "secret" not in caplog.text
    assert "secret" not in repr(vars(summarizer))


async def test_placeholder_key_for_a_local_server(server: FakeOpenAIServer, make_llm: Any) -> None:
    await make_llm().summarize(request())
    assert server.chat_requests[0].headers["authorization"] == "Bearer not-needed"


async def test_no_key_and_no_base_url_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    summarizer = OpenAISummarizer(LlmSettings(model="gpt-test", api_key_env=KEY_ENV))
    with pytest.raises(SummarizerError, match=f"no API key: the environment variable {KEY_ENV} is not set"):
        await summarizer.summarize(request())


def test_summarizer_from_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    local = LlmSettings(model="m", base_url="http://127.0.0.1:9/v1", api_key_env=KEY_ENV)
    assert summarizer_from_settings(local).name == "openai"
    assert summarizer_from_settings(Settings(llm=local)).name == "openai"
    assert summarizer_from_settings(LlmSettings(base_url="http://127.0.0.1:9/v1")).name == "deterministic"
    assert summarizer_from_settings(LlmSettings(model="m", api_key_env=KEY_ENV)).name == "deterministic"
    monkeypatch.setenv(KEY_ENV, "sk-x")
    assert summarizer_from_settings(LlmSettings(model="m", api_key_env=KEY_ENV)).name == "openai"


def test_openai_is_imported_lazily() -> None:
    code = ("import sys, sidecar.summarizers.llm, sidecar.summarizers.escalation, sidecar.testing; "
            "print('openai' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


async def test_fake_server_lists_models_and_checks_its_key() -> None:
    with FakeOpenAIServer(models=("a", "b"), api_key="sk-right") as fake:
        async with openai.AsyncOpenAI(api_key="sk-right", base_url=fake.base_url, max_retries=0) as client:
            assert [m.id for m in (await client.models.list()).data] == ["a", "b"]
        async with openai.AsyncOpenAI(api_key="sk-wrong", base_url=fake.base_url, max_retries=0) as client:
            with pytest.raises(openai.AuthenticationError):
                await client.chat.completions.create(model="a", messages=[{"role": "user", "content": "hi"}])
        assert [r.path for r in fake.requests] == ["/v1/models", "/v1/chat/completions"]


async def test_fake_server_streams_usage_when_asked() -> None:
    with FakeOpenAIServer() as fake:
        fake.script(Reply(text="one two three four five six seven eight nine ten eleven twelve thirteen"))
        async with openai.AsyncOpenAI(api_key="k", base_url=fake.base_url, max_retries=0) as client:
            stream = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True,
                stream_options={"include_usage": True})
            chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("one two") and len([c for c in chunks if c.choices]) > 3
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_fake_server_stops_quickly_with_a_hanging_request() -> None:
    fake = FakeOpenAIServer().start()
    fake.script(Reply(hang=True))
    body = b'{"model": "m", "messages": []}'
    call = urllib.request.Request(f"{fake.base_url}/chat/completions", data=body,
                                  headers={"Content-Type": "application/json"})
    outcome: list[BaseException] = []

    def post() -> None:
        try:
            urllib.request.urlopen(call, timeout=60)
        except Exception as error:
            outcome.append(error)

    client = threading.Thread(target=post)
    client.start()
    while fake.in_flight == 0:
        time.sleep(0.01)
    fake.stop()
    client.join(30)
    assert outcome and not client.is_alive(), "stop() dropped the hanging connection"


# Escalation


@pytest.fixture
def escalating(make_llm: Any) -> Callable[[SummaryRequest], Any]:
    return lambda req: summarize_with_escalation(make_llm(), DeterministicSummarizer(), req)


async def test_escalation_normal(server: FakeOpenAIServer, escalating: Any) -> None:
    server.script("x" * 600)  # exactly 150% of a 100-token target
    result = await escalating(request(target=100))
    assert (result.level, result.calls, result.text) == ("normal", 1, "x" * 600)


async def test_escalation_aggressive(server: FakeOpenAIServer, escalating: Any) -> None:
    server.script(long_reply(), "a terse summary")
    result = await escalating(request(target=100))
    assert (result.level, result.calls, result.text) == ("aggressive", 2, "a terse summary")
    first, second = (r.body["messages"][1]["content"] for r in server.chat_requests)
    assert "much shorter" in second and "much shorter" not in first


async def test_escalation_truncates_when_still_too_long(server: FakeOpenAIServer, escalating: Any) -> None:
    server.script(long_reply(120), long_reply(60))
    result = await escalating(request(target=100))
    assert (result.level, result.calls) == ("truncated", 2)
    assert estimate_text_tokens(result.text) <= 100
    body, marker = result.text.rsplit("\n", 1)
    assert marker == truncation_marker(100)
    assert long_reply(60).startswith(body + "\n")


async def test_escalation_lets_summarizer_errors_through(server: FakeOpenAIServer, escalating: Any) -> None:
    server.script(Reply(status=401, error_message="no access"))
    with pytest.raises(SummarizerError, match="HTTP 401"):
        await escalating(request())


async def test_escalation_with_the_deterministic_summarizer_needs_one_call() -> None:
    big = tuple(SourceText("user", f"You must keep file{i}.py working.") for i in range(200))
    summarizer = DeterministicSummarizer()
    result = await summarize_with_escalation(summarizer, summarizer, request("leaf", big, target=80))
    assert (result.level, result.calls) == ("normal", 1) and estimate_text_tokens(result.text) <= 80
