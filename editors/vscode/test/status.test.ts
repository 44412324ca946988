import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Methods, Usage } from '../src/protocol';
import { SessionSelection } from '../src/sessions';
import { cacheText, formatStatus, shortHint, statusText, statusTooltip } from '../src/status';
import { bigUserMessage, Sidecar, startSidecar } from './helpers';

function usage(state: Usage['state'], percent: number, hint?: string): Usage {
  return {
    sessionId: 's',
    tokens: Math.round(percent * 40),
    contextWindow: 4000,
    percent,
    threshold: 3000,
    state,
    hint,
    source: 'estimate',
    messages: 3,
    summaries: 0,
  };
}

describe('status formatting', () => {
  it('shows the percent alone when all is well', () => {
    assert.equal(statusText(usage('ok', 12.4)), 'ctx 12%');
    assert.equal(formatStatus(usage('ok', 12.4)).look, 'normal');
  });

  it('says what to do in VS Code terms for suggest, compact and overflow, not the chat command of the hint', () => {
    const suggest = usage('suggest', 72.3, 'Context 72% full: type /compact to free up context');
    assert.equal(statusText(suggest), 'ctx 72% suggest: click to compact and free up context');
    assert.equal(shortHint(usage('compact', 80, undefined)), 'click to compact now');
    assert.equal(statusText(usage('overflow', 104.6, 'over: type /compact or else')),
      'ctx 105% overflow: click to compact, or older messages are dropped');
    assert.equal(shortHint(usage('ok', 10, undefined)), undefined);
    assert.doesNotMatch(statusTooltip(suggest, 's'), /\/compact/);
    assert.match(statusTooltip(suggest, 's'), /Context Sidecar: Compact Context…/);
  });

  it('gives compacting and overflow their own icon and background', () => {
    const compacting = formatStatus(usage('compacting', 80, 'Compacting context…'));
    assert.equal(compacting.plain, 'ctx 80% compacting…');
    assert.match(compacting.text, /^\$\(sync~spin\) /);
    assert.equal(compacting.look, 'warning');
    const overflow = formatStatus(usage('overflow', 120));
    assert.match(overflow.text, /^\$\(error\) /);
    assert.equal(overflow.look, 'error');
  });

  it('shows the prompt cache hit rate in the usage detail when the server sends it', () => {
    const both = { ...usage('ok', 12), cacheHitRate: 0.625, cacheHitRateSmoothed: 0.5809 };
    assert.equal(cacheText(both), 'Prompt cache hit rate: 63% last call, 58% smoothed');
    assert.deepEqual(statusTooltip(both, 's').split('\n').slice(-1), ['Prompt cache hit rate: 63% last call, 58% smoothed']);
    const smoothedOnly = { ...usage('ok', 12), cacheHitRate: null, cacheHitRateSmoothed: 0 };
    assert.equal(cacheText(smoothedOnly), 'Prompt cache hit rate: 0% smoothed');
    const none = { ...usage('suggest', 72, 'Context 72% full: type /compact'), cacheHitRate: null, cacheHitRateSmoothed: null };
    assert.equal(cacheText(none), undefined);
    assert.doesNotMatch(statusTooltip(none, 's'), /Prompt cache/);
    assert.doesNotMatch(statusTooltip(usage('ok', 12), 's'), /Prompt cache/);
  });

  it('says when there is no session yet', () => {
    assert.equal(formatStatus(undefined).plain, 'ctx –');
    assert.match(formatStatus(undefined, 'agent-1').tooltip, /no usage yet for session agent-1/);
  });
});

describe('status from the real sidecar', () => {
  let sidecar: Sidecar;
  before(async () => {
    sidecar = await startSidecar();
  });
  after(async () => {
    assert.equal(await sidecar.close(), 0, sidecar.stderr());
  });

  it('moves through ok, suggest, compact and overflow as messages are ingested', async () => {
    const selection = new SessionSelection();
    const texts: string[] = [];
    selection.onDidChange((u) => texts.push(statusText(u)));
    sidecar.on(Methods.CONTEXT_DID_CHANGE_USAGE, (u: Usage) => selection.notified(u));

    const steps: Array<[number, Usage['state'], RegExp]> = [
      [1000, 'ok', /^ctx 2\d%$/],
      [1900, 'suggest', /^ctx 7\d% suggest: click to compact and free up context$/],
      [300, 'compact', /^ctx [78]\d% compact: click to compact now$/],
      [1200, 'overflow', /^ctx 1\d\d% overflow: click to compact, or older messages are dropped$/],
    ];
    let n = 0;
    for (const [tokens, state, text] of steps) {
      const notified = sidecar.next<Usage>(Methods.CONTEXT_DID_CHANGE_USAGE, (u) => u.sessionId === 'status');
      const result = await sidecar.requests.ingest('status', [bigUserMessage(`m${n++}`, tokens)]);
      const pushed = await notified;
      assert.equal(pushed.state, state, JSON.stringify(pushed));
      assert.deepEqual(pushed, result.usage);
      assert.equal(selection.sessionId, 'status');
      assert.match(texts[texts.length - 1], text);
    }
    assert.equal(formatStatus(selection.usage).look, 'error');
  });

  it('shows the cache hit rate of a reported call once the server computes it', async () => {
    await sidecar.requests.ingest('cache', [bigUserMessage('c0', 500)]);
    // 800 of 1,000 input tokens read from the cache: a hit rate of 80%.
    await sidecar.connection.sendNotification(Methods.CONTEXT_REPORT_USAGE, {
      sessionId: 'cache', inputTokens: 100, outputTokens: 20, cacheReadTokens: 800, cacheWriteTokens: 100,
    });
    const reported = await sidecar.requests.usage('cache');
    const tooltip = statusTooltip(reported, 'cache');
    if (typeof reported.cacheHitRate === 'number') {
      assert.equal(reported.cacheHitRate, 0.8);
      assert.match(tooltip, /^Prompt cache hit rate: 80% last call/m);
    } else {
      assert.doesNotMatch(tooltip, /Prompt cache/, 'a server without the figures gets no cache line');
    }
  });
});
