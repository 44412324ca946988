import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { AgentMessage, SessionEntry } from '../src/pi';
import type { WireMessage } from '../src/protocol';
import { branchMessages, entryToWire, NO_RESULT, SOURCE, textTokens, wireTokens } from '../src/wire';
import { agentMessagesTokens } from '../src/branches';
import { readSessionFile, Session } from './entries';
import { PI_FIXTURE } from './paths';

function strip(message: WireMessage): WireMessage {
  const { metadata: _, ...rest } = message;
  return rest;
}

describe('pi entries to wire messages', () => {
  const { branch } = readSessionFile(PI_FIXTURE);
  const { messages, heldFrom } = branchMessages(branch);

  it("keeps pi's entry ids and leaves out what pi sends nothing for", () => {
    assert.deepEqual(
      messages.map((m) => m.id),
      ['p01', 'p03', 'p04', 'p05', 'p06', 'p07', 'p08'],
      'the aborted empty assistant p02 and the model/thinking-level entries are not messages',
    );
    assert.equal(heldFrom, branch.length, 'the branch ends with a finished turn: nothing held back');
  });

  it('converts user images, thinking, tool calls and error results as memory/import does', () => {
    const byId = new Map(messages.map((m) => [m.id, m]));
    assert.deepEqual(strip(byId.get('p01')!), {
      role: 'user',
      content: [
        { type: 'text', text: 'What is on this screenshot, and fix cart.py accordingly.' },
        { type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgoAAAANSUhEUg==' } },
      ],
      id: 'p01',
    });
    assert.deepEqual(strip(byId.get('p04')!), {
      role: 'assistant',
      content: 'Reading cart.py.',
      id: 'p04',
      tool_calls: [{ id: 'toolu_pi1', type: 'function', function: { name: 'read', arguments: '{"path":"cart.py"}' } }],
      reasoning: 'The screenshot shows a failing discount test; read cart.py.',
    });
    const error = byId.get('p07')!;
    assert.equal(error.role, 'tool');
    assert.equal(error.tool_call_id, 'toolu_pi2');
    assert.equal(error.metadata?.isError, true);
    assert.equal(error.metadata?.toolName, 'bash');
  });

  it("keeps pi's entry verbatim in metadata, with the source and the entry's time", () => {
    const entry = branch.find((e) => e.id === 'p04')!;
    const message = messages.find((m) => m.id === 'p04')!;
    assert.equal(message.metadata?.source, SOURCE);
    assert.equal(message.metadata?.timestamp, entry.timestamp);
    assert.deepEqual(message.metadata?.piEntry, entry);
    assert.deepEqual(message.metadata?.usage, { input: 1200, output: 40, cacheRead: 3000, cacheWrite: 0 });
  });

  it('renders custom messages, branch summaries and user bash runs as pi sends them', () => {
    const s = new Session();
    const custom = s.append({ type: 'custom_message', customType: 'notes', content: 'Remember the API freeze.', display: true });
    const summary = s.append({ type: 'branch_summary', fromId: 'x', summary: 'Tried approach A; it failed.' });
    const bash = s.message({ role: 'bashExecution', command: 'ls', output: 'a.py', exitCode: 2, cancelled: false });
    const hidden = s.message({ role: 'bashExecution', command: 'env', output: 'SECRET=1', exitCode: 0, cancelled: false, excludeFromContext: true });
    assert.equal(entryToWire(custom)?.content, 'Remember the API freeze.');
    assert.equal(entryToWire(custom)?.metadata?.customType, 'notes');
    assert.equal(
      entryToWire(summary)?.content,
      'The following is a summary of a branch that this conversation came back from:\n\n<summary>\nTried approach A; it failed.</summary>',
    );
    assert.equal(entryToWire(bash)?.content, 'Ran `ls`\n```\na.py\n```\n\nCommand exited with code 2');
    assert.equal(entryToWire(hidden), null, '!! commands stay out of the context');
    assert.equal(entryToWire({ type: 'compaction', id: 'c', parentId: null, timestamp: '', summary: 's' } as SessionEntry), null);
  });
});

describe('tool calls and their results', () => {
  it('puts each result right after its call and leaves out results without a call', () => {
    const s = new Session();
    s.user('go');
    s.assistant('', [{ id: 'c1', name: 'read', arguments: { path: 'a' } }, { id: 'c2', name: 'read', arguments: { path: 'b' } }], 'a1');
    s.result('c2', 'read', 'B', 'r2');
    s.result('c1', 'read', 'A', 'r1');
    s.result('ghost', 'read', '?', 'r9');
    s.assistant('done', [], 'a2');
    const { messages } = branchMessages(s.branch());
    assert.deepEqual(messages.map((m) => m.id), ['e01', 'a1', 'r1', 'r2', 'a2']);
  });

  it('gives a call answered by nothing before the next turn a stand-in result', () => {
    const s = new Session();
    s.user('go');
    s.assistant('trying', [{ id: 'c1', name: 'bash', arguments: { command: 'make' } }], 'a1');
    s.user('stop, do something else', 'u2');
    const { messages, heldFrom } = branchMessages(s.branch());
    assert.equal(heldFrom, s.branch().length);
    assert.deepEqual(messages.map((m) => m.id), ['e01', 'a1', 'a1:c1:no-result', 'u2']);
    const standIn = messages[2];
    assert.equal(standIn.content, NO_RESULT);
    assert.equal(standIn.tool_call_id, 'c1');
    assert.equal(standIn.metadata?.synthetic, true);
  });

  it('holds back a tool-calling message while its results may still come', () => {
    const s = new Session();
    s.user('go');
    s.assistant('', [{ id: 'c1', name: 'read', arguments: {} }, { id: 'c2', name: 'read', arguments: {} }], 'a1');
    s.result('c1', 'read', 'A', 'r1');
    const branch = s.branch();
    const { messages, heldFrom } = branchMessages(branch);
    assert.deepEqual(messages.map((m) => m.id), ['e01'], 'no stand-in is stored for c2: its result is on its way');
    assert.equal(branch[heldFrom].id, 'a1');
    s.result('c2', 'read', 'B', 'r2');
    assert.deepEqual(branchMessages(s.branch()).messages.map((m) => m.id), ['e01', 'a1', 'r1', 'r2']);
  });
});

describe('token estimates', () => {
  it('counts UTF-8 bytes over four, rounded up, as the sidecar does', () => {
    assert.equal(textTokens(''), 0);
    assert.equal(textTokens('abcd'), 1);
    assert.equal(textTokens('abcde'), 2);
    assert.equal(textTokens('é'), 1);
    assert.equal(textTokens('日本語'), 3, 'nine bytes');
  });

  it('adds four tokens of framing per message and per tool call', () => {
    assert.equal(wireTokens({ role: 'user', content: 'abcd' }), 5);
    const call = { id: 'c', type: 'function' as const, function: { name: 'read', arguments: '{}' } };
    assert.equal(wireTokens({ role: 'assistant', content: null, tool_calls: [call] }), 4 + 2 + 4);
    const user: AgentMessage = { role: 'user', content: [{ type: 'text', text: 'abcdefgh' }], timestamp: 1 };
    assert.equal(agentMessagesTokens([user, user]), 12);
  });
});
