"""Handlers of context/*: thin wrappers over ``sidecar.services.context``."""

from __future__ import annotations

from typing import Any

from protocol import methods
from protocol.types import AssembleParams, UsageParams
from sidecar.rpc.server import SidecarServer
from sidecar.services import context
from sidecar.wire import unstructure


def setup(server: SidecarServer) -> None:
    """Register the context handlers."""
    server.sidecar.notify = lambda method, params: server.protocol.notify(method, params)

    @server.feature(methods.CONTEXT_ASSEMBLE)
    async def assemble(ls: SidecarServer, params: AssembleParams) -> Any:
        return context.assemble_context(ls.sidecar, params)

    @server.feature(methods.CONTEXT_USAGE)
    async def usage(ls: SidecarServer, params: UsageParams) -> Any:
        return unstructure(context.usage(ls.sidecar, params))
