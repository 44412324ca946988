"""Handlers of memory/*: thin wrappers over ``sidecar.services.memory``."""

from __future__ import annotations

import logging
from typing import Any

from protocol import errors as codes
from protocol import methods
from protocol.types import (
    CallToolParams,
    DeleteSessionParams,
    DescribeParams,
    ExpandParams,
    GrepParams,
    ImportParams,
    IngestParams,
    PinParams,
    RulesParams,
    SessionsParams,
)
from sidecar.rpc.server import SidecarServer
from sidecar.services import memory, transcripts
from sidecar.services.errors import SidecarError
from sidecar.wire import unstructure

log = logging.getLogger(__name__)

CATCH_UP_SECONDS = 10.0
"""How long a memory tool call over a workspace waits for the transcripts a watch just found to be read."""


def setup(server: SidecarServer) -> None:
    """Register the memory handlers."""

    @server.feature(methods.MEMORY_INGEST)
    async def ingest(ls: SidecarServer, params: IngestParams) -> Any:
        result = memory.ingest(ls.sidecar, params)
        ls.settle_later()
        ls.session_changed(params.session_id, result.usage)
        return unstructure(result)

    @server.feature(methods.MEMORY_IMPORT)
    async def import_transcript(ls: SidecarServer, params: ImportParams) -> Any:
        stored = transcripts.import_transcript(ls.sidecar, params)
        result = stored.result
        ls.settle_later()
        ls.session_changed(result.session_id, result.usage)
        if stored.compactions and ls.compactions is not None:
            result.compactions, _ = await transcripts.record_found(ls.compactions, stored.compactions)
            result.usage = ls.sidecar.usage(ls.sidecar.session(result.session_id))
        return unstructure(result)

    @server.feature(methods.MEMORY_PIN)
    async def pin(ls: SidecarServer, params: PinParams) -> Any:
        result = memory.pin(ls.sidecar, params)
        ls.settle_later()
        if result.ids:
            ls.session_changed(params.session_id, result.usage)
        return unstructure(result)

    @server.feature(methods.MEMORY_EXPAND)
    async def expand(ls: SidecarServer, params: ExpandParams) -> Any:
        return unstructure(memory.expand(ls.sidecar, params))

    @server.feature(methods.MEMORY_GREP)
    async def grep(ls: SidecarServer, params: GrepParams) -> Any:
        result = memory.grep(ls.sidecar, params)
        ls.settle_later()  # a scan fills DuckDB's page cache
        return unstructure(result)

    @server.feature(methods.MEMORY_DESCRIBE)
    async def describe(ls: SidecarServer, params: DescribeParams) -> Any:
        return unstructure(memory.describe(ls.sidecar, params))

    @server.feature(methods.MEMORY_RULES)
    async def rules(ls: SidecarServer, params: RulesParams) -> Any:
        result = memory.rules(ls.sidecar, params)
        ls.settle_later()  # a scan of the session's messages
        return unstructure(result)

    @server.feature(methods.MEMORY_SESSIONS)
    async def sessions(ls: SidecarServer, params: SessionsParams) -> Any:
        return unstructure(memory.sessions(ls.sidecar, params.workspace))

    @server.feature(methods.MEMORY_DELETE_SESSION)
    async def delete_session(ls: SidecarServer, params: DeleteSessionParams) -> Any:
        if params.session_id in ls.sidecar.compacting:
            raise SidecarError(codes.COMPACTION_RUNNING, "a compaction of this session is running; retry after it")
        result = memory.delete_session(ls.sidecar, params)
        ls.touched_sessions.discard(params.session_id)
        ls.sidecar.forget(params.session_id)
        ls.settle_later()
        return unstructure(result)

    @server.feature(methods.MEMORY_CALL_TOOL)
    async def call(ls: SidecarServer, params: CallToolParams) -> Any:
        from sidecar.services.model_tools.dispatch import call_tool  # loaded with the first tool call

        answerer = ls.compactions.answerer() if ls.compactions is not None else None
        if params.workspace is not None and params.workspace.strip():
            from sidecar.rpc.watching import watcher

            if not await watcher(ls).caught_up(params.workspace, CATCH_UP_SECONDS):
                log.info("memory/callTool over %s: some transcripts are not read yet", params.workspace)
        result = await call_tool(ls.sidecar, params, answerer)
        ls.settle_later()  # memory_grep and memory_query scan
        return unstructure(result)
