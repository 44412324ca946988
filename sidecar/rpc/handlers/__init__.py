"""The protocol's methods: one table from method name to params type to handler, one module per method family."""

from protocol import methods
from protocol import types as t
from sidecar.rpc.handlers import context, lifecycle, memory
from sidecar.rpc.server import Method, SidecarServer

METHODS = (
    Method(methods.MEMORY_INGEST, t.IngestParams, memory.ingest),
    Method(methods.CONTEXT_ASSEMBLE, t.AssembleParams, context.assemble),
    Method(methods.CONTEXT_COMPACT, t.CompactParams, context.compact),
    Method(methods.MEMORY_EXPAND, t.ExpandParams, memory.expand),
    Method(methods.MEMORY_GREP, t.GrepParams, memory.grep),
    Method(methods.MEMORY_DESCRIBE, t.DescribeParams, memory.describe),
    Method(methods.MEMORY_SESSIONS, t.SessionsParams, memory.sessions),
    Method(methods.MEMORY_DELETE_SESSION, t.DeleteSessionParams, memory.delete_session),
    Method(methods.MEMORY_IMPORT, t.ImportParams, memory.import_transcript),
    Method(methods.CONTEXT_USAGE, t.UsageParams, context.usage),
    Method(methods.MEMORY_PIN, t.PinParams, memory.pin),
    Method(methods.MEMORY_CALL_TOOL, t.CallToolParams, memory.call_tool),
    Method(methods.CONTEXT_FOLLOW, t.FollowParams, context.follow),
    Method(methods.MEMORY_RULES, t.RulesParams, memory.rules),
    Method(methods.MEMORY_WATCH, t.WatchParams, memory.watch),
    Method(methods.MEMORY_RECORD_COMPACTION, t.RecordCompactionParams, memory.record_compaction),
    Method(methods.CONTEXT_REPORT_USAGE, t.ReportUsageParams, context.report_usage, notification=True),
)
"""Every protocol method besides LSP's own (``lifecycle``); unannotated, so mypy checks each handler's params type."""


def setup(server: SidecarServer) -> None:
    """Serve every method of the table on ``server``, and the lifecycle ones."""
    lifecycle.setup(server)
    context.setup(server)
    server.serve_methods(METHODS)
