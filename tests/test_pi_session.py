"""The real pi coding-agent session through the server: stored losslessly, assembled validly."""

from __future__ import annotations

import pytest

from protocol import methods
from sidecar.importers import parse_transcript
from tests.conftest import PI_SESSION, call, ingest, running_sidecar, settings_for
from tests.helpers.openai_checks import assert_valid_openai_sequence

pytestmark = pytest.mark.skipif(not PI_SESSION.exists(), reason="shared/data is not beside the project")


@pytest.fixture(scope="module")
def pi_messages():
    return parse_transcript(PI_SESSION, "pi").messages


async def test_pi_session_is_stored_losslessly_and_assembles_validly(db_path, pi_messages):
    async with running_sidecar(settings=settings_for(db_path, compaction={"auto": False})) as client:
        result = await ingest(client, "pi", pi_messages, model="claude-sonnet-4-5")
        assert result["ids"] == [m["id"] for m in pi_messages]
        assert result["usage"]["contextWindow"] == 200_000
        for budget in (4_000, 30_000, 120_000, 10_000_000):
            for prune in (False, True):
                assembled = await call(client, methods.CONTEXT_ASSEMBLE,
                                       {"sessionId": "pi", "budget": budget, "prune": prune})
                assert_valid_openai_sequence(assembled["messages"])
                assert assembled["tokens"] <= budget or assembled["overBudget"]
        everything = await call(client, methods.CONTEXT_ASSEMBLE,
                                {"sessionId": "pi", "budget": 10_000_000, "prune": False})
        assert len(everything["items"]) == len(pi_messages) and everything["dropped"] == 0
        for original in pi_messages[::7]:
            expanded = await call(client, methods.MEMORY_EXPAND, {"sessionId": "pi", "id": original["id"]})
            assert expanded["items"][0]["message"] == original


async def test_grep_finds_text_from_the_real_session(sidecar, pi_messages):
    await ingest(sidecar, "pi", pi_messages)
    hits = await call(sidecar, methods.MEMORY_GREP, {"sessionId": "pi", "pattern": "user-message-selector"})
    assert hits["matches"], "the session talks about user-message-selector.ts"
    assert all("user-message-selector" in m["snippet"].lower() for m in hits["matches"])
