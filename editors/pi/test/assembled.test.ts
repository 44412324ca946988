import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { firstKeptEntryId, summaryText, toAgentMessages } from '../src/assembled';
import type { PiModel } from '../src/pi';
import type { ContextItem, WireMessage } from '../src/protocol';
import { NO_RESULT } from '../src/wire';
import { Session } from './entries';

const MODEL: PiModel = { id: 'fake-model', provider: 'fake', api: 'openai-completions', contextWindow: 8000 };

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
