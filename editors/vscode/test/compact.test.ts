import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { CancellationTokenSource, ResponseError } from 'vscode-jsonrpc';
import { DidCompactParams, ErrorCodes, Message, Methods, Usage } from '../src/protocol';
import { WorkDoneProgress } from '../src/rpc';
import { statusText } from '../src/status';
import { bigUserMessage, Sidecar, startSidecar } from './helpers';
import { FakeLlm, startFakeLlm } from './fakeLlm';

const OPTIONS = {
  contextWindow: 4000,
  compaction: { auto: false, maxTokens: -1, reserveTokens: 500, freshTail: 4 },
};

/** 24 alternating user/assistant messages of about 110 tokens each. */
function conversation(prefix: string): Message[] {
  return Array.from({ length: 24 }, (_, i) => ({
    ...bigUserMessage(`${prefix}${i}`, 110),
    role: i % 2 === 0 ? 'user' : 'assistant',
    content: `turn ${i} of ${prefix}: ` + 'we edited src/app.py and ran the tests again '.repeat(10),
  }));
}

/** Skips the suite's tests until the server answers `context/compact`. */
function servesCompact(sidecar: Sidecar): boolean {
  return sidecar.capabilities.methods.includes(Methods.CONTEXT_COMPACT);
}

describe('compaction with the deterministic summarizer', () => {
  let sidecar: Sidecar;
  before(async () => {
    sidecar = await startSidecar({ initializationOptions: OPTIONS });
  });
  after(async () => {
    assert.equal(await sidecar.close(), 0, sidecar.stderr());
  });

  it('compacts with $/progress on the workDoneToken, then pushes usage and didCompact', async (t) => {
    if (!servesCompact(sidecar)) {
      t.skip('the server does not answer context/compact yet');
      return;
    }
    const before = (await sidecar.requests.ingest('work', conversation('w'))).usage;
    const states: string[] = [];
    sidecar.on(Methods.CONTEXT_DID_CHANGE_USAGE, (u: Usage) => u.sessionId === 'work' && states.push(statusText(u)));
    const didCompact = sidecar.next<DidCompactParams>(Methods.CONTEXT_DID_COMPACT, (p) => p.sessionId === 'work');
    const progress: WorkDoneProgress[] = [];
    const result = await sidecar.requests.compact(
      { sessionId: 'work', mode: 'incremental', focus: 'the tests' },
      { onProgress: (p) => progress.push(p) },
    );
    assert.equal(result.compacted, true, JSON.stringify(result));
    assert.equal(result.tokensBefore, before.tokens);
    assert.ok(result.tokensAfter < result.tokensBefore, JSON.stringify(result));
    assert.ok(result.summaryIds.length > 0);
    assert.equal(result.usage.tokens, result.tokensAfter);

    assert.ok(progress.length >= 2, JSON.stringify(progress));
    assert.equal(progress[0].kind, 'begin');
    assert.equal(progress[progress.length - 1].kind, 'end');

    const done = await didCompact;
    assert.equal(done.trigger, 'manual');
    assert.deepEqual(done.summaryIds, result.summaryIds);
    await new Promise((resolve) => setTimeout(resolve, 100));
    assert.ok(states.some((s) => s.endsWith('compacting…')), `no compacting state among ${states.join(' | ')}`);
    assert.equal(states[states.length - 1], statusText(result.usage));

    const expansion = await sidecar.requests.expand('work', result.summaryIds[0]);
    assert.ok(expansion.items.length > 0);
  });

  it('answers compacted: false with a reason when there is nothing to compact', async (t) => {
    if (!servesCompact(sidecar)) {
      t.skip('the server does not answer context/compact yet');
      return;
    }
    await sidecar.requests.ingest('tiny', [bigUserMessage('t1', 20)]);
    const result = await sidecar.requests.compact({ sessionId: 'tiny' });
    assert.equal(result.compacted, false);
    assert.ok(result.reason && result.reason.length > 0);
  });
});

describe('compaction with an OpenAI-compatible summarizer', () => {
  let sidecar: Sidecar;
  let llm: FakeLlm;
  let hanging: FakeLlm;

  async function withLlm(baseUrl: string): Promise<Sidecar> {
    return startSidecar({
      initializationOptions: { ...OPTIONS, llm: { baseUrl, model: 'fake-model', apiKeyEnv: 'CTX_SIDECAR_TEST_KEY' } },
      env: { CTX_SIDECAR_TEST_KEY: 'sk-test' },
    });
  }

  before(async () => {
    llm = await startFakeLlm({ reply: 'Goal: ship the parser. Progress: tests pass.' });
    hanging = await startFakeLlm({ hang: true });
  });
  after(async () => {
    await llm.close();
    await hanging.close();
  });

  it('passes the focus on to the summarizer', async (t) => {
    sidecar = await withLlm(llm.baseUrl);
    try {
      if (!servesCompact(sidecar)) {
        t.skip('the server does not answer context/compact yet');
        return;
      }
      assert.equal(sidecar.capabilities.summarizer, 'openai');
      await sidecar.requests.ingest('focus', conversation('f'));
      const result = await sidecar.requests.compact({ sessionId: 'focus', focus: 'the parser error handling' });
      assert.equal(result.compacted, true, JSON.stringify(result));
      assert.ok(
        llm.requests.some((body) => JSON.stringify(body).includes('Additionally: the parser error handling')),
        JSON.stringify(llm.requests[0]).slice(0, 2000),
      );
    } finally {
      assert.equal(await sidecar.close(), 0, sidecar.stderr());
    }
  });

  it('cancels a running compaction with $/cancelRequest (-32800) and leaves the session as it was', async (t) => {
    sidecar = await withLlm(hanging.baseUrl);
    try {
      if (!servesCompact(sidecar)) {
        t.skip('the server does not answer context/compact yet');
        return;
      }
      const before = (await sidecar.requests.ingest('cancel', conversation('c'))).usage;
      const source = new CancellationTokenSource();
      const progress: WorkDoneProgress[] = [];
      const running = sidecar.requests.compact(
        { sessionId: 'cancel', mode: 'full' },
        { token: source.token, onProgress: (p) => progress.push(p) },
      );
      await hanging.firstRequest;
      source.cancel();
      await assert.rejects(running, (error: unknown) => {
        assert.ok(error instanceof ResponseError, String(error));
        assert.equal(error.code, ErrorCodes.REQUEST_CANCELLED);
        return true;
      });
      const after = await sidecar.requests.usage('cancel');
      assert.equal(after.tokens, before.tokens);
      assert.equal(after.summaries, 0);
      assert.notEqual(after.state, 'compacting');
      const stored = (await sidecar.requests.sessions()).find((s) => s.sessionId === 'cancel');
      assert.equal(stored?.summaries, 0);
      assert.equal(stored?.messages, 24);
    } finally {
      assert.equal(await sidecar.close(), 0, sidecar.stderr());
    }
  });
});
