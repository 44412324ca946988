"""Fixtures: the real sidecar as a subprocess over stdio, driven by pytest-lsp, on a temp DuckDB file."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import pytest_lsp
from lsprotocol import types as lsp
from pytest_lsp import ClientServerConfig, LanguageClient

from protocol import methods
from sidecar.testing import FakeOpenAIServer
from tests.helpers import team_db
from tests.helpers.gate import Gate
from tests.helpers.hosts import short_runtime
from tests.helpers.team_db import TeamServer

SERVER_COMMAND = [sys.executable, "-m", "sidecar", "--no-share"]
"""Each test's server opens its database itself; tests/test_sharing.py covers the shared default."""
SHARED_DATA = Path(os.environ.get("CONTEXT_SIDECAR_TEST_DATA")
                   or Path(__file__).resolve().parents[2] / "shared" / "data")
"""Beside the repository; a checkout elsewhere names the directory in CONTEXT_SIDECAR_TEST_DATA."""
PI_SESSION = SHARED_DATA / "pi-large-session.jsonl"
RAW_METHODS = {*methods.REQUESTS, *methods.SERVER_NOTIFICATIONS, *methods.SERVER_REQUESTS}


@attrs.define
class RawResponse:
    """A response whose result stays plain JSON (pygls would turn it into namedtuples)."""

    id: int | str
    jsonrpc: str
    result: Any = None


@attrs.define
class RawNotification:
    """A notification whose params stay plain JSON."""

    method: str
    jsonrpc: str
    params: Any = None


@attrs.define
class RawRequest:
    """A server-to-client request whose params stay plain JSON."""

    id: int | str
    method: str
    jsonrpc: str
    params: Any = None


def make_client() -> LanguageClient:
    """A pytest-lsp client that keeps sidecar results, notifications and requests as dicts."""
    client = pytest_lsp.client.make_test_lsp_client()
    protocol = client.protocol
    converter = protocol._converter
    for cls in (RawResponse, RawNotification, RawRequest):
        converter.register_structure_hook(cls, lambda obj, c: c(**obj))
    result_type, message_type = protocol.get_result_type, protocol.get_message_type
    protocol.get_result_type = lambda m: RawResponse if m in RAW_METHODS else result_type(m)
    protocol.get_message_type = lambda m: (
        RawRequest if m in methods.SERVER_REQUESTS
        else RawNotification if m in methods.SERVER_NOTIFICATIONS
        else message_type(m)
    )
    client.usage_events = []  # type: ignore[attr-defined]
    client.compact_events = []  # type: ignore[attr-defined]
    client.prune_events = []  # type: ignore[attr-defined]

    @client.feature(methods.CONTEXT_DID_CHANGE_USAGE)
    def on_usage(params: Any) -> None:
        client.usage_events.append(params)  # type: ignore[attr-defined]

    @client.feature(methods.CONTEXT_DID_COMPACT)
    def on_compact(params: Any) -> None:
        client.compact_events.append(params)  # type: ignore[attr-defined]

    @client.feature(methods.CONTEXT_DID_PRUNE)
    def on_prune(params: Any) -> None:
        client.prune_events.append(params)  # type: ignore[attr-defined]

    return client


def settings_for(db: Path | str, **overrides: Any) -> dict[str, Any]:
    """initializationOptions with the given DB and overrides (camelCase keys, nested dicts merged)."""
    settings: dict[str, Any] = {"storage": {"path": str(db)}}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(settings.get(key), dict):
            settings[key] = {**settings[key], **value}
        else:
            settings[key] = value
    return settings


@contextlib.asynccontextmanager
async def running_sidecar(
    db: Path | str | None = None,
    settings: dict[str, Any] | None = None,
    capabilities: dict[str, Any] | None = None,
    initialize: bool = True,
    env: dict[str, str] | None = None,
    args: list[str] | None = None,
) -> AsyncIterator[LanguageClient]:
    """A sidecar subprocess and a client connected to it; shut down cleanly at the end."""
    config = ClientServerConfig(server_command=[*SERVER_COMMAND, *(args or [])], client_factory=make_client,
                                server_env=env)
    client = await config.start()
    try:
        if initialize:
            await client.initialize_session(lsp.InitializeParams(
                capabilities=lsp.ClientCapabilities(
                    experimental={methods.EXPERIMENTAL_KEY: capabilities} if capabilities else None,
                    window=lsp.WindowClientCapabilities(work_done_progress=True),
                    workspace=lsp.WorkspaceClientCapabilities(configuration=True),
                ),
                initialization_options=settings if settings is not None else settings_for(db or ":memory:"),
            ))
        yield client
        if initialize and client._server is not None and client._server.returncode is None:
            await client.shutdown_session()
    finally:
        server = client._server
        if server is not None and server.returncode is None and server.stdin is not None:
            server.stdin.close()  # a failed test skips shutdown: end of input makes the server exit
            try:
                await asyncio.wait_for(server.wait(), 10)
            except TimeoutError:
                server.kill()
        await client.stop()


@pytest.fixture
def runtime() -> Iterator[Path]:
    """An XDG_RUNTIME_DIR of the test's own for the hosts of shared databases, killed after the test."""
    with short_runtime() as path:
        yield path


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """A fresh DuckDB file path."""
    return tmp_path / "memory.duckdb"


@pytest.fixture(scope="session")
def team_server() -> Iterator[TeamServer]:
    """The PostgreSQL server of the team-store tests (see tests/helpers/team_db.py); skipped without one."""
    with team_db.team_server() as server:
        yield server


@pytest.fixture
def team_database(team_server: TeamServer) -> Iterator[str]:
    """A fresh migrated team database (ALICE granted PROJECT); its name; dropped after the test."""
    name = team_server.database()
    yield name
    team_server.drop(name)


@pytest.fixture
def pg_url(team_server: TeamServer, team_database: str) -> str:
    """A fresh team database's URL as the member ALICE."""
    return team_server.url(team_db.ALICE, team_database)


@pytest.fixture
async def duckdb_sidecar(db_path: Path) -> AsyncIterator[LanguageClient]:
    """An initialized sidecar on a fresh DuckDB file: for checks of params, which no backend sees."""
    async with running_sidecar(settings=settings_for(db_path)) as client:
        yield client


@pytest.fixture(params=["duckdb", "postgresql"])
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """What a test's store is opened on, once per backend: a fresh DuckDB file, then a fresh team database."""
    if request.param == "duckdb":
        return str(tmp_path / "memory.duckdb")
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
async def sidecar(store_target: str) -> AsyncIterator[LanguageClient]:
    """An initialized sidecar with default settings, once on a fresh DuckDB file, once on a fresh team database."""
    async with running_sidecar(settings=settings_for(store_target)) as client:
        yield client


async def call(client: LanguageClient, method: str, params: Any = None) -> Any:
    """Send a request and return its plain-JSON result."""
    return await client.protocol.send_request_async(method, params)


async def ingest(client: LanguageClient, session_id: str, messages: list[dict[str, Any]],
                 **session: Any) -> dict[str, Any]:
    """memory/ingest."""
    params: dict[str, Any] = {"sessionId": session_id, "messages": messages}
    if session:
        params["session"] = session
    return await call(client, methods.MEMORY_INGEST, params)


@pytest.fixture
def gated() -> Iterator[tuple[FakeOpenAIServer, Gate]]:
    """A fake summarizer server whose first call waits for the test (opened at the end, whatever happened)."""
    gate = Gate()
    with FakeOpenAIServer(responder=gate) as server:
        yield server, gate
        gate.opened.set()
