/**
 * What the extension does in pi: ingest pi's messages and send the sidecar's context on every LLM call,
 * compact through the sidecar, run the memory tools, report the provider's usage; and step aside,
 * saying why once, whenever the sidecar cannot be used.
 */
import { firstKeptEntryId, summaryText, toAgentMessages } from './assembled';
import { agentMessagesTokens, entryKey, messageKey, sessionKey, storedKeys, unstoredFrom } from './branches';
import type { AgentMessage, BeforeCompactEvent, BeforeCompactResult, ContextView, ExtensionApi, PiModel, SessionManagerView } from './pi';
import { AssembleResult, CompactResult, ErrorCodes, MEMORY_TOOLS, Methods, TRANSCRIPT_ENV, Usage, WireMessage } from './protocol';
import { RpcError } from './rpc';
import { initializationOptions, readSources, resolveSettings, Settings } from './settings';
import { Sidecar } from './sidecar';
import { summarize } from './summaries';
import { branchMessages, MESSAGE_OVERHEAD_TOKENS, textTokens, wireText } from './wire';

export const STATUS_KEY = 'context-sidecar';
export const MEMORY_TOOL_NAMES: string[] = MEMORY_TOOLS.map((tool) => tool.function.name);
const REQUEST_TIMEOUT_MS = 60_000;
/** `memory_query` may ask the summarizer's model. */
const TOOL_TIMEOUT_MS = 300_000;
/** How long a `context` call waits for pi to write the messages it was handed (pi writes them a moment later). */
const WRITE_WAIT_ROUNDS = 25;
/**
 * How long pi waits, from the server's start, for its `initialize` answer (a healthy one answers well within):
 * one that hangs costs pi this once, not the whole start timeout. Until it answers, pi sends its own context
 * (what the sidecar missed is stored at the next call after), and a start that fails is said as ever.
 */
const START_WAIT_MS = 3_000;

const TOOL_LABELS: Record<string, string> = {
  memory_grep: 'Memory grep',
  memory_describe: 'Memory describe',
  memory_expand: 'Memory expand',
  memory_query: 'Memory query',
};

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** Waits (briefly) until the newest message pi hands over is written to its session. */
async function waitWritten(messages: AgentMessage[], manager: SessionManagerView): Promise<void> {
  const last = [...messages].reverse().map(messageKey).find((key) => key !== undefined);
  if (last === undefined) {
    return;
  }
  for (let round = 0; round < WRITE_WAIT_ROUNDS; round++) {
    if (manager.getBranch().slice(-64).some((entry) => entryKey(entry) === last)) {
      return;
    }
    await new Promise((resolve) => (round < 5 ? setImmediate(resolve) : setTimeout(resolve, 10)));
  }
}

export class PiSidecar {
  readonly settings: Settings;
  private readonly problems: string[];
  private sidecar: Sidecar | undefined;
  /** Why the sidecar is not used for the rest of this session. */
  private broken: string | undefined;
  private readonly said = new Set<string>();
  /** Message ids stored, by sidecar session (what this process sent or found stored). */
  private readonly ingested = new Map<string, Set<string>>();
  /** The sidecar session whose context the pending LLM call carries (its usage is reported there). */
  private assembledFor: string | undefined;
  private key: string | undefined;
  private ctx: ContextView | undefined;
  private status: string | undefined;
  /** The workspace pi's sessions are recorded under (the server's root): pi's directory when it started. */
  private workspace: string | undefined;
  /** When the server was started (`Date.now()`). */
  private startedAt = 0;

  constructor(
    private readonly pi: ExtensionApi,
    private readonly env: Record<string, string | undefined> = process.env,
    cwd: string = process.cwd(),
  ) {
    this.problems = [];
    const resolved = resolveSettings(readSources(cwd, env, this.problems));
    this.settings = resolved.settings;
    this.problems.push(...resolved.problems);
  }

