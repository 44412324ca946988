"""Handlers of context/*: thin wrappers over ``sidecar.services.context`` and the compaction runner."""

from __future__ import annotations

from typing import Any

from protocol.types import AssembleParams, CompactParams, FollowParams, FollowResult, ReportUsageParams, UsageParams
from sidecar.config.paths import workspace_key
from sidecar.rpc.server import SidecarServer
from sidecar.services import context
from sidecar.services.compaction.runner import CompactionRunner
from sidecar.services.errors import invalid_params
from sidecar.wire import unstructure


def setup(server: SidecarServer) -> None:
    """Give the connection its compaction runner (automatic compaction listens to session changes) and notices."""
    server.sidecar.notify = lambda method, params: server.protocol.notify(method, params)
    runner = CompactionRunner(server)
    server.compactions = runner
    server.change_listeners.append(runner.maybe_auto)


async def assemble(ls: SidecarServer, params: AssembleParams) -> Any:
    assert ls.compactions is not None, "setup gives every connection its runner"
    return await context.assemble_fitting(ls.sidecar, params, ls.compactions.fit, ls.compactions.after_running)


async def usage(ls: SidecarServer, params: UsageParams) -> Any:
    return unstructure(context.usage(ls.sidecar, params))


async def compact(ls: SidecarServer, params: CompactParams) -> Any:
    assert ls.compactions is not None, "setup gives every connection its runner"
    return unstructure(await ls.compactions.compact(params))


async def report_usage(ls: SidecarServer, params: ReportUsageParams) -> None:
    usage = context.report_usage(ls.sidecar, params)
    if usage is not None:
        ls.settle_later()
        ls.session_changed(params.session_id, usage)


async def follow(ls: SidecarServer, params: FollowParams) -> Any:
    """*Extension*: which sessions' notifications reach this connection."""
    if params.session_id is None and params.workspace is None:
        raise invalid_params("name a sessionId, a workspace, or both", "sessionId")
    if params.workspace is not None and not params.workspace:
        raise invalid_params("workspace must be a directory path", "workspace")
    store = ls.sidecar.store()
    newest = None
    if params.session_id is not None:
        session = ls.sidecar.session(params.session_id) if params.follow else None  # -32001 if unknown
        if params.follow:
            ls.following_sessions.add(params.session_id)
            newest = session
        else:
            ls.following_sessions.discard(params.session_id)
    if params.workspace is not None:
        workspace = workspace_key(params.workspace)
        if params.follow:
            ls.following_workspaces.add(workspace)
            if newest is None:
                newest = next((row for row in store.sessions() if row.workspace == workspace), None)
        else:
            ls.following_workspaces.discard(workspace)
    if newest is not None:
        ls.push_usage(ls.sidecar.usage(newest))  # shown at once, before its next change
    return unstructure(FollowResult(sessions=sorted(ls.following_sessions),
                                    workspaces=sorted(ls.following_workspaces)))
