/**
 * pi's session entries and messages to the sidecar's wire messages and back, without I/O.
 *
 * Entries become Chat Completions messages as `memory/import` reads a pi session file
 * (sidecar/importers/pi.py): the same ids (pi's entry ids), the same text, tool results paired with
 * their calls; each keeps pi's entry verbatim in `metadata.piEntry`. Assembled messages go back to pi
 * as the originals they were made from, so the provider gets pi's own bytes for them.
 */
import type { AgentMessage, PiModel, SessionEntry } from './pi';
import type { ContextItem, WireMessage } from './protocol';

/** `metadata.source` of what this extension ingests (`memory/import` rewrites only its own source's messages). */
export const SOURCE = 'pi-extension';
export const NO_RESULT = '[no result recorded]';
const BRANCH_PREFIX = 'The following is a summary of a branch that this conversation came back from:\n\n<summary>\n';
const BRANCH_SUFFIX = '</summary>';
const MESSAGE_OVERHEAD_TOKENS = 4;
const IMAGE_TOKENS = 765;

type Json = Record<string, unknown>;

function isRecord(value: unknown): value is Json {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function str(value: unknown): string | undefined {
  return typeof value === 'string' && value ? value : undefined;
}

// ---- token estimates (sidecar/engine/tokens.py) ----------------------------------------------

/** Tokens of a text as the sidecar estimates them: UTF-8 bytes over four, rounded up. */
export function textTokens(text: string): number {
  return Math.ceil(Buffer.byteLength(text, 'utf8') / 4);
}

/** Tokens of one wire message: framing, content parts, tool calls. */
export function wireTokens(message: WireMessage): number {
  let total = MESSAGE_OVERHEAD_TOKENS;
  if (typeof message.content === 'string') {
    total += textTokens(message.content);
  } else if (Array.isArray(message.content)) {
    for (const part of message.content) {
      total += typeof part.text === 'string' ? textTokens(part.text) : part.type === 'image_url' ? IMAGE_TOKENS : textTokens(JSON.stringify(part));
    }
  }
  for (const call of message.tool_calls ?? []) {
    total += textTokens(call.function.name + call.function.arguments) + MESSAGE_OVERHEAD_TOKENS;
  }
  return total;
}

// ---- entries to wire messages -----------------------------------------------------------------

function isoTimestamp(value: unknown): string | undefined {
  if (typeof value === 'string' && value && !Number.isNaN(Date.parse(value))) {
    return value;
  }
  if (typeof value === 'number' && value > 0) {
    const date = new Date(value > 1e11 ? value : value * 1000);
    return Number.isNaN(date.getTime()) ? undefined : date.toISOString();
  }
  return undefined;
}

function metadata(entry: SessionEntry, facts: Json): Json {
  const meta: Json = { source: SOURCE };
  const timestamp = isoTimestamp(entry.timestamp) ?? isoTimestamp(entry.message?.timestamp);
  if (timestamp) {
    meta.timestamp = timestamp;
  }
  for (const [key, value] of Object.entries(facts)) {
    if (value !== undefined && value !== null) {
      meta[key] = value;
    }
  }
  meta.piEntry = entry;
  return meta;
}

/** OpenAI content from text pieces: null, one string, or text parts. */
function textContent(texts: string[]): WireMessage['content'] {
  const kept = texts.filter((t) => t);
  if (kept.length === 0) {
    return null;
  }
  return kept.length === 1 ? kept[0] : kept.map((text) => ({ type: 'text', text }));
}

function userPart(block: unknown): Json {
  if (!isRecord(block)) {
    return { type: 'text', text: '' };
  }
  if (block.type === 'text' && typeof block.text === 'string') {
    return { type: 'text', text: block.text };
  }
  if (block.type === 'image') {
    const data = str(block.data);
    return data ? { type: 'image_url', image_url: { url: `data:${str(block.mimeType) ?? 'image/png'};base64,${data}` } } : { type: 'text', text: '[image]' };
  }
  return { type: 'text', text: '' };
}

function userMessage(id: string, entry: SessionEntry, content: unknown, facts: Json = {}): WireMessage | null {
  let parts: Json[];
  if (typeof content === 'string') {
    parts = [{ type: 'text', text: content }];
  } else if (Array.isArray(content)) {
    parts = content.map(userPart);
  } else {
    return null;
  }
  let body: WireMessage['content'];
  if (parts.every((p) => p.type === 'text')) {
    body = textContent(parts.map((p) => p.text as string));
  } else {
    body = parts.filter((p) => p.type !== 'text' || p.text);
  }
  if (body === null) {
    return null;
  }
  return { role: 'user', content: body, id, metadata: metadata(entry, facts) };
}

function usageFacts(usage: unknown): Json | undefined {
  if (!isRecord(usage)) {
    return undefined;
  }
  const out: Json = {};
  for (const key of ['input', 'output', 'cacheRead', 'cacheWrite']) {
    if (Number.isInteger(usage[key])) {
      out[key] = usage[key];
    }
  }
  return Object.keys(out).length ? out : undefined;
}

function assistantMessage(id: string, entry: SessionEntry, message: AgentMessage): WireMessage | null {
  const blocks = typeof message.content === 'string' ? [{ type: 'text', text: message.content }] : message.content;
  if (!Array.isArray(blocks)) {
    return null;
  }
  const texts: string[] = [];
  const thinking: string[] = [];
  const calls: NonNullable<WireMessage['tool_calls']> = [];
  for (const block of blocks) {
    if (!isRecord(block)) {
      continue;
    }
    if (block.type === 'text' && typeof block.text === 'string') {
      texts.push(block.text);
    } else if (block.type === 'thinking' && typeof block.thinking === 'string') {
      thinking.push(block.thinking);
    } else if (block.type === 'toolCall' && str(block.id) && typeof block.name === 'string') {
      const args = typeof block.arguments === 'string' ? block.arguments : JSON.stringify(block.arguments ?? {});
      calls.push({ id: block.id as string, type: 'function', function: { name: block.name, arguments: args } });
    }
  }
  const wire: WireMessage = { role: 'assistant', content: textContent(texts), id };
  if (calls.length) {
    wire.tool_calls = calls;
  }
  const reasoning = thinking.filter((t) => t.trim()).join('\n\n');
  if (reasoning) {
    wire.reasoning = reasoning;
  }
  const error = typeof message.errorMessage === 'string' ? message.errorMessage.slice(0, 200) : undefined;
  wire.metadata = metadata(entry, {
    model: message.model,
    provider: message.provider,
    usage: usageFacts(message.usage),
    stopReason: message.stopReason,
    errorMessage: error,
  });
  return wire;
}

/** Tool-result content flattened to text, as OpenAI tool messages take it. */
export function blocksToText(content: unknown): string {
  if (content === null || content === undefined) {
    return '';
  }
  if (typeof content === 'string') {
    return content;
  }
  const blocks = Array.isArray(content) ? content : [content];
  const parts: string[] = [];
  for (const block of blocks) {
    if (typeof block === 'string') {
      parts.push(block);
    } else if (!isRecord(block)) {
      continue;
    } else if (typeof block.text === 'string') {
      parts.push(block.text);
    } else if (String(block.type ?? '').includes('image')) {
      parts.push('[image]');
    } else if (block.type) {
      parts.push(`[${String(block.type)}]`);
    }
  }
  return parts.join('\n');
}

/** A user-run bash command as pi shows it to the model. */
function bashText(message: AgentMessage): string {
  let text = `Ran \`${String(message.command ?? '')}\`\n`;
  text += message.output ? '```\n' + String(message.output) + '\n```' : '(no output)';
  if (message.cancelled) {
    text += '\n\n(command cancelled)';
  } else if (Number.isInteger(message.exitCode) && message.exitCode !== 0) {
    text += `\n\nCommand exited with code ${String(message.exitCode)}`;
  }
  return text;
}

/** One entry as a wire message with pi's entry id, or null when pi sends nothing for it. */
export function entryToWire(entry: SessionEntry): WireMessage | null {
  const id = entry.id;
  if (entry.type === 'custom_message') {
    return userMessage(id, entry, entry.content, { customType: entry.customType });
  }
  if (entry.type === 'branch_summary') {
    const summary = str(entry.summary);
    return summary ? userMessage(id, entry, BRANCH_PREFIX + summary + BRANCH_SUFFIX) : null;
  }
  const message = entry.type === 'message' ? entry.message : undefined;
  if (!isRecord(message)) {
    return null;
  }
  switch (message.role) {
    case 'user':
      return userMessage(id, entry, message.content);
    case 'custom':
    case 'hookMessage':
      return userMessage(id, entry, message.content, { customType: message.customType });
    case 'assistant':
      return assistantMessage(id, entry, message);
    case 'toolResult': {
      const callId = str(message.toolCallId);
      if (!callId) {
        return null;
      }
      return {
        role: 'tool',
        tool_call_id: callId,
        content: blocksToText(message.content),
        id,
        metadata: metadata(entry, { toolName: message.toolName, isError: Boolean(message.isError) }),
      };
    }
    case 'bashExecution':
      return message.excludeFromContext ? null : userMessage(id, entry, bashText(message), { bashExecution: true });
    default:
      return null;
  }
}

function isEmptyAssistant(message: WireMessage): boolean {
  return message.role === 'assistant' && !message.content && !message.tool_calls?.length;
}

function standIn(assistant: WireMessage, callId: string, name: string): WireMessage {
  const meta: Json = { source: SOURCE };
  const timestamp = assistant.metadata?.timestamp;
  if (timestamp) {
    meta.timestamp = timestamp;
  }
  meta.toolName = name;
  meta.synthetic = true;
  return { role: 'tool', tool_call_id: callId, content: NO_RESULT, id: `${assistant.id}:${callId}:no-result`, metadata: meta };
}

export interface BranchMessages {
  /** The branch's messages to store, in order, tool results right after their calls. */
  messages: WireMessage[];
  /**
   * Index into the branch of the first entry held back: a tool-calling assistant message whose results are
   * not all written yet, and what follows it. The branch's length when nothing is held back.
   */
  heldFrom: number;
}

/**
 * The wire messages of a branch (root to leaf), paired as `memory/import` pairs them: each result right
 * after its call, a `[no result recorded]` stand-in for a call answered by nothing before the next turn,
 * results without a call left out. The last tool-calling message is held back while results may still
 * come (only results follow it and some are missing), so nothing needs rewriting when they do.
 */
export function branchMessages(branch: SessionEntry[]): BranchMessages {
  const converted: Array<{ index: number; message: WireMessage }> = [];
  branch.forEach((entry, index) => {
    const message = entryToWire(entry);
    if (message && !isEmptyAssistant(message)) {
      converted.push({ index, message });
    }
  });
  let heldFrom = branch.length;
  let cut = converted.length;
  for (let i = converted.length - 1; i >= 0; i--) {
    const message = converted[i].message;
    if (message.role === 'tool') {
      continue;
    }
    if (message.role === 'assistant' && message.tool_calls?.length) {
      const answered = new Set(converted.slice(i + 1).map((c) => c.message.tool_call_id));
      if (message.tool_calls.some((call) => !answered.has(call.id))) {
        heldFrom = converted[i].index;
        cut = i;
      }
    }
    break;
  }
  return { messages: pairToolCalls(converted.slice(0, cut).map((c) => c.message)), heldFrom };
}

function pairToolCalls(messages: WireMessage[]): WireMessage[] {
  const open = new Map<string, number[]>();
  const answers = new Map<number, Map<string, WireMessage>>();
  messages.forEach((message, index) => {
    if (message.role === 'assistant' && message.tool_calls?.length) {
      const ids = message.tool_calls.map((call) => call.id);
      message.tool_calls = message.tool_calls.filter((call, at) => ids.indexOf(call.id) === at);
      for (const call of message.tool_calls) {
        open.set(call.id, [...(open.get(call.id) ?? []), index]);
      }
    } else if (message.role === 'tool') {
      const owners = open.get(message.tool_call_id ?? '');
      const owner = owners?.shift();
      if (owner !== undefined) {
        const map = answers.get(owner) ?? new Map<string, WireMessage>();
        map.set(message.tool_call_id as string, message);
        answers.set(owner, map);
      }
    }
  });
  const out: WireMessage[] = [];
  const seenIds = new Map<string, number>();
  const push = (message: WireMessage) => {
    const count = seenIds.get(message.id as string) ?? 0;
    seenIds.set(message.id as string, count + 1);
    out.push(count ? { ...message, id: `${message.id}#${count + 1}` } : message);
  };
  messages.forEach((message, index) => {
    if (message.role === 'tool') {
      return;
    }
    push(message);
    for (const call of message.tool_calls ?? []) {
      push(answers.get(index)?.get(call.id) ?? standIn(message, call.id, call.function.name));
    }
  });
  return out;
}

// ---- which sidecar session a branch is --------------------------------------------------------

/**
 * The sidecar session of the branch that ends at the leaf: pi's session id while the branch follows the
 * first child at every fork, else that id with the last entry where it took another child. A rewound and
 * continued conversation (pi's /tree) is another session, so an abandoned branch never reaches the prompt.
 */
export function sessionKey(sessionId: string, entries: SessionEntry[], branch: SessionEntry[]): string {
  const firstChild = new Map<string | null, string>();
  for (const entry of entries) {
    if (!firstChild.has(entry.parentId ?? null)) {
      firstChild.set(entry.parentId ?? null, entry.id);
    }
  }
  let fork: string | undefined;
  for (const entry of branch) {
    if (firstChild.get(entry.parentId ?? null) !== entry.id) {
      fork = entry.id;
    }
  }
  return fork ? `${sessionId}/${fork}` : sessionId;
}

// ---- what pi sends that is not written yet ----------------------------------------------------

/** A key that matches a message in pi's context to the entry it was written as. */
export function messageKey(message: AgentMessage): string | undefined {
  switch (message.role) {
    case 'custom':
      return `custom:${String(message.customType)}:${JSON.stringify(message.content)}`;
    case 'branchSummary':
      return `branchSummary:${String(message.summary)}`;
    case 'compactionSummary':
      return undefined;
    default:
      return `${message.role}@${message.timestamp}`;
  }
}

export function entryKey(entry: SessionEntry): string | undefined {
  if (entry.type === 'message' && entry.message) {
    return messageKey(entry.message);
  }
  if (entry.type === 'custom_message') {
    return `custom:${String(entry.customType)}:${JSON.stringify(entry.content)}`;
  }
  if (entry.type === 'branch_summary') {
    return `branchSummary:${String(entry.summary)}`;
  }
  return undefined;
}

/**
 * Where the messages of pi's context that the sidecar does not hold begin: the longest run at the end
 * whose entries are not among `stored` (the keys of the branch's entries before `heldFrom`). pi writes a
 * message after handing it to the model loop, so the newest may not be written yet; those are sent as
 * pi has them, after the sidecar's context.
 */
export function unstoredFrom(messages: AgentMessage[], stored: Set<string>): number {
  let start = messages.length;
  while (start > 0) {
    const key = messageKey(messages[start - 1]);
    if (key === undefined || stored.has(key)) {
      break;
    }
    start--;
  }
  return start;
}

/** Keys of the branch's entries before `heldFrom`: what the sidecar holds once they are ingested. */
export function storedKeys(branch: SessionEntry[], heldFrom: number): Set<string> {
  const keys = new Set<string>();
  for (const entry of branch.slice(0, heldFrom)) {
    const key = entryKey(entry);
    if (key !== undefined) {
      keys.add(key);
    }
  }
  return keys;
}

/** Estimated tokens of pi messages that the sidecar does not hold (sent after its context). */
export function agentMessagesTokens(messages: AgentMessage[]): number {
  let total = 0;
  for (const message of messages) {
    const wire = entryToWire({ type: 'message', id: 'x', parentId: null, timestamp: '', message });
    total += wire ? wireTokens(wire) : MESSAGE_OVERHEAD_TOKENS + textTokens(JSON.stringify(message.content ?? ''));
  }
  return total;
}

// ---- assembled context back to pi -------------------------------------------------------------

const ZERO_USAGE = {
  input: 0,
  output: 0,
  cacheRead: 0,
  cacheWrite: 0,
  totalTokens: 0,
  cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 },
};

