"""The README's examples run as shown: the agent on the Python client, and the raw JSON-RPC exchange."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.framing import FrameReader, encode
from sidecar.testing import FakeOpenAIServer
from sidecar.testing.standin import respond

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
EXAMPLE = ROOT / "examples" / "first_agent.py"


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README, flags=re.S | re.M)


@pytest.fixture
def clean_home() -> Iterator[dict[str, str]]:
    """HOME, data and runtime directories of the test's own (the runtime path must stay short for sockets)."""
    with tempfile.TemporaryDirectory(prefix="cs-") as home:
        env = {**os.environ, "HOME": home, "XDG_DATA_HOME": f"{home}/d", "XDG_RUNTIME_DIR": f"{home}/r",
               "XDG_CACHE_HOME": f"{home}/c", "XDG_STATE_HOME": f"{home}/s"}
        Path(env["XDG_RUNTIME_DIR"]).mkdir(mode=0o700)
        yield env
        sockets = Path(env["XDG_RUNTIME_DIR"], "context-sidecar")
        # The host lingers a few seconds after its last client, then removes its socket and exits.
        subprocess.run([sys.executable, "-c", f"""
import pathlib, time
deadline = time.monotonic() + 30
while any(pathlib.Path({str(sockets)!r}).glob('*.sock')) and time.monotonic() < deadline:
    time.sleep(0.05)
"""], check=True)


def test_the_readme_agent_is_examples_first_agent() -> None:
    assert EXAMPLE.read_text(encoding="utf-8") in code_blocks("python"), \
        "the README's agent and examples/first_agent.py differ"


def test_the_readme_agent_runs_against_the_stand_in_model(clean_home: dict[str, str]) -> None:
    with FakeOpenAIServer(responder=respond) as model:
        env = {**clean_home, "OPENAI_BASE_URL": model.base_url, "OPENAI_API_KEY": "none"}
        run = subprocess.run([sys.executable, str(EXAMPLE)], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0, run.stderr
        requests = [request.body for request in model.chat_requests]
    lines = run.stdout.splitlines()
    before, after = re.fullmatch(r"compacted: (\d+) -> (\d+) tokens", lines[0]).groups()  # type: ignore[union-attr]
    assert int(after) < int(before)
    assert lines[1] == 'tool call: memory_grep {"pattern": "failed"}'
    assert lines[2].startswith("assistant: From memory:") and "FAILED test_cart.py::test_discount" in lines[2]
    assert lines[3].startswith("summary sources: user ")
    # Two model calls: the question with the memory tools, then the tool's result; nothing sent back but the
    # fields a chat message has.
    assert len(requests) == 2
    assert {tool["function"]["name"] for tool in requests[0]["tools"]} >= {"memory_grep", "memory_expand"}
    assert requests[0]["messages"][0]["content"].startswith("<summary id=")
    call, result = requests[1]["messages"][-2:]
    assert set(call) == {"role", "tool_calls"} and result["role"] == "tool"
    assert result["tool_call_id"] == call["tool_calls"][0]["id"]
    assert "FAILED test_cart.py::test_discount" in result["content"]
    # The session is in the per-user database, where editors and other agents find it.
    assert list(Path(clean_home["XDG_DATA_HOME"], "context-sidecar").glob("memory.duckdb"))


def test_the_readme_json_rpc_exchange_is_what_the_server_answers() -> None:
    exchange = next(block for block in code_blocks("text") if block.startswith("→"))
    sent = [json.loads(line[2:]) for line in exchange.splitlines() if line.startswith("→")]
    shown = [line[2:] for line in exchange.splitlines() if line.startswith("←")]
    run = subprocess.run([sys.executable, "-m", "sidecar", "--db", ":memory:"],
                         input=b"".join(encode(message) for message in sent), capture_output=True, timeout=60)
    reader = FrameReader()
    reader.feed(run.stdout)
    replies = [frame.message for frame in reader.frames()]
    def key(text: str) -> object:
        method = re.match(r'\{"jsonrpc":"2.0","method":"([^"]+)"', text)
        return method.group(1) if method else int(re.match(r'\{"jsonrpc":"2.0","id":(\d+)', text).group(1))  # type: ignore[union-attr]

    assert [reply.get("id", reply.get("method")) for reply in replies] == [key(line) for line in shown]
    by_id = {reply.get("id"): reply for reply in replies}
    assert set(by_id[2]["result"]) == {"ids", "duplicates", "usage"}
    assemble = by_id[3]["result"]
    assert assemble["messages"] == [sent[2]["params"]["messages"][0]]
    assert json.dumps(assemble["messages"], separators=(",", ":")) in shown[-1]
