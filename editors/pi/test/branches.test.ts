import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { sessionKey, storedKeys, unstoredFrom } from '../src/branches';
import type { AgentMessage } from '../src/pi';
import { branchMessages } from '../src/wire';
import { Session } from './entries';

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
