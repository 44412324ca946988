/** pi session entries for the tests, shaped as pi 0.73 writes them. */
import { readFileSync } from 'node:fs';
import type { AgentMessage, SessionEntry } from '../src/pi';

let clock = Date.parse('2026-03-01T10:00:00.000Z');

/** A session built entry by entry, each a child of the leaf, as pi appends them. */
export class Session {
  readonly entries: SessionEntry[] = [];
  leaf: string | null = null;
  private counter = 0;

  constructor(readonly id = 'sess-1') {}

  append(entry: Omit<SessionEntry, 'id' | 'parentId' | 'timestamp'> & { id?: string; [key: string]: unknown }): SessionEntry {
    clock += 1000;
    this.counter += 1;
    const { id, ...fields } = entry;
    const full = {
      id: id ?? `e${String(this.counter).padStart(2, '0')}`,
      parentId: this.leaf,
      timestamp: new Date(clock).toISOString(),
      ...fields,
    } as SessionEntry;
    this.entries.push(full);
    this.leaf = full.id;
    return full;
  }

  message(message: Omit<AgentMessage, 'timestamp'>, id?: string): SessionEntry {
    return this.append({ type: 'message', id, message: { timestamp: clock + 1000, ...message } as AgentMessage });
  }

  user(text: string, id?: string): SessionEntry {
    return this.message({ role: 'user', content: [{ type: 'text', text }] }, id);
  }

  assistant(text: string, calls: Array<{ id: string; name: string; arguments: Record<string, unknown> }> = [], id?: string): SessionEntry {
    const content: unknown[] = text ? [{ type: 'text', text }] : [];
    for (const call of calls) {
      content.push({ type: 'toolCall', ...call });
    }
    return this.message(
      {
        role: 'assistant',
        content,
        api: 'openai-completions',
        provider: 'fake',
        model: 'fake-model',
        usage: { input: 10, output: 2, cacheRead: 0, cacheWrite: 0, totalTokens: 12, cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 } },
        stopReason: calls.length ? 'toolUse' : 'stop',
      },
      id,
    );
  }

  result(callId: string, name: string, text: string, id?: string): SessionEntry {
    return this.message({ role: 'toolResult', toolCallId: callId, toolName: name, content: [{ type: 'text', text }], isError: false }, id);
  }

  /** The path from the root to the leaf. */
  branch(): SessionEntry[] {
    const byId = new Map(this.entries.map((e) => [e.id, e]));
    const path: SessionEntry[] = [];
    let at = this.leaf ? byId.get(this.leaf) : undefined;
    while (at) {
      path.unshift(at);
      at = at.parentId ? byId.get(at.parentId) : undefined;
    }
    return path;
  }
}

/** The entries of a pi session file and the path to its last entry. */
export function readSessionFile(path: string): { header: Record<string, unknown>; entries: SessionEntry[]; branch: SessionEntry[] } {
  const lines = readFileSync(path, 'utf8').split('\n').filter((line) => line.trim()).map((line) => JSON.parse(line));
  const header = lines.find((line) => line.type === 'session');
  const entries: SessionEntry[] = lines.filter((line) => line.type !== 'session');
  const byId = new Map(entries.map((entry) => [entry.id, entry]));
  const branch: SessionEntry[] = [];
  let at: SessionEntry | undefined = entries[entries.length - 1];
  while (at) {
    branch.unshift(at);
    at = at.parentId ? byId.get(at.parentId) : undefined;
  }
  return { header, entries, branch };
}
