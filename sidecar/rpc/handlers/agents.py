"""Handlers of memory/watch and memory/recordCompaction (*extensions*): the agents' own transcripts and compactions."""

from __future__ import annotations

from typing import Any

from protocol import methods
from protocol.types import RecordCompactionParams, WatchParams
from sidecar.rpc.server import SidecarServer
from sidecar.rpc.watching import watcher
from sidecar.wire import unstructure


def setup(server: SidecarServer) -> None:
    """Register the handlers."""

    @server.feature(methods.MEMORY_WATCH)
    async def watch(ls: SidecarServer, params: WatchParams) -> Any:
        extra = ls.sidecar.settings.agents.transcript_directories
        return unstructure(await watcher(ls).watch(ls, params, extra, ls.sidecar.cwd))

    @server.feature(methods.MEMORY_RECORD_COMPACTION)
    async def record_compaction(ls: SidecarServer, params: RecordCompactionParams) -> Any:
        assert ls.compactions is not None  # set up with the compaction handlers
        return unstructure(await ls.compactions.record(params))
