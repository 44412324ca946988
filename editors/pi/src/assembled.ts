/**
 * The sidecar's assembled context back to pi, without I/O: pi's own message for each item whose entry
 * is on the branch, so the provider gets pi's bytes for them; and what pi records for a compaction the
 * sidecar made.
 */
import type { AgentMessage, PiModel, SessionEntry } from './pi';
import type { ContextItem, WireMessage } from './protocol';
import { isRecord, str, wireText } from './wire';

const ZERO_USAGE = {
  input: 0,
  output: 0,
  cacheRead: 0,
  cacheWrite: 0,
  totalTokens: 0,
  cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 },
};

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
