---Method names and error codes of the context-sidecar protocol, version 1.
---They mirror `protocol/methods.py` and `protocol/errors.py`;
---`tests/test_editor_method_names.py` fails when they drift apart.
local M = {}

M.PROTOCOL_VERSION = 1
M.SERVER_NAME = 'context-sidecar'
M.EXPERIMENTAL_KEY = 'contextSidecar'
M.SETTINGS_SECTION = 'contextSidecar'

---@enum ContextSidecarMethod
M.methods = {
  MEMORY_INGEST = 'memory/ingest',
  MEMORY_EXPAND = 'memory/expand',
  MEMORY_GREP = 'memory/grep',
  MEMORY_DESCRIBE = 'memory/describe',
  MEMORY_SESSIONS = 'memory/sessions',
  MEMORY_DELETE_SESSION = 'memory/deleteSession',
  MEMORY_IMPORT = 'memory/import',
  MEMORY_PIN = 'memory/pin',
  MEMORY_CALL_TOOL = 'memory/callTool',
  CONTEXT_ASSEMBLE = 'context/assemble',
  CONTEXT_COMPACT = 'context/compact',
  CONTEXT_USAGE = 'context/usage',
  CONTEXT_FOLLOW = 'context/follow',
  MEMORY_RULES = 'memory/rules',
  MEMORY_WATCH = 'memory/watch',
  MEMORY_RECORD_COMPACTION = 'memory/recordCompaction',
  CONTEXT_REPORT_USAGE = 'context/reportUsage',
  CONTEXT_DID_CHANGE_USAGE = 'context/didChangeUsage',
  CONTEXT_DID_COMPACT = 'context/didCompact',
  CONTEXT_DID_PRUNE = 'context/didPrune',
  CONTEXT_WILL_COMPACT = 'context/willCompact',
  CONTEXT_SUMMARIZE = 'context/summarize',
}

---@enum ContextSidecarErrorCode
M.errors = {
  PARSE_ERROR = -32700,
  INVALID_REQUEST = -32600,
  METHOD_NOT_FOUND = -32601,
  INVALID_PARAMS = -32602,
  INTERNAL_ERROR = -32603,
  SERVER_NOT_INITIALIZED = -32002,
  REQUEST_CANCELLED = -32800,
  UNKNOWN_SESSION = -32001,
  ID_NOT_FOUND = -32004,
  SUMMARIZER_FAILED = -32010,
  COMPACTION_RUNNING = -32011,
  CONVERSATION_MOVED = -32012,
  STORAGE_LOCKED = -32020,
  STORAGE_ERROR = -32021,
  HOST_CONNECTION_LOST = -32022,
}

---@alias ContextSidecarUsageState 'ok'|'suggest'|'compact'|'compacting'|'overflow'

---@class ContextSidecarUsage
---@field sessionId string
---@field tokens integer
---@field contextWindow integer
---@field percent number
---@field threshold integer
---@field state ContextSidecarUsageState
---@field hint string|nil
---@field source 'estimate'|'provider'
---@field messages integer
---@field summaries integer
---@field cacheHitRate number|nil extension: cacheRead / (input + cacheRead + cacheWrite) of the last report
---@field cacheHitRateSmoothed number|nil extension: the same, smoothed

---@class ContextSidecarSessionInfo
---@field sessionId string
---@field messages integer
---@field summaries integer
---@field tokens integer
---@field updatedAt string
---@field title string|nil
---@field workspace string|nil the folder it was first ingested from (*extension*)

---@class ContextSidecarCompactResult
---@field compacted boolean
---@field reason string|nil
---@field mode string
---@field summaryIds string[]
---@field tokensBefore integer
---@field tokensAfter integer
---@field rounds integer
---@field usage ContextSidecarUsage

return M
