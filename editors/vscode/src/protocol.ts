/**
 * The context-sidecar wire protocol, version 1, as this extension speaks it.
 * Method names and error codes mirror `protocol/methods.py` and `protocol/errors.py`;
 * `test/methodNames.test.ts` fails when they drift apart.
 */

export const PROTOCOL_VERSION = 1;
export const SERVER_NAME = 'context-sidecar';
export const EXPERIMENTAL_KEY = 'contextSidecar';
export const SETTINGS_SECTION = 'contextSidecar';

export const Methods = {
  MEMORY_INGEST: 'memory/ingest',
  MEMORY_EXPAND: 'memory/expand',
  MEMORY_GREP: 'memory/grep',
  MEMORY_DESCRIBE: 'memory/describe',
  MEMORY_SESSIONS: 'memory/sessions',
  MEMORY_DELETE_SESSION: 'memory/deleteSession',
  MEMORY_IMPORT: 'memory/import',
  MEMORY_PIN: 'memory/pin',
  MEMORY_CALL_TOOL: 'memory/callTool',
  CONTEXT_ASSEMBLE: 'context/assemble',
  CONTEXT_COMPACT: 'context/compact',
  CONTEXT_USAGE: 'context/usage',
  CONTEXT_FOLLOW: 'context/follow',
  MEMORY_RULES: 'memory/rules',
  MEMORY_WATCH: 'memory/watch',
  MEMORY_RECORD_COMPACTION: 'memory/recordCompaction',
  CONTEXT_REPORT_USAGE: 'context/reportUsage',
  CONTEXT_DID_CHANGE_USAGE: 'context/didChangeUsage',
  CONTEXT_DID_COMPACT: 'context/didCompact',
  CONTEXT_DID_PRUNE: 'context/didPrune',
  CONTEXT_WILL_COMPACT: 'context/willCompact',
  CONTEXT_SUMMARIZE: 'context/summarize',
} as const;

export const ErrorCodes = {
  PARSE_ERROR: -32700,
  INVALID_REQUEST: -32600,
  METHOD_NOT_FOUND: -32601,
  INVALID_PARAMS: -32602,
  INTERNAL_ERROR: -32603,
  SERVER_NOT_INITIALIZED: -32002,
  REQUEST_CANCELLED: -32800,
  UNKNOWN_SESSION: -32001,
  ID_NOT_FOUND: -32004,
  SUMMARIZER_FAILED: -32010,
  COMPACTION_RUNNING: -32011,
  CONVERSATION_MOVED: -32012,
  STORAGE_LOCKED: -32020,
  STORAGE_ERROR: -32021,
  HOST_CONNECTION_LOST: -32022,
} as const;

export type UsageState = 'ok' | 'suggest' | 'compact' | 'compacting' | 'overflow';
export type CompactionMode = 'incremental' | 'full' | 'handoff';

export interface Usage {
  sessionId: string;
  tokens: number;
  contextWindow: number;
  percent: number;
  threshold: number;
  state: UsageState;
  hint?: string;
  source: 'estimate' | 'provider';
  messages: number;
  summaries: number;
  /** Extension: cacheRead / (input + cacheRead + cacheWrite) of the last `context/reportUsage`. */
  cacheHitRate?: number | null;
  /** Extension: the same, smoothed over the session's recent reports. */
  cacheHitRateSmoothed?: number | null;
}

export interface MessageContentPart {
  type: string;
  text?: string;
}

export interface ToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

export interface Message {
  role: 'system' | 'user' | 'assistant' | 'tool';
  content: string | MessageContentPart[] | null;
  name?: string;
  tool_calls?: ToolCall[];
  tool_call_id?: string;
  id?: string;
  metadata?: Record<string, unknown>;
}

export interface IngestResult {
  ids: string[];
  duplicates: number;
  usage: Usage;
}

export interface SessionInfo {
  sessionId: string;
  messages: number;
  summaries: number;
  tokens: number;
  updatedAt: string;
  title?: string;
  /** The folder the session was first ingested from (*extension*). */
  workspace?: string;
}

export interface SessionsResult {
  sessions: SessionInfo[];
}

/** What a connection follows by request after `context/follow` (*extension*). */
export interface FollowResult {
  sessions: string[];
  workspaces: string[];
}

/** `memory/watch` params (*extension*): the host follows the workspace's agent transcripts while connected. */
export interface WatchParams {
  workspace: string;
  watch?: boolean;
  /** The client's HOME, CLAUDE_CONFIG_DIR, CODEX_HOME, PI_CODING_AGENT_DIR, PI_CODING_AGENT_SESSION_DIR. */
  env?: Record<string, string>;
  directories?: string[];
}

export interface WatchResult {
  workspace: string;
  watching: boolean;
  transcripts: Array<{ path: string; agent: string; state: string; sessionId?: string; problem?: string }>;
  directories: Array<{ path: string; agent: string; exists: boolean; problem?: string }>;
  connections: number;
}

/** The environment variables that say where agents keep their transcripts. */
export const AGENT_ENV_NAMES = [
  'HOME',
  'CLAUDE_CONFIG_DIR',
  'CODEX_HOME',
  'PI_CODING_AGENT_DIR',
  'PI_CODING_AGENT_SESSION_DIR',
] as const;

export interface CompactParams {
  sessionId: string;
  mode?: CompactionMode;
  focus?: string;
}

export interface CompactResult {
  compacted: boolean;
  reason?: string;
  mode: CompactionMode;
  summaryIds: string[];
  tokensBefore: number;
  tokensAfter: number;
  rounds: number;
  summary?: string;
  usage: Usage;
}

export interface DidCompactParams {
  sessionId: string;
  mode: CompactionMode;
  trigger: 'manual' | 'auto';
  summaryIds: string[];
  tokensBefore: number;
  tokensAfter: number;
}

export interface ExpandItem {
  kind: string;
  id: string;
  message?: Message;
  summary?: string;
  tokens: number;
}

export interface ExpandResult {
  id: string;
  kind: string;
  items: ExpandItem[];
  truncated: boolean;
}

export interface ServerCapabilities {
  protocolVersion: number;
  methods: string[];
  compactionModes: CompactionMode[];
  summarizer: string;
  storage: string;
}