  register(): void {
    if (!this.settings.enabled) {
      return;
    }
    for (const tool of MEMORY_TOOLS) {
      const name = tool.function.name;
      this.pi.registerTool({
        name,
        label: TOOL_LABELS[name] ?? name,
        description: tool.function.description,
        parameters: structuredClone(tool.function.parameters),
        execute: (toolCallId, params, signal, _onUpdate, ctx) => this.callTool(name, toolCallId, params, signal, ctx),
      });
    }
    this.pi.on('session_start', (_event, ctx) => this.onSessionStart(ctx));
    this.pi.on('before_agent_start', (_event, ctx) => this.onBeforeAgentStart(ctx));
    this.pi.on('context', (event, ctx) => this.onContext(event.messages, ctx));
    this.pi.on('message_end', (event, ctx) => this.onMessageEnd(event.message, ctx));
    this.pi.on('session_before_compact', (event, ctx) => this.onBeforeCompact(event, ctx));
    this.pi.on('session_shutdown', () => this.stop());
  }

  // ---- events ---------------------------------------------------------------------------------

  private onSessionStart(ctx: ContextView): void {
    this.ctx = ctx;
    if (this.problems.length) {
      this.say(`context-sidecar settings: ${this.problems.join('; ')}`, 'warning');
    }
    this.start(ctx.cwd);
  }

  /** The first prompt waits (a while) for the server, so its first request already has the sidecar's context. */
  private async onBeforeAgentStart(ctx: ContextView): Promise<undefined> {
    this.ctx = ctx;
    try {
      await this.started(ctx);
    } catch (error) {
      this.fail(error);
    }
    this.checkReserve(ctx.model);
    return undefined;
  }

  /**
   * pi asks to compact once a prompt is over its window less its own `compaction.reserveTokens`; the sidecar keeps
   * prompts within the window less at most half of it. A reserve over half the window has pi ask before every turn:
   * say once which setting to change (the sidecar declines what it finds nothing to compact for).
   */
  private checkReserve(model: PiModel | undefined): void {
    const window = model ? this.window(model) : 0;
    const reserve = this.settings.piReserveTokens;
    if (window > 0 && this.settings.piCompaction && reserve > window / 2) {
      const most = Math.floor(window / 2);
      this.say(
        `context-sidecar: pi's compaction.reserveTokens (${reserve}) is over half of ${model?.id}'s ${window}-token window, ` +
          `so pi asks to compact before every turn; set compaction.reserveTokens to ${most} or less in pi's settings.json`,
        'warning',
        'reserve',
      );
    }
  }

  private async onContext(messages: AgentMessage[], ctx: ContextView): Promise<{ messages: AgentMessage[] } | undefined> {
    this.ctx = ctx;
    const model = ctx.model;
    if (this.broken || !model) {
      return undefined;
    }
    try {
      const sidecar = await this.started(ctx);
      if (!sidecar) {
        return undefined; // Still starting: pi's own context for this call.
      }
      const manager = ctx.sessionManager;
      await waitWritten(messages, manager);
      const branch = manager.getBranch();
      const key = sessionKey(manager.getSessionId(), manager.getEntries(), branch);
      const { messages: wire, heldFrom } = branchMessages(branch);
      if (!(await this.ingest(sidecar, key, wire, model))) {
        return undefined; // Nothing written yet: pi's own context is all there is.
      }
      const tail = messages.slice(unstoredFrom(messages, storedKeys(branch, heldFrom)));
      const result = await this.assemble(sidecar, key, ctx, model, agentMessagesTokens(tail));
      this.assembledFor = key;
      const entries = new Map(branch.map((entry) => [entry.id, entry]));
      return { messages: [...toAgentMessages(result.messages, result.items, entries, model), ...tail] };
    } catch (error) {
      this.fail(error);
      return undefined;
    }
  }

  private onMessageEnd(message: AgentMessage, ctx: ContextView): void {
    this.ctx = ctx;
    const key = this.assembledFor;
    if (message.role !== 'assistant' || key === undefined || !this.sidecar || this.broken) {
      return;
    }
    this.assembledFor = undefined;
    const usage = message.usage as Record<string, unknown> | undefined;
    const count = (name: string) => (Number.isInteger(usage?.[name]) && (usage?.[name] as number) >= 0 ? (usage?.[name] as number) : 0);
    if (message.stopReason === 'error' || message.stopReason === 'aborted') {
      return;
    }
    if (count('input') + count('cacheRead') + count('cacheWrite') === 0) {
      return;
    }
    this.sidecar.notify(Methods.CONTEXT_REPORT_USAGE, {
      sessionId: key,
      inputTokens: count('input'),
      outputTokens: count('output'),
      cacheReadTokens: count('cacheRead'),
      cacheWriteTokens: count('cacheWrite'),
    });
  }

