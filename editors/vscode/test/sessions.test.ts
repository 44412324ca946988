import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { ResponseError } from 'vscode-jsonrpc';
import { ErrorCodes, Methods, SessionInfo, Usage } from '../src/protocol';
import { mostRecentSession, SessionSelection } from '../src/sessions';
import { bigUserMessage, Sidecar, startSidecar } from './helpers';

function info(sessionId: string, updatedAt: string): SessionInfo {
  return { sessionId, messages: 1, summaries: 0, tokens: 10, updatedAt };
}

describe('session selection', () => {
  it('defaults to the most recently updated session', () => {
    const sessions = [
      info('a', '2025-01-01T10:00:00.000Z'),
      info('b', '2025-01-02T09:00:00.000Z'),
      info('c', '2025-01-01T23:00:00+00:00'),
    ];
    assert.equal(mostRecentSession(sessions)?.sessionId, 'b');
    assert.equal(mostRecentSession([]), undefined);
  });

  it('keeps a pinned session while others change, and follows again when unpinned', () => {
    const selection = new SessionSelection();
    const usage = (sessionId: string, percent: number) => ({ sessionId, percent, state: 'ok' }) as Usage;
    selection.update(usage('a', 10));
    assert.equal(selection.sessionId, 'a');
    selection.pin('b');
    selection.update(usage('a', 20));
    assert.equal(selection.sessionId, 'b');
    assert.equal(selection.usage?.percent, undefined);
    selection.adoptDefault([info('a', '2030-01-01T00:00:00Z')]);
    assert.equal(selection.sessionId, 'b');
    selection.pin(undefined);
    selection.update(usage('a', 30));
    assert.equal(selection.sessionId, 'a');
    assert.equal(selection.usage?.percent, 30);
  });
});

describe('usage replies and notifications', () => {
  it('drops a reply that a notification overtook', () => {
    const selection = new SessionSelection();
    const usage = (state: Usage['state'], tokens: number) => ({ sessionId: 's', state, tokens }) as Usage;
    selection.notified(usage('ok', 100));
    const version = selection.version('s');
    selection.notified(usage('ok', 50));
    selection.updateFromReply(usage('compacting', 100), version);
    assert.equal(selection.usage?.tokens, 50);
    selection.updateFromReply(usage('ok', 60), selection.version('s'));
    assert.equal(selection.usage?.tokens, 60);
  });
});

describe('sessions from the real sidecar', () => {
  let sidecar: Sidecar;
  before(async () => {
    sidecar = await startSidecar();
  });
  after(async () => {
    assert.equal(await sidecar.close(), 0, sidecar.stderr());
  });

  it('picks the session ingested last, and reports usage for a pinned one', async () => {
    await sidecar.requests.ingest('older', [bigUserMessage('o1', 100)]);
    await new Promise((resolve) => setTimeout(resolve, 20));
    await sidecar.requests.ingest('newer', [bigUserMessage('n1', 200)]);
    const sessions = await sidecar.requests.sessions();
    assert.deepEqual(sessions.map((s) => s.sessionId).sort(), ['newer', 'older']);

    const selection = new SessionSelection();
    selection.adoptDefault(sessions);
    assert.equal(selection.sessionId, 'newer');

    selection.pin('older');
    selection.update(await sidecar.requests.usage('older'));
    assert.equal(selection.usage?.sessionId, 'older');
    assert.equal(selection.usage?.messages, 1);
  });

  it('gets -32001 for a session that has no messages yet', async () => {
    await assert.rejects(sidecar.requests.usage('not-yet'), (error: unknown) => {
      assert.ok(error instanceof ResponseError);
      assert.equal(error.code, ErrorCodes.UNKNOWN_SESSION);
      return true;
    });
  });

  it('forgets a deleted session', async () => {
    const selection = new SessionSelection();
    selection.update((await sidecar.requests.ingest('doomed', [bigUserMessage('d1', 50)])).usage);
    assert.equal(selection.sessionId, 'doomed');
    const deleted = await sidecar.connection.sendRequest<{ deleted: boolean }>(Methods.MEMORY_DELETE_SESSION, {
      sessionId: 'doomed',
    });
    assert.equal(deleted.deleted, true);
    selection.forget('doomed');
    assert.equal(selection.sessionId, undefined);
    const left = (await sidecar.requests.sessions()).map((s) => s.sessionId);
    assert.ok(!left.includes('doomed'));
  });
});
