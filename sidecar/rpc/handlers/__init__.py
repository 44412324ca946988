"""Request handlers, one module per method family, each with a ``setup(server)``."""

from sidecar.rpc.handlers import agents, compaction, context, lifecycle, memory, sharing
from sidecar.rpc.server import SidecarServer


def setup(server: SidecarServer) -> None:
    """Register every handler on ``server``."""
    for module in (lifecycle, memory, context, compaction, sharing, agents):
        module.setup(server)
