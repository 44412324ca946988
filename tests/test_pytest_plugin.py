"""The pytest plugin, used the way an agent author would: a fresh pytest process that finds it by entry point."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

HARNESS = '''
import asyncio
import os

import pytest

from sidecar.pytest_plugin import llm_settings

PIDS = []
WORDS = "the parser drops the last token when the file ends without a newline; "


def chat(count):
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{i} " + WORDS * 8} for i in range(count)]


async def test_sidecar_is_a_real_initialized_server_on_a_temp_db(sidecar, sidecar_db):
    assert sidecar.capabilities["protocolVersion"] == 1
    assert sidecar.capabilities["storage"] == str(sidecar_db)
    assert sidecar.capabilities["summarizer"] == "deterministic"
    os.kill(sidecar.process.pid, 0)
    PIDS.append(sidecar.process.pid)
    await sidecar.ingest("s", [{"role": "user", "content": "hi", "id": "m1"}])
    assembled = await sidecar.assemble("s")
    assert assembled.messages == [{"role": "user", "content": "hi"}]


def test_the_sidecar_of_the_previous_test_was_shut_down():
    with pytest.raises(ProcessLookupError):
        os.kill(PIDS[0], 0)


@pytest.mark.sidecar_settings(contextWindow=8000, compaction={"maxTokens": 2000, "freshTail": 4})
async def test_the_marker_overrides_settings_and_auto_compaction_stays_on(sidecar):
    compacted = sidecar.wait_for_notification("context/didCompact", timeout=20)
    result = await sidecar.ingest("s", chat(40))
    assert result.usage.context_window == 8000 and result.usage.threshold == 2000
    event = await compacted
    assert event.trigger == "auto" and event.tokens_after < event.tokens_before


class TestWithScriptedSummaries:
    @pytest.fixture
    def sidecar_settings(self, openai_server):
        settings = llm_settings(openai_server)
        settings["compaction"]["auto"] = False
        return settings

    async def test_summaries_come_from_the_scripted_server(self, sidecar, openai_server):
        assert sidecar.capabilities["summarizer"] == "openai"
        openai_server.responder = lambda request: "Scripted summary: the parser bug."
        await sidecar.ingest("s", chat(40))
        result = await sidecar.compact("s", focus="the parser")
        assert result.compacted and result.usage.summaries >= 1
        bodies = [r.body for r in openai_server.chat_requests]
        assert bodies and all(b["model"] == "fake-model" for b in bodies)
        assert any("Additionally: the parser" in str(b["messages"]) for b in bodies)
        assembled = await sidecar.assemble("s")
        assert "Scripted summary: the parser bug." in assembled.messages[0]["content"]


async def test_the_factory_reopens_the_same_database(sidecar_factory):
    first = await sidecar_factory()
    await first.ingest("kept", [{"role": "user", "content": "remember me"}])
    await first.close()
    second = await sidecar_factory(settings={"contextWindow": 16000})
    sessions = {s.session_id: s.messages for s in (await second.sessions()).sessions}
    assert sessions == {"kept": 1}
    assert (await second.usage("kept")).context_window == 16000
'''

STRICT = '''
import pytest


@pytest.mark.asyncio
async def test_strict_mode(sidecar, openai_server):
    assert openai_server.base_url.startswith("http://127.0.0.1:")
    assert (await sidecar.ingest("s", [{"role": "user", "content": "hi"}])).usage.messages == 1
'''


def test_the_plugin_fixtures_in_an_agent_authors_test_suite(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_harness=HARNESS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", timeout=120)
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(["plugins:*context-sidecar-*",
                                 "*test_the_marker_overrides_settings_and_auto_compaction_stays_on PASSED*"])


def test_the_plugin_in_strict_asyncio_mode(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nasyncio_mode = strict\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_strict=STRICT)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
