"""JSON-RPC method names of the context-sidecar protocol, version 1."""

from typing import get_args

from protocol.types import CompactionMode

PROTOCOL_VERSION = 1
SERVER_NAME = "context-sidecar"
EXPERIMENTAL_KEY = "contextSidecar"
SETTINGS_SECTION = "contextSidecar"

# Requests, client to server.
MEMORY_INGEST = "memory/ingest"
MEMORY_EXPAND = "memory/expand"
MEMORY_GREP = "memory/grep"
MEMORY_DESCRIBE = "memory/describe"
MEMORY_SESSIONS = "memory/sessions"
MEMORY_DELETE_SESSION = "memory/deleteSession"
MEMORY_IMPORT = "memory/import"
MEMORY_PIN = "memory/pin"
MEMORY_CALL_TOOL = "memory/callTool"
MEMORY_RULES = "memory/rules"
"""*Extension*: a session's standing rules and the files it read and modified."""
CONTEXT_ASSEMBLE = "context/assemble"
CONTEXT_COMPACT = "context/compact"
CONTEXT_USAGE = "context/usage"
CONTEXT_FOLLOW = "context/follow"
MEMORY_WATCH = "memory/watch"
"""*Extension*: follow a workspace's agent transcripts while the connection lives."""
MEMORY_RECORD_COMPACTION = "memory/recordCompaction"
"""*Extension*: record a compaction an agent made itself."""

# Notifications, client to server.
CONTEXT_REPORT_USAGE = "context/reportUsage"

# Notifications, server to client.
CONTEXT_DID_CHANGE_USAGE = "context/didChangeUsage"
CONTEXT_DID_COMPACT = "context/didCompact"
CONTEXT_DID_PRUNE = "context/didPrune"
"""*Extension*: a prune step's announcement."""

# Requests, server to client.
CONTEXT_WILL_COMPACT = "context/willCompact"
CONTEXT_SUMMARIZE = "context/summarize"
"""*Extension*: a summarizer call for a client that declared ``summaries`` to run on its own model."""

REQUESTS = (
    MEMORY_INGEST,
    CONTEXT_ASSEMBLE,
    CONTEXT_COMPACT,
    MEMORY_EXPAND,
    MEMORY_GREP,
    MEMORY_DESCRIBE,
    MEMORY_SESSIONS,
    MEMORY_DELETE_SESSION,
    MEMORY_IMPORT,
    CONTEXT_USAGE,
    MEMORY_PIN,
    MEMORY_CALL_TOOL,
    CONTEXT_FOLLOW,
    MEMORY_RULES,
    MEMORY_WATCH,
    MEMORY_RECORD_COMPACTION,
)
"""Every request the server answers, besides the LSP lifecycle ones."""

CLIENT_NOTIFICATIONS = (CONTEXT_REPORT_USAGE,)
SERVER_NOTIFICATIONS = (CONTEXT_DID_CHANGE_USAGE, CONTEXT_DID_COMPACT, CONTEXT_DID_PRUNE)
SERVER_REQUESTS = (CONTEXT_WILL_COMPACT, CONTEXT_SUMMARIZE)

COMPACTION_MODES: tuple[str, ...] = get_args(CompactionMode)