function wireText(content: WireMessage['content']): string {
  if (typeof content === 'string') {
    return content;
  }
  return (content ?? []).map((part) => (typeof part.text === 'string' ? part.text : '')).join('\n');
}

function userContent(content: WireMessage['content']): unknown[] {
  if (typeof content === 'string' || content === null) {
    return [{ type: 'text', text: content ?? '' }];
  }
  return content.map((part) => {
    const url = isRecord(part.image_url) ? str(part.image_url.url) : undefined;
    const data = url?.match(/^data:([^;,]+);base64,(.*)$/s);
    if (part.type === 'image_url' && data) {
      return { type: 'image', mimeType: data[1], data: data[2] };
    }
    return { type: 'text', text: typeof part.text === 'string' ? part.text : `[${String(part.type)}]` };
  });
}

/** A pi message made from a wire message the branch has no entry for (a stand-in, another client's). */
function fromWire(message: WireMessage, model: PiModel, toolNames: Map<string, string>): AgentMessage {
  if (message.role === 'assistant') {
    const content: unknown[] = [];
    const text = wireText(message.content);
    if (text) {
      content.push({ type: 'text', text });
    }
    for (const call of message.tool_calls ?? []) {
      let args: unknown = {};
      try {
        args = JSON.parse(call.function.arguments);
      } catch {
        args = {};
      }
      content.push({ type: 'toolCall', id: call.id, name: call.function.name, arguments: isRecord(args) ? args : {} });
    }
    return {
      role: 'assistant',
      content,
      api: model.api,
      provider: model.provider,
      model: model.id,
      usage: ZERO_USAGE,
      stopReason: message.tool_calls?.length ? 'toolUse' : 'stop',
      timestamp: 0,
    };
  }
  if (message.role === 'tool') {
    const callId = message.tool_call_id ?? '';
    return {
      role: 'toolResult',
      toolCallId: callId,
      toolName: toolNames.get(callId) ?? '',
      content: [{ type: 'text', text: wireText(message.content) }],
      isError: false,
      timestamp: 0,
    };
  }
  return { role: 'user', content: userContent(message.content), timestamp: 0 };
}

