import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  agentMessagesTokens,
  branchMessages,
  entryToWire,
  firstKeptEntryId,
  NO_RESULT,
  sessionKey,
  SOURCE,
  storedKeys,
  summaryText,
  textTokens,
  toAgentMessages,
  unstoredFrom,
  wireTokens,
} from '../src/convert';
import type { AgentMessage, PiModel, SessionEntry } from '../src/pi';
import type { ContextItem, WireMessage } from '../src/protocol';
import { readSessionFile, Session } from './entries';
import { PI_FIXTURE } from './paths';

const MODEL: PiModel = { id: 'fake-model', provider: 'fake', api: 'openai-completions', contextWindow: 8000 };

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

describe('the sidecar session of a branch', () => {
  it("is pi's session id while the branch takes the first child at every fork", () => {
    const s = new Session('pi-1');
    s.user('one');
    s.assistant('two');
    assert.equal(sessionKey('pi-1', s.entries, s.branch()), 'pi-1');
  });

  it('is another session once the conversation was rewound and continued, and the old one when back on it', () => {
    const s = new Session('pi-1');
    s.user('one');
    const answer = s.assistant('two');
    s.user('three', 'u3');
    const oldLeaf = s.leaf;
    s.leaf = answer.id; // pi's /tree: back to the answer, then a new message
    s.user('three, differently', 'u3b');
    assert.equal(sessionKey('pi-1', s.entries, s.branch()), 'pi-1/u3b');
    s.assistant('four');
    assert.equal(sessionKey('pi-1', s.entries, s.branch()), 'pi-1/u3b', 'the same branch stays one session');
    s.leaf = oldLeaf;
    assert.equal(sessionKey('pi-1', s.entries, s.branch()), 'pi-1');
  });
});

