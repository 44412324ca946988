/**
 * The part of pi's extension API (@mariozechner/pi-coding-agent 0.73) this extension uses, as plain
 * structural types: the extension loads with no dependencies, and `typecheck/pi-types.ts` compiles it
 * against pi's own declarations (`scripts/check-pi-types.mjs`, when the pinned pi is installed).
 */

export interface TextContent {
  type: 'text';
  text: string;
}

export interface ImageContent {
  type: 'image';
  data: string;
  mimeType: string;
}

export interface ThinkingContent {
  type: 'thinking';
  thinking: string;
}

export interface ToolCallContent {
  type: 'toolCall';
  id: string;
  name: string;
  arguments: Record<string, unknown>;
}

export interface PiUsage {
  input: number;
  output: number;
  cacheRead: number;
  cacheWrite: number;
  totalTokens: number;
  cost: { input: number; output: number; cacheRead: number; cacheWrite: number; total: number };
}

/**
 * pi's `AgentMessage` union, loosely: what its `context` event carries and takes back. The fields this
 * extension reads; a message keeps all of pi's when passed through.
 */
export interface AgentMessage {
  role: string;
  timestamp: number;
  content?: unknown;
  /** assistant */
  api?: unknown;
  provider?: unknown;
  model?: unknown;
  usage?: unknown;
  stopReason?: unknown;
  errorMessage?: unknown;
  /** toolResult */
  toolCallId?: unknown;
  toolName?: unknown;
  isError?: unknown;
  details?: unknown;
  /** custom */
  customType?: unknown;
  display?: unknown;
  /** bashExecution */
  command?: unknown;
  output?: unknown;
  exitCode?: unknown;
  cancelled?: unknown;
  excludeFromContext?: unknown;
  /** branchSummary, compactionSummary */
  summary?: unknown;
  fromId?: unknown;
  tokensBefore?: unknown;
}

/** One line of a pi session file (SessionEntry): `message` entries hold an AgentMessage. */
export interface SessionEntry {
  type: string;
  id: string;
  parentId: string | null;
  timestamp: string;
  message?: AgentMessage;
  /** custom_message, branch_summary, compaction */
  content?: unknown;
  customType?: unknown;
  display?: unknown;
  details?: unknown;
  summary?: unknown;
  fromId?: unknown;
}

export interface PiModel {
  id: string;
  provider: string;
  api: string;
  contextWindow: number;
  maxTokens?: number;
}

export interface SessionManagerView {
  getBranch(fromId?: string): SessionEntry[];
  getEntries(): SessionEntry[];
  getSessionId(): string;
  getSessionFile(): string | undefined;
}

export interface UiView {
  notify(message: string, type?: 'info' | 'warning' | 'error'): void;
  setStatus(key: string, text: string | undefined): void;
}

export interface ContextView {
  ui: UiView;
  hasUI: boolean;
  cwd: string;
  sessionManager: SessionManagerView;
  model: PiModel | undefined;
  modelRegistry: ModelRegistryView;
  getSystemPrompt(): string;
}

/** pi's model registry: the credentials pi's own compaction calls its model with. */
export interface ModelRegistryView {
  getApiKeyAndHeaders(
    model: PiModel,
  ): Promise<{ ok: true; apiKey?: string; headers?: Record<string, string> } | { ok: false; error: string }>;
}

export interface ToolResult {
  content: TextContent[];
  details: Record<string, unknown>;
}

export interface ToolDefinition {
  name: string;
  label: string;
  description: string;
  promptSnippet?: string;
  parameters: any;
  execute(
    toolCallId: string,
    params: Record<string, unknown>,
    signal: AbortSignal | undefined,
    onUpdate: unknown,
    ctx: ContextView,
  ): Promise<ToolResult>;
}

export interface CompactionPreparation {
  firstKeptEntryId: string;
  tokensBefore: number;
}

export interface BeforeCompactEvent {
  preparation: CompactionPreparation;
  branchEntries: SessionEntry[];
  customInstructions?: string;
  signal: AbortSignal;
}

export interface BeforeCompactResult {
  cancel?: boolean;
  compaction?: { summary: string; firstKeptEntryId: string; tokensBefore: number; details?: unknown };
}

export interface ToolInfo {
  name: string;
  description: string;
  parameters: unknown;
}

export type Handler<E, R = void> = (event: E, ctx: ContextView) => Promise<R | undefined> | R | undefined;

export interface ContextEvent {
  messages: AgentMessage[];
}

export interface ContextResult {
  messages?: AgentMessage[];
}

export interface MessageEndEvent {
  message: AgentMessage;
}

/** `pi` as an extension's factory receives it. */
export interface ExtensionApi {
  on(event: 'session_start', handler: Handler<unknown>): void;
  on(event: 'session_shutdown', handler: Handler<unknown>): void;
  on(event: 'before_agent_start', handler: Handler<unknown>): void;
  on(event: 'context', handler: Handler<ContextEvent, ContextResult>): void;
  on(event: 'message_end', handler: Handler<MessageEndEvent>): void;
  on(event: 'session_before_compact', handler: Handler<BeforeCompactEvent, BeforeCompactResult>): void;
  registerTool(tool: ToolDefinition): void;
  getActiveTools(): string[];
  getAllTools(): ToolInfo[];
  setActiveTools(names: string[]): void;
  getSessionName(): string | undefined;
}