  /** pi's /compact and auto-compaction, through the sidecar: its summary is what pi keeps. */
  private async onBeforeCompact(event: BeforeCompactEvent, ctx: ContextView): Promise<BeforeCompactResult | undefined> {
    this.ctx = ctx;
    if (this.broken) {
      return undefined;
    }
    try {
      const sidecar = await this.started(ctx);
      if (!sidecar) {
        return undefined; // Still starting: pi compacts with its own summarizer.
      }
      const manager = ctx.sessionManager;
      const branch = event.branchEntries;
      const key = sessionKey(manager.getSessionId(), manager.getEntries(), branch);
      const model = ctx.model ?? { id: 'unknown', provider: 'unknown', api: 'unknown', contextWindow: 0 };
      await this.ingest(sidecar, key, branchMessages(branch).messages, model);
      const focus = event.customInstructions?.trim();
      const result = await sidecar.request<CompactResult & { summary?: string }>(
        Methods.CONTEXT_COMPACT,
        { sessionId: key, ...(focus ? { focus } : {}) },
        { signal: event.signal },
      );
      if (!result.compacted) {
        // Once: with a reserve over half the window pi asks before every turn (checkReserve says so).
        this.say(`context-sidecar did not compact: ${result.reason ?? 'nothing to compact'}`, 'info', 'not compacted');
        return { cancel: true };
      }
      const context = await this.assemble(sidecar, key, ctx, model, 0);
      const summary = summaryText(context.messages, context.items) || result.summary || '';
      if (!summary) {
        // Every assembled context of a compacted session carries its summaries; a server that breaks that
        // costs this compaction only.
        this.say('context-sidecar compacted, but its context holds no summary; pi keeps its context as it is', 'warning');
        return { cancel: true };
      }
      return {
        compaction: {
          summary,
          firstKeptEntryId: firstKeptEntryId(context.items, branch) ?? event.preparation.firstKeptEntryId,
          tokensBefore: result.tokensBefore,
          details: {
            source: 'context-sidecar',
            sessionId: key,
            mode: result.mode,
            summaryIds: result.summaryIds,
            tokensAfter: result.tokensAfter,
          },
        },
      };
    } catch (error) {
      if (event.signal.aborted) {
        return { cancel: true };
      }
      this.fail(error);
      return undefined; // pi compacts with its own summarizer.
    }
  }

  private async callTool(
    name: string,
    toolCallId: string,
    params: Record<string, unknown>,
    signal: AbortSignal | undefined,
    ctx: ContextView,
  ): Promise<{ content: Array<{ type: 'text'; text: string }>; details: Record<string, unknown> }> {
    if (this.broken) {
      throw new Error(`context-sidecar is not available: ${this.broken}`);
    }
    const manager = ctx.sessionManager;
    const key = sessionKey(manager.getSessionId(), manager.getEntries(), manager.getBranch());
    let message: WireMessage;
    try {
      const sidecar = await this.ready(ctx);
      ({ message } = await sidecar.request<{ message: WireMessage }>(
        Methods.MEMORY_CALL_TOOL,
        // Every session of the workspace, pi's current one first, as the MCP server gives Claude Code and Codex.
        { sessionId: key, name, arguments: JSON.stringify(params ?? {}), toolCallId, workspace: this.workspace ?? ctx.cwd },
        { signal, timeoutMs: TOOL_TIMEOUT_MS },
      ));
    } catch (error) {
      if (!(error instanceof RpcError)) {
        this.fail(error);
      }
      throw new Error(`context-sidecar could not run ${name}: ${describe(error)}`);
    }
    const text = wireText(message.content);
    if (text.startsWith('Error:')) {
      throw new Error(text); // pi marks the result as an error; the text says how to correct the call.
    }
    return { content: [{ type: 'text', text }], details: { sessionId: key } };
  }