describe("what pi hands over before writing it", () => {
  it('finds the messages at the end of the context that the branch does not hold yet', () => {
    const s = new Session();
    const u1 = s.user('one');
    const a1 = s.assistant('two');
    const branch = s.branch();
    const fresh: AgentMessage = { role: 'user', content: [{ type: 'text', text: 'three' }], timestamp: 99 };
    const context = [u1.message!, a1.message!, fresh];
    const stored = storedKeys(branch, branch.length);
    assert.equal(unstoredFrom(context, stored), 2);
    assert.equal(unstoredFrom(context.slice(0, 2), stored), 2, 'everything written: nothing is sent as pi has it');
  });

  it("stops at pi's own compaction summary and matches custom messages by their content", () => {
    const s = new Session();
    const custom = s.append({ type: 'custom_message', customType: 'notes', content: 'x', display: false });
    const branch = s.branch();
    const summary: AgentMessage = { role: 'compactionSummary', summary: 's', tokensBefore: 1, timestamp: 5 };
    const asPi: AgentMessage = { role: 'custom', customType: 'notes', content: 'x', display: false, timestamp: 12345 };
    assert.equal(unstoredFrom([summary], storedKeys(branch, 1)), 1);
    assert.equal(unstoredFrom([summary, asPi], storedKeys(branch, 1)), 2, `written as ${custom.id}`);
  });

  it('counts the held-back turn as not stored', () => {
    const s = new Session();
    const u = s.user('go');
    const a = s.assistant('', [{ id: 'c1', name: 'read', arguments: {} }]);
    const branch = s.branch();
    const { heldFrom } = branchMessages(branch);
    const result: AgentMessage = { role: 'toolResult', toolCallId: 'c1', toolName: 'read', content: [{ type: 'text', text: 'A' }], isError: false, timestamp: 7 };
    assert.equal(unstoredFrom([u.message!, a.message!, result], storedKeys(branch, heldFrom)), 1);
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

describe('the assembled context back to pi', () => {
  const s = new Session();
  const u = s.user('fix it');
  const a = s.assistant('reading', [{ id: 'c1', name: 'read', arguments: { path: 'x.py' } }], 'a1');
  const r = s.result('c1', 'read', 'x'.repeat(400), 'r1');
  const failed = s.message(
    { role: 'assistant', content: [{ type: 'text', text: 'half an answer' }], api: 'x', provider: 'y', model: 'z', usage: {}, stopReason: 'error', errorMessage: 'overloaded' },
    'a2',
  );
  const entries = new Map(s.entries.map((e) => [e.id, e]));

  it('gives back pi\'s own messages for its entries, a pruned result with the placeholder', () => {
    const wire: WireMessage[] = [
      { role: 'user', content: '<summary id="sum_1">earlier work</summary>' },
      { role: 'user', content: 'fix it' },
      { role: 'assistant', content: 'reading', tool_calls: [{ id: 'c1', type: 'function', function: { name: 'read', arguments: '{"path":"x.py"}' } }] },
      { role: 'tool', tool_call_id: 'c1', content: '[Old tool result content cleared] (id r1)' },
      { role: 'assistant', content: 'half an answer' },
    ];
    const items: ContextItem[] = [
      { kind: 'summary', id: 'sum_1', tokens: 10 },
      { kind: 'message', id: u.id, tokens: 5 },
      { kind: 'message', id: 'a1', tokens: 9 },
      { kind: 'message', id: 'r1', tokens: 12, pruned: true },
      { kind: 'message', id: 'a2', tokens: 6 },
    ];
    const back = toAgentMessages(wire, items, entries, MODEL);
    assert.deepEqual(back[0], { role: 'user', content: [{ type: 'text', text: '<summary id="sum_1">earlier work</summary>' }], timestamp: 0 });
    assert.deepEqual(back[1], u.message);
    assert.deepEqual(back[2], a.message);
    assert.deepEqual(back[3].content, [{ type: 'text', text: '[Old tool result content cleared] (id r1)' }]);
    assert.equal(back[3].toolCallId, 'c1');
    assert.equal((r.message!.content as Array<{ text: string }>)[0].text.length, 400, 'the entry itself is untouched');
    assert.equal(back[4].stopReason, 'stop', 'a failed turn the sidecar kept is sent as a finished one');
    assert.equal(failed.message!.stopReason, 'error');
  });

  it('makes pi messages for what the branch has no entry for: stand-ins and other clients\' messages', () => {
    const wire: WireMessage[] = [
      { role: 'assistant', content: null, tool_calls: [{ id: 'k1', type: 'function', function: { name: 'bash', arguments: '{"command":"ls"}' } }] },
      { role: 'tool', tool_call_id: 'k1', content: NO_RESULT },
      { role: 'user', content: [{ type: 'text', text: 'look' }, { type: 'image_url', image_url: { url: 'data:image/jpeg;base64,QUJD' } }] },
    ];
    const items: ContextItem[] = [
      { kind: 'message', id: 'elsewhere-1', tokens: 1 },
      { kind: 'message', id: 'elsewhere-1:k1:no-result', tokens: 1 },
      { kind: 'message', id: 'elsewhere-2', tokens: 1 },
    ];
    const back = toAgentMessages(wire, items, entries, MODEL);
    assert.equal(back[0].role, 'assistant');
    assert.deepEqual(back[0].content, [{ type: 'toolCall', id: 'k1', name: 'bash', arguments: { command: 'ls' } }]);
    assert.equal(back[0].stopReason, 'toolUse');
    assert.deepEqual([back[0].api, back[0].provider, back[0].model], ['openai-completions', 'fake', 'fake-model']);
    assert.deepEqual(back[1], { role: 'toolResult', toolCallId: 'k1', toolName: 'bash', content: [{ type: 'text', text: NO_RESULT }], isError: false, timestamp: 0 });
    assert.deepEqual(back[2].content, [{ type: 'text', text: 'look' }, { type: 'image', mimeType: 'image/jpeg', data: 'QUJD' }]);
  });

  it("names the summaries and the first message kept after them for pi's compaction entry", () => {
    const wire: WireMessage[] = [
      { role: 'user', content: 'S1' },
      { role: 'user', content: 'S2' },
      { role: 'tool', tool_call_id: 'c1', content: 'x' },
    ];
    const items: ContextItem[] = [
      { kind: 'summary', id: 'sum_1', tokens: 1 },
      { kind: 'summary', id: 'sum_2', tokens: 1 },
      { kind: 'message', id: 'r1', tokens: 1 },
    ];
    assert.equal(summaryText(wire, items), 'S1\n\nS2');
    assert.equal(firstKeptEntryId(items, s.branch()), 'a1', 'a kept result is kept with its call');
    assert.equal(firstKeptEntryId([items[0], { kind: 'message', id: u.id, tokens: 1 }], s.branch()), u.id);
    assert.equal(firstKeptEntryId([{ kind: 'message', id: u.id, tokens: 1 }], s.branch()), undefined, 'no summary');
    assert.equal(firstKeptEntryId([items[0], { kind: 'message', id: 'not-here', tokens: 1 }], s.branch()), undefined);
  });
});