/** The pi message an entry stands for in pi's own context (its `buildSessionContext`). */
function fromEntry(entry: SessionEntry, message: WireMessage, item: ContextItem): AgentMessage | undefined {
  const at = Date.parse(entry.timestamp);
  if (entry.type === 'custom_message') {
    return {
      role: 'custom',
      customType: entry.customType,
      content: entry.content,
      display: entry.display,
      details: entry.details,
      timestamp: at,
    };
  }
  if (entry.type === 'branch_summary') {
    return { role: 'branchSummary', summary: entry.summary, fromId: entry.fromId, timestamp: at };
  }
  if (entry.type !== 'message' || !entry.message) {
    return undefined;
  }
  const original = structuredClone(entry.message);
  if (original.role === 'toolResult' && item.pruned) {
    original.content = [{ type: 'text', text: wireText(message.content) }];
  }
  if (original.role === 'assistant' && (original.stopReason === 'error' || original.stopReason === 'aborted')) {
    // pi leaves failed turns out of what it sends; the sidecar kept this one (it has text or calls, with
    // their results), so it goes as a finished turn and the results keep their call.
    original.stopReason = message.tool_calls?.length ? 'toolUse' : 'stop';
  }
  return original;
}

/**
 * The sidecar's assembled context as pi messages: pi's own message for each item whose entry is on the
 * branch (a pruned tool result with the sidecar's placeholder text), summaries as user messages.
 */
