"""Handler of context/follow (*extension*): which sessions' notifications reach this connection."""

from __future__ import annotations

from typing import Any

from protocol import methods
from protocol.types import FollowParams, FollowResult
from sidecar.config.paths import workspace_key
from sidecar.rpc.server import SidecarServer
from sidecar.services.errors import invalid_params
from sidecar.wire import unstructure


def setup(server: SidecarServer) -> None:
    """Register context/follow."""

    @server.feature(methods.CONTEXT_FOLLOW)
    async def follow(ls: SidecarServer, params: FollowParams) -> Any:
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
