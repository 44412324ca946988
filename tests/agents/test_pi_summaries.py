"""pi's extension runs the sidecar's summary calls on pi's current model with pi's own credentials, offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.testing import RecordedRequest, Reply
from tests.agents.runners import Pi
from tests.agents.test_pi_extension import configure, user_texts, with_extension, words
from tests.agents.world import AgentWorld
from tests.helpers.proxy import is_summary_call

SECRET = "sk-pi-own-secret-51c0de"
SUMMARY_TEXT = "PI MODEL SUMMARY: the tokenizer rules, step by step"



def respond(request: RecordedRequest) -> Reply:
    return Reply(text=SUMMARY_TEXT if is_summary_call(request) else "Noted.")


def with_key(pi: Pi) -> None:
    """pi's models.json names the provider's key itself: pi's own credential, which pi's model registry hands out."""
    write = pi.write_models

    def write_models() -> Path:
        path = write()
        models = json.loads(path.read_text(encoding="utf-8"))
        models["providers"]["fake"]["apiKey"] = SECRET
        path.write_text(json.dumps(models), encoding="utf-8")
        return path

    pi.write_models = write_models  # type: ignore[method-assign]


def test_pi_s_model_writes_the_summaries_with_pi_s_key(pi: Pi, agent_world: AgentWorld) -> None:
    agent_world.provider.responder = respond
    with_key(pi)
    configure(pi, window=200_000, reserve=16_384, sidecar={
        "compaction": {"maxTokens": 2500, "freshTail": 2, "leafChunkSize": 2, "minSavings": 0,
                       "keepRecentTokens": 0}})
    with with_extension(pi) as rpc:
        for step in range(30):
            rpc.prompt(words(step))
            agents = [r for r in agent_world.provider.model_requests if not is_summary_call(r)]
            if any(SUMMARY_TEXT in text for text in user_texts(agents[-1])):
                break
        else:
            pytest.fail("no request of pi carried the summary its model wrote")
    requests = agent_world.provider.model_requests
    summaries = [r for r in requests if is_summary_call(r)]
    assert summaries
    for call in summaries:
        assert call.headers.get("authorization") == f"Bearer {SECRET}"
        assert call.body["model"] == "fake-model" and call.path.endswith("/chat/completions")
    # The key never lands in the sidecar's database, logs or runtime directory.
    for name in ("XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR"):
        place = agent_world.xdg[name]
        paths = [p for p in place.rglob("*") if p.is_file()] if place.exists() else []
        assert not [str(p) for p in paths if SECRET.encode() in p.read_bytes()]
    assert any(p.suffix == ".duckdb" for p in agent_world.xdg["XDG_DATA_HOME"].rglob("*")), "the database was looked at"
