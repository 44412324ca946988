/**
 * Which sidecar session a pi branch is, and which of the messages pi hands its `context` handlers are
 * not written to its session yet.
 */
import type { AgentMessage, SessionEntry } from './pi';
import { entryToWire, MESSAGE_OVERHEAD_TOKENS, textTokens, wireTokens } from './wire';

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
