/**
 * pi's session entries as the sidecar's wire messages, without I/O: as `memory/import` reads a pi session
 * file (sidecar/importers/pi.py), with the same ids (pi's entry ids), the same text, tool results paired
 * with their calls; each keeps pi's entry verbatim in `metadata.piEntry`.
 */
import type { AgentMessage, SessionEntry } from './pi';
import type { WireMessage } from './protocol';

/** `metadata.source` of what this extension ingests (`memory/import` rewrites only its own source's messages). */
export const SOURCE = 'pi-extension';
export const NO_RESULT = '[no result recorded]';
const BRANCH_PREFIX = 'The following is a summary of a branch that this conversation came back from:\n\n<summary>\n';
const BRANCH_SUFFIX = '</summary>';
/** Tokens the sidecar counts for a message's (or a tool call's) framing. */
export const MESSAGE_OVERHEAD_TOKENS = 4;
const IMAGE_TOKENS = 765;

export type Json = Record<string, unknown>;

export function isRecord(value: unknown): value is Json {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

export function str(value: unknown): string | undefined {
  return typeof value === 'string' && value ? value : undefined;
}

// Token estimates, as sidecar/engine/tokens.py makes them.

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

/** The text of a wire message's content: the string, or its text parts one per line. */
export function wireText(content: WireMessage['content']): string {
  if (typeof content === 'string') {
    return content;
  }
  return (content ?? []).map((part) => (typeof part.text === 'string' ? part.text : '')).join('\n');
}

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
