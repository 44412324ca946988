"""Handlers of context/compact and context/reportUsage; auto-compaction hooks onto session changes."""

from __future__ import annotations

from typing import Any

from protocol import methods
from protocol.types import CompactParams, ReportUsageParams
from sidecar.rpc.server import SidecarServer
from sidecar.services import context
from sidecar.services.compaction.runner import CompactionRunner
from sidecar.wire import unstructure


def setup(server: SidecarServer) -> None:
    """Register the compaction handlers and automatic compaction."""
    runner = CompactionRunner(server)
    server.compactions = runner
    server.change_listeners.append(runner.maybe_auto)

    @server.feature(methods.CONTEXT_COMPACT)
    async def compact(ls: SidecarServer, params: CompactParams) -> Any:
        return unstructure(await runner.compact(params))

    @server.feature(methods.CONTEXT_REPORT_USAGE)
    async def report_usage(ls: SidecarServer, params: ReportUsageParams) -> None:
        usage = context.report_usage(ls.sidecar, params)
        if usage is not None:
            ls.settle_later()
            ls.session_changed(params.session_id, usage)