  // ---- the sidecar ----------------------------------------------------------------------------

  private start(cwd: string): void {
    if (this.sidecar || this.broken) {
      return;
    }
    try {
      const sidecar = Sidecar.start({
        command: this.settings.command,
        db: this.settings.db,
        cwd,
        initializationOptions: initializationOptions(this.settings),
        summarize: (params) => summarize(params, this.ctx),
      });
      this.sidecar = sidecar;
      this.startedAt = Date.now();
      this.workspace = cwd;
      sidecar.onNotification(Methods.CONTEXT_DID_CHANGE_USAGE, (usage: Usage) => this.showUsage(usage));
      sidecar.onNotification('window/showMessage', (params: { type?: number; message?: string }) => {
        if ((params?.type ?? 3) <= 2 && params?.message) {
          // The server's messages name it already; the topic is the reason, as for a failed request.
          const reason = params.message.replace(/^context-sidecar: /, '');
          this.say(params.message.startsWith('context-sidecar') ? params.message : `context-sidecar: ${reason}`, 'warning', reason);
        }
      });
      sidecar.ready.then(() => this.watch(sidecar, cwd), (error) => this.fail(error));
    } catch (error) {
      this.fail(error);
    }
  }

  /**
   * Has the server follow the agents' transcripts of the workspace (`memory/watch`), so that the memory tools
   * find the earlier sessions of Claude Code, Codex and pi there, as the MCP server's do. The tools work without.
   */
  private watch(sidecar: Sidecar, workspace: string): void {
    const env = Object.fromEntries(TRANSCRIPT_ENV.flatMap((name) => (this.env[name] ? [[name, this.env[name]]] : [])));
    sidecar.request(Methods.MEMORY_WATCH, { workspace, env }, { timeoutMs: REQUEST_TIMEOUT_MS }).catch(() => undefined);
  }

  /** The server once it answered; undefined while a start takes longer than START_WAIT_MS (waited for once). */
  private async started(ctx: ContextView): Promise<Sidecar | undefined> {
    const starting = this.ready(ctx);
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<undefined>((resolve) => {
      timer = setTimeout(() => resolve(undefined), Math.max(0, this.startedAt + START_WAIT_MS - Date.now()));
    });
    try {
      return await Promise.race([starting, late]);
    } finally {
      clearTimeout(timer);
      starting.catch(() => undefined); // A start that fails later is said by start()'s own handler.
    }
  }

  private async ready(ctx: ContextView): Promise<Sidecar> {
    if (!this.sidecar) {
      this.start(ctx.cwd);
    }
    if (this.broken || !this.sidecar) {
      throw new Error(this.broken ?? 'context-sidecar did not start');
    }
    await this.sidecar.ready;
    return this.sidecar;
  }

  private window(model: PiModel): number {
    return this.settings.contextWindow ?? model.contextWindow;
  }

  /** Stores what the sidecar does not have yet; false when the session holds nothing at all. */
  private async ingest(sidecar: Sidecar, key: string, messages: WireMessage[], model: PiModel): Promise<boolean> {
    this.key = key;
    let stored = this.ingested.get(key);
    if (!stored) {
      stored = new Set();
      this.ingested.set(key, stored);
    }
    const fresh = messages.filter((message) => !stored.has(message.id as string));
    if (fresh.length) {
      const name = this.pi.getSessionName();
      const [piSession, fork] = key.split('/');
      const session: Record<string, unknown> = {
        model: model.id,
        metadata: { agent: 'pi', piSessionId: piSession, ...(fork ? { piBranch: fork } : {}) },
        ...(name ? { title: name } : {}),
      };
      const window = this.window(model);
      if (window > 0) {
        session.contextWindow = window;
      }
      await sidecar.request(Methods.MEMORY_INGEST, { sessionId: key, messages: fresh, session }, { timeoutMs: REQUEST_TIMEOUT_MS });
      for (const message of fresh) {
        stored.add(message.id as string);
      }
    }
    return stored.size > 0;
  }

