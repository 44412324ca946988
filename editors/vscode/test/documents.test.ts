import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { renderExpansion, renderSessions } from '../src/documents';
import { Message, Methods } from '../src/protocol';
import { Sidecar, startSidecar } from './helpers';

const TOOL_OUTPUT = 'line of a long file listing\n'.repeat(120);

function toolExchange(n: number): Message[] {
  return [
    { role: 'user', content: `step ${n}: look at the files`, id: `u${n}` },
    {
      role: 'assistant',
      content: null,
      id: `a${n}`,
      tool_calls: [{ id: `call${n}`, type: 'function', function: { name: 'bash', arguments: '{"cmd": "ls -R"}' } }],
    },
    { role: 'tool', content: TOOL_OUTPUT, tool_call_id: `call${n}`, id: `t${n}` },
    { role: 'assistant', content: `done with step ${n}`, id: `d${n}` },
  ];
}

describe('read-only documents from the real sidecar', () => {
  let sidecar: Sidecar;
  before(async () => {
    sidecar = await startSidecar({
      initializationOptions: {
        contextWindow: 100000,
        compaction: { auto: false, maxTokens: -1, freshTail: 2 },
        prune: { protectTokens: 200, minimumTokens: 100 },
      },
    });
  });
  after(async () => {
    assert.equal(await sidecar.close(), 0, sidecar.stderr());
  });

  it('renders the full original of a pruned tool output from memory/expand', async () => {
    await sidecar.requests.ingest('docs', [...toolExchange(1), ...toolExchange(2), ...toolExchange(3)]);
    const assembled = await sidecar.connection.sendRequest<{ items: Array<{ id: string; pruned?: boolean }> }>(
      Methods.CONTEXT_ASSEMBLE,
      { sessionId: 'docs' },
    );
    const pruned = assembled.items.find((item) => item.pruned);
    assert.ok(pruned, `nothing was pruned: ${JSON.stringify(assembled.items)}`);
    const expansion = await sidecar.requests.expand('docs', pruned.id);
    const text = renderExpansion('docs', expansion);
    assert.match(text, new RegExp(`^# \\S+ ${pruned.id}$`, 'm'));
    assert.ok(text.includes(TOOL_OUTPUT.trim()), text.slice(0, 500));
    assert.match(text, /## \S+ tool \S+ \(result of call\d\)/);
  });

  it('lists sessions newest first, marking the selected one', async () => {
    const sessions = await sidecar.requests.sessions();
    const text = renderSessions(sessions, 'docs');
    assert.match(text, /\| ● \| `docs` \|/);
    assert.match(renderSessions([], undefined), /No sessions stored yet/);
  });
});
