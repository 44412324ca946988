"""Handlers of memory/*: thin wrappers over ``sidecar.services.memory``, transcripts and watching."""

from __future__ import annotations

import logging
from typing import Any

from protocol import errors as codes
from protocol.types import (
    CallToolParams,
    DeleteSessionParams,
    DescribeParams,
    ExpandParams,
    GrepParams,
    ImportParams,
    IngestParams,
    PinParams,
    RecordCompactionParams,
    RulesParams,
    SessionsParams,
    WatchParams,
)
from sidecar.rpc.server import SidecarServer
from sidecar.rpc.watching import watcher
from sidecar.services import memory, transcripts
from sidecar.services.errors import SidecarError
from sidecar.wire import unstructure

log = logging.getLogger(__name__)

CATCH_UP_SECONDS = 10.0
"""How long a memory tool call over a workspace waits for the transcripts a watch just found to be read."""


async def ingest(ls: SidecarServer, params: IngestParams) -> Any:
    result = memory.ingest(ls.sidecar, params)
    ls.settle_later()
    ls.drives(params.session_id)
    ls.session_changed(params.session_id, result.usage)
    return unstructure(result)


async def import_transcript(ls: SidecarServer, params: ImportParams) -> Any:
    stored = transcripts.import_transcript(ls.sidecar, params)
    result = stored.result
    ls.settle_later()
    ls.session_changed(result.session_id, result.usage)
    if stored.compactions and ls.compactions is not None:
        result.compactions, _ = await transcripts.record_found(ls.compactions, stored.compactions)
        result.usage = ls.sidecar.usage(ls.sidecar.session(result.session_id))
    return unstructure(result)


async def pin(ls: SidecarServer, params: PinParams) -> Any:
    result = memory.pin(ls.sidecar, params)
    ls.settle_later()
    if result.ids:
        ls.session_changed(params.session_id, result.usage)
    return unstructure(result)


async def expand(ls: SidecarServer, params: ExpandParams) -> Any:
    return unstructure(memory.expand(ls.sidecar, params))


async def grep(ls: SidecarServer, params: GrepParams) -> Any:
    result = memory.grep(ls.sidecar, params)
    ls.settle_later()  # a scan fills DuckDB's page cache
    return unstructure(result)


async def describe(ls: SidecarServer, params: DescribeParams) -> Any:
    return unstructure(memory.describe(ls.sidecar, params))


async def rules(ls: SidecarServer, params: RulesParams) -> Any:
    result = memory.rules(ls.sidecar, params)
    ls.settle_later()  # a scan of the session's messages
    return unstructure(result)


async def sessions(ls: SidecarServer, params: SessionsParams) -> Any:
    return unstructure(memory.sessions(ls.sidecar, params.workspace))


async def delete_session(ls: SidecarServer, params: DeleteSessionParams) -> Any:
    if ls.sidecar.runtime.compacting(params.session_id):
        raise SidecarError(codes.COMPACTION_RUNNING, "a compaction of this session is running; retry after it")
    result = memory.delete_session(ls.sidecar, params)
    ls.touched_sessions.discard(params.session_id)
    ls.sidecar.runtime.forget(params.session_id)
    ls.settle_later()
    return unstructure(result)


async def call_tool(ls: SidecarServer, params: CallToolParams) -> Any:
    from sidecar.services.model_tools import dispatch  # loaded with the first tool call

    answerer = ls.compactions.answerer() if ls.compactions is not None else None
    workspace = params.workspace
    if workspace is not None and workspace.strip() and not await watcher(ls).caught_up(workspace, CATCH_UP_SECONDS):
        log.info("memory/callTool over %s: some transcripts are not read yet", workspace)
    result = await dispatch.call_tool(ls.sidecar, params, answerer)
    ls.settle_later()  # memory_grep and memory_query scan
    return unstructure(result)


async def watch(ls: SidecarServer, params: WatchParams) -> Any:
    """*Extension*: the host follows a workspace's agent transcripts while this connection lives."""
    extra = ls.sidecar.settings.agents.transcript_directories
    return unstructure(await watcher(ls).watch(ls, params, extra, ls.sidecar.cwd))


async def record_compaction(ls: SidecarServer, params: RecordCompactionParams) -> Any:
    """*Extension*: an agent's own compaction recorded with the session."""
    assert ls.compactions is not None  # set up with the context handlers
    return unstructure(await ls.compactions.record(params))
