"""Fixtures for tests through the real agents, offline: an isolated world per test and a runner per agent.

Each test gets a temp HOME (XDG dirs too), a workspace, a ``FakeProvider`` and a ``RefusingProxy`` in the
agents' env; after the test the proxy must have seen nothing. An agent missing from the cache skips its tests
(fails them under ``CONTEXT_SIDECAR_REQUIRE_AGENTS=1``); ``SKIP_AGENTS=1`` skips them all.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.testing import FakeProvider
from sidecar.testing.refusing_proxy import RefusingProxy
from tests.agents.install import agent_binary
from tests.agents.runners import Claude, Codex, Pi
from tests.agents.world import AgentWorld


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test here ``agents`` (``-m "not agents"`` leaves them out)."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.agents)


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker."""
    config.addinivalue_line("markers", "agents: runs a real coding agent (tests/agents)")


@pytest.fixture
def fake_provider() -> Iterator[FakeProvider]:
    """The scripted model every agent of the test talks to; set ``.responder`` or ``.script(...)``."""
    with FakeProvider() as provider:
        yield provider


@pytest.fixture
def refusing_proxy() -> Iterator[RefusingProxy]:
    """The proxy in the agents' ``HTTPS_PROXY``/``HTTP_PROXY``: it refuses and records every attempt."""
    with RefusingProxy() as proxy:
        yield proxy


@pytest.fixture
def agent_world(tmp_path: Path, fake_provider: FakeProvider, refusing_proxy: RefusingProxy) -> Iterator[AgentWorld]:
    """The test's isolated world; after the test, asserts nothing tried to leave the machine."""
    runtime = Path(tempfile.mkdtemp(prefix="cs-run-"))  # short: the sidecar's host sockets live here
    try:
        world = AgentWorld(tmp_path, fake_provider, refusing_proxy, runtime)
        yield world
        world.assert_nothing_left()
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


@pytest.fixture
def claude(agent_world: AgentWorld) -> Claude:
    """Claude Code (pinned) in the test's world."""
    return Claude(agent_world, agent_binary("claude"))


@pytest.fixture
def codex(agent_world: AgentWorld) -> Codex:
    """Codex (pinned) in the test's world."""
    return Codex(agent_world, agent_binary("codex"))


@pytest.fixture
def pi(agent_world: AgentWorld) -> Pi:
    """pi (pinned) in the test's world."""
    return Pi(agent_world, agent_binary("pi"))
