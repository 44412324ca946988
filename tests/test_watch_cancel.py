"""A memory/watch cut short (cancelled while the host lists the directories, or by the MCP server's deadline)
leaves no watch behind and is sent again."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, cast

import pytest

from protocol import methods
from protocol.types import WatchParams, WatchResult
from sidecar.agents.discovery import Scanner
from sidecar.mcp.host import HostLink
from sidecar.services import watch as watch_module
from sidecar.services.tails import Audience
from sidecar.services.watch import WatchService

WAIT = 30.0


async def test_a_watch_cancelled_during_its_first_scan_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    listing, release = threading.Event(), threading.Event()
    scan = Scanner.scan

    def slow_scan(self: Scanner) -> dict[Path, str]:
        listing.set()
        release.wait(WAIT)
        return scan(self)

    monkeypatch.setattr(Scanner, "scan", slow_scan)
    monkeypatch.setattr(watch_module, "LINGER_SECONDS", 0.0)

    def no_store() -> Any:
        raise AssertionError("nothing is imported")

    service = WatchService(no_store, cast(Audience, object()))
    owner = object()
    params = WatchParams(workspace=str(tmp_path), env={"HOME": str(tmp_path)})
    request = asyncio.create_task(service.watch(owner, params))
    assert await asyncio.to_thread(listing.wait, WAIT)
    request.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await request
    assert service.by_owner == {}
    assert service._task is not None, "nothing would ever end the watch"
    await asyncio.wait_for(service._task, WAIT)  # the follower loop ends the ownerless watch, then itself
    assert service.watches == {}
    await service.close()


class FlakyClient:
    """A host connection whose first memory/watch never answers (the caller's deadline cancels it)."""

    capabilities = {"methods": [methods.MEMORY_WATCH]}

    def __init__(self) -> None:
        self.watches: list[tuple[str, bool]] = []

    async def watch(self, workspace: str, watch: bool = True) -> Any:
        self.watches.append((workspace, watch))
        if len(self.watches) == 1:
            await asyncio.Event().wait()
        return WatchResult(workspace=workspace, watching=watch, transcripts=[], directories=[])


async def test_the_mcp_servers_watch_cancelled_by_its_deadline_is_sent_again(tmp_path: Path) -> None:
    link = HostLink([], None, None, None)
    client = FlakyClient()
    link._client = cast(Any, client)
    link._workspace = str(tmp_path)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(link._watch(), 0.01)  # as a tools/call's deadline cuts it short
    await link._watch()  # the next tools/call
    assert client.watches == [(str(tmp_path), True), (str(tmp_path), True)]