export function toAgentMessages(
  messages: WireMessage[],
  items: ContextItem[],
  entries: Map<string, SessionEntry>,
  model: PiModel,
): AgentMessage[] {
  const toolNames = new Map<string, string>();
  return messages.map((message, index) => {
    for (const call of message.tool_calls ?? []) {
      toolNames.set(call.id, call.function.name);
    }
    const item = items[index];
    if (item?.kind === 'summary') {
      return { role: 'user', content: [{ type: 'text', text: wireText(message.content) }], timestamp: 0 };
    }
    const entry = item ? entries.get(item.id) : undefined;
    return (entry && fromEntry(entry, message, item)) ?? fromWire(message, model, toolNames);
  });
}

/** The text pi keeps for a compaction the sidecar made: the summaries its context now starts with. */
export function summaryText(messages: WireMessage[], items: ContextItem[]): string {
  return messages
    .filter((_, index) => items[index]?.kind === 'summary')
    .map((message) => wireText(message.content))
    .join('\n\n');
}

const CUT_ROLES = new Set(['user', 'assistant', 'bashExecution', 'custom']);

/**
 * The entry pi keeps from after a compaction the sidecar made: the first message the sidecar's context
 * has after its summaries (back to its tool call if that is a result), so pi's own view matches the
 * sidecar's should pi ever build its context alone. Undefined when that message is not on the branch.
 */
export function firstKeptEntryId(items: ContextItem[], branch: SessionEntry[]): string | undefined {
  let last = -1;
  items.forEach((item, index) => {
    if (item.kind === 'summary') {
      last = index;
    }
  });
  const first = items.slice(last + 1).find((item) => item.kind === 'message');
  if (last < 0 || !first) {
    return undefined;
  }
  let at = branch.findIndex((entry) => entry.id === first.id);
  while (at >= 0) {
    const entry = branch[at];
    if (entry.type === 'custom_message' || entry.type === 'branch_summary') {
      return entry.id;
    }
    if (entry.type === 'message' && entry.message && CUT_ROLES.has(entry.message.role)) {
      return entry.id;
    }
    if (entry.type !== 'message' || entry.message?.role !== 'toolResult') {
      return undefined;
    }
    at--;
  }
  return undefined;
}
