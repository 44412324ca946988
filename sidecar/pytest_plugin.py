"""pytest plugin for agent authors: a real context-sidecar and a scriptable OpenAI-compatible server as fixtures.

Installed with the package (entry point ``pytest11: context_sidecar``); async fixtures need pytest-asyncio.
Sidecars a test spawns on one database share it through a host, as an editor and an agent would; each
test's database is a fresh file with a host of its own, so tests stay apart.

    import pytest
    from sidecar.pytest_plugin import llm_settings

    @pytest.mark.sidecar_settings(contextWindow=8000, compaction={"maxTokens": 2000})
    async def test_my_agent_keeps_history(sidecar, openai_server):
        openai_server.script("Hello!")
        await my_agent.turn(sidecar, base_url=openai_server.base_url, text="hi")
        assert (await sidecar.usage("my-session")).messages == 2

    @pytest.fixture
    def sidecar_settings(openai_server):  # summaries written by the scripted server
        return llm_settings(openai_server)
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from sidecar.client import SidecarClient
    from sidecar.testing import FakeOpenAIServer

try:  # strict mode needs pytest-asyncio's own decorator; without pytest-asyncio the async fixtures cannot run
    from pytest_asyncio import fixture as async_fixture
except ImportError:  # pragma: no cover - the plugin still loads, e.g. for openai_server alone
    async_fixture = pytest.fixture  # type: ignore[assignment]

SidecarFactory = Callable[..., Awaitable["SidecarClient"]]
MARKER = "sidecar_settings"
FAKE_API_KEY_ENV = "CONTEXT_SIDECAR_FAKE_OPENAI_KEY"
DEFAULT_SETTINGS: dict[str, Any] = {"compaction": {"auto": True}}


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker."""
    config.addinivalue_line(
        "markers",
        f"{MARKER}(settings=None, **overrides): settings (initializationOptions, camelCase) for the sidecar "
        "fixture, merged over the sidecar_settings fixture; nested dicts are merged key by key")


def merge_settings(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` applied; nested dicts are merged, everything else replaced."""
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_settings(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def llm_settings(server: FakeOpenAIServer, model: str | None = None, **llm: Any) -> dict[str, Any]:
    """Settings whose summarizer is the given test server (and its first model); extra ``llm`` keys are added."""
    # The server never sees a real key: the variable named here is unset unless a test sets it.
    section = {"baseUrl": server.base_url, "model": model or server.models[0], "apiKeyEnv": FAKE_API_KEY_ENV,
               "timeoutSeconds": 10, **llm}
    return merge_settings(DEFAULT_SETTINGS, {"llm": section})


@pytest.fixture
def sidecar_settings() -> dict[str, Any]:
    """Settings for the ``sidecar`` fixture: defaults with auto-compaction on; override this fixture to change them."""
    return copy.deepcopy(DEFAULT_SETTINGS)


@pytest.fixture
def sidecar_db(tmp_path: Path) -> Path:
    """The DuckDB file of the ``sidecar`` fixture, fresh for each test."""
    return tmp_path / "context-sidecar.duckdb"


@async_fixture
async def sidecar_factory(sidecar_db: Path, sidecar_settings: dict[str, Any],
                          request: pytest.FixtureRequest) -> AsyncIterator[SidecarFactory]:
    """Spawns initialized sidecars (on ``sidecar_db`` unless told otherwise); all are shut down after the test."""
    from sidecar.client import SidecarClient

    marker = request.node.get_closest_marker(MARKER)
    marked = dict(marker.args[0]) if marker and marker.args else {}
    marked = merge_settings(marked, marker.kwargs) if marker else marked
    clients: list[SidecarClient] = []

    async def spawn(settings: dict[str, Any] | None = None, db: str | os.PathLike[str] | None = None,
                    **kwargs: Any) -> SidecarClient:
        chosen = merge_settings(merge_settings(sidecar_settings, marked), settings or {})
        client = await SidecarClient.spawn(command=[sys.executable, "-P", "-m", "sidecar"],
                                           db=str(db if db is not None else sidecar_db), settings=chosen, **kwargs)
        clients.append(client)
        return client

    yield spawn
    for client in reversed(clients):
        await client.close()


@async_fixture
async def sidecar(sidecar_factory: SidecarFactory) -> SidecarClient:
    """An initialized ``SidecarClient`` talking to a real context-sidecar subprocess on a temporary database."""
    return await sidecar_factory()


@pytest.fixture
def openai_server() -> Iterator[FakeOpenAIServer]:
    """A started local OpenAI-compatible server; queue replies with ``.script(...)``, read ``.chat_requests``."""
    from sidecar.testing import FakeOpenAIServer

    with FakeOpenAIServer() as server:
        yield server
