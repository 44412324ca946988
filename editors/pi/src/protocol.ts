/**
 * The context-sidecar protocol as this extension speaks it: the methods it calls, error codes, the
 * wire shapes it reads, and the memory tools' definitions. tests/test_editor_method_names.py checks the
 * names against `protocol/`, and `test/server.test.ts` the tools against a real server's.
 */

export const PROTOCOL_VERSION = 1;
export const EXPERIMENTAL_KEY = 'contextSidecar';

export const Methods = {
  MEMORY_INGEST: 'memory/ingest',
  MEMORY_CALL_TOOL: 'memory/callTool',
  MEMORY_WATCH: 'memory/watch',
  CONTEXT_ASSEMBLE: 'context/assemble',
  CONTEXT_COMPACT: 'context/compact',
  CONTEXT_REPORT_USAGE: 'context/reportUsage',
  CONTEXT_DID_CHANGE_USAGE: 'context/didChangeUsage',
} as const;

/** The requests this extension cannot work without; a server that lacks one is not used. */
export const REQUIRED_METHODS = [
  Methods.MEMORY_INGEST,
  Methods.CONTEXT_ASSEMBLE,
  Methods.CONTEXT_COMPACT,
  Methods.MEMORY_CALL_TOOL,
];

/** The variables that say where agents keep their transcripts, as `memory/watch` takes them. */
export const TRANSCRIPT_ENV = ['HOME', 'CLAUDE_CONFIG_DIR', 'CODEX_HOME', 'PI_CODING_AGENT_DIR', 'PI_CODING_AGENT_SESSION_DIR'];

export const ErrorCodes = {
  UNKNOWN_SESSION: -32001,
  REQUEST_CANCELLED: -32800,
  METHOD_NOT_FOUND: -32601,
  HOST_CONNECTION_LOST: -32022,
} as const;

/** A Chat Completions message as the sidecar stores and assembles it. */
export interface WireMessage {
  role: 'system' | 'user' | 'assistant' | 'tool';
  content: string | Array<Record<string, unknown>> | null;
  tool_calls?: Array<{ id: string; type: 'function'; function: { name: string; arguments: string } }>;
  tool_call_id?: string;
  name?: string;
  id?: string;
  reasoning?: string;
  metadata?: Record<string, unknown>;
}

export interface Usage {
  sessionId: string;
  tokens: number;
  contextWindow: number;
  percent: number;
  state: string;
  hint?: string;
}

export interface ContextItem {
  kind: 'message' | 'summary';
  id: string;
  tokens: number;
  pruned?: boolean;
}

export interface AssembleResult {
  messages: WireMessage[];
  items: ContextItem[];
  tokens: number;
  dropped: number;
  overBudget: boolean;
  usage: Usage;
  /** The budget the server worked out from the window, the reserve and `overheadTokens`. */
  budget?: number;
  /** Why the context is over its budget, when it is. */
  reason?: string;
}

export interface CompactResult {
  compacted: boolean;
  reason?: string;
  mode: string;
  summaryIds: string[];
  tokensBefore: number;
  tokensAfter: number;
}

export interface IngestResult {
  ids: string[];
  duplicates: number;
  usage: Usage;
}

/** `memory_describe`'s and `memory_expand`'s `id`. */
const ID_PARAMETER = {
  type: 'string',
  minLength: 1,
  maxLength: 512,
  description: 'A summary id (sum_…) from a <summary> tag or a search result, or a message id.',
} as const;

/** The memory tools, exactly as `context/assemble` with `tools: true` defines them (constants of the protocol). */
export const MEMORY_TOOLS = [
  {
    type: 'function',
    function: {
      name: 'memory_grep',
      description:
        'Search the whole history of this conversation, including the parts compacted into summaries, for a text. ' +
        'Returns matching messages and summaries, newest first, with the summary that now stands for each compacted message.',
      parameters: {
        type: 'object',
        properties: {
          pattern: {
            type: 'string',
            minLength: 1,
            maxLength: 500,
            description: 'Text to find (case-insensitive), or a regular expression when regex is true.',
          },
          scope: {
            type: 'string',
            enum: ['messages', 'summaries', 'both'],
            default: 'both',
            description: 'Search original messages, summaries, or both.',
          },
          limit: { type: 'integer', minimum: 1, maximum: 50, default: 10, description: 'Most matches to return.' },
          regex: { type: 'boolean', default: false, description: 'Treat pattern as an RE2 regular expression.' },
        },
        required: ['pattern'],
        additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'memory_describe',
      description:
        "Show one summary's place in the history: its kind, depth, time range, how many messages it stands for, " +
        'the summaries above it, its direct sources, and its text.',
      parameters: {
        type: 'object',
        properties: {
          id: ID_PARAMETER,
        },
        required: ['id'],
        additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'memory_expand',
      description:
        'Open a summary: its direct sources (the messages or lower summaries it replaced), oldest first, up to a ' +
        'token cap. Given a message id, the full original message.',
      parameters: {
        type: 'object',
        properties: {
          id: ID_PARAMETER,
          tokenCap: {
            type: 'integer',
            minimum: 1,
            maximum: 32000,
            default: 4000,
            description: 'Most tokens of sources to return.',
          },
        },
        required: ['id'],
        additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'memory_query',
      description:
        'Ask a question about the compacted history of this conversation. The history is searched, the best ' +
        'matches are opened, and an answer citing the ids it used comes back.',
      parameters: {
        type: 'object',
        properties: {
          question: {
            type: 'string',
            minLength: 1,
            maxLength: 2000,
            description: 'The question, with the names, paths or words to look for.',
          },
        },
        required: ['question'],
        additionalProperties: false,
      },
    },
  },
] as const;