  /**
   * The sidecar's context within the budget the server works out: the window less the reserve for the answer
   * (or the model's max tokens, when more) and what pi sends beside it: its system prompt and tool definitions,
   * and `extra` (messages pi sends after it).
   */
  private async assemble(sidecar: Sidecar, key: string, ctx: ContextView, model: PiModel, extra: number): Promise<AssembleResult> {
    const params = {
      sessionId: key,
      overheadTokens: this.overhead(ctx) + extra,
      ...(model.maxTokens ? { replyTokens: model.maxTokens } : {}),
    };
    try {
      const result = await sidecar.request<AssembleResult>(Methods.CONTEXT_ASSEMBLE, params, { timeoutMs: REQUEST_TIMEOUT_MS });
      if (result.overBudget && result.reason) {
        this.say(`context-sidecar: the context is over its budget: ${result.reason}`, 'warning', 'over budget');
      }
      return result;
    } catch (error) {
      if (error instanceof RpcError && error.code === ErrorCodes.UNKNOWN_SESSION) {
        this.ingested.delete(key); // Deleted by another client: the next call stores the branch again.
      }
      throw error;
    }
  }

  /** Tokens of what pi sends beside the messages: its system prompt and the active tools' definitions. */
  private overhead(ctx: ContextView): number {
    let tokens = textTokens(ctx.getSystemPrompt()) + MESSAGE_OVERHEAD_TOKENS;
    const active = new Set(this.pi.getActiveTools());
    for (const tool of this.pi.getAllTools()) {
      if (active.has(tool.name)) {
        tokens += textTokens(JSON.stringify({ name: tool.name, description: tool.description, parameters: tool.parameters }));
        tokens += MESSAGE_OVERHEAD_TOKENS;
      }
    }
    return tokens;
  }

  private showUsage(usage: Usage): void {
    if (!this.ctx || usage.sessionId !== this.key) {
      return;
    }
    const text = `ctx ${Math.round(usage.percent)}%${usage.state === 'ok' ? '' : ` ${usage.state}`}`;
    if (text !== this.status) {
      this.status = text;
      this.ctx.ui.setStatus(STATUS_KEY, text);
    }
  }

  /**
   * After a failure: a request's error (the server answered) costs this call only; anything else (it did
   * not start, it exited, it stopped answering) ends its use for the session. Either is said once.
   */
  private fail(error: unknown): void {
    const reason = describe(error);
    if (error instanceof RpcError) {
      if (!this.said.has(reason)) {
        this.said.add(reason); // The server may have shown the same reason (it cannot open its database).
        this.say(`context-sidecar: ${reason}; pi sends its own context for now`, 'warning', 'request');
      }
      return;
    }
    if (this.broken) {
      return;
    }
    this.broken = reason;
    this.say(`context-sidecar: ${reason}. pi keeps its own context and compaction.`, 'warning', 'broken');
    const active = this.pi.getActiveTools();
    if (active.some((name) => MEMORY_TOOL_NAMES.includes(name))) {
      this.pi.setActiveTools(active.filter((name) => !MEMORY_TOOL_NAMES.includes(name)));
    }
    const sidecar = this.sidecar;
    void sidecar?.stop();
  }

  /** Tells the user once per `topic` (default: the text itself). */
  private say(text: string, level: 'info' | 'warning' | 'error', topic: string = text): void {
    if (!this.said.has(topic)) {
      this.said.add(topic);
      this.tell(text, level);
    }
  }

  /** pi's notification where it has a UI, else a line on stderr (print mode). */
  private tell(text: string, level: 'info' | 'warning' | 'error'): void {
    const ctx = this.ctx;
    if (ctx?.hasUI) {
      ctx.ui.notify(text, level);
    } else {
      process.stderr.write(`${text}\n`);
    }
  }

  private async stop(): Promise<void> {
    const sidecar = this.sidecar;
    this.sidecar = undefined;
    this.broken ??= 'the session ended';
    if (this.status !== undefined) {
      this.ctx?.ui.setStatus(STATUS_KEY, undefined);
    }
    this.ctx = undefined; // pi's context of a session that ended must not be used again.
    await sidecar?.stop();
  }
}
