import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { Methods, Usage } from '../src/protocol';
import { EXTENSION_SETTING_KEYS, PROTOCOL_SETTING_KEYS, protocolSettings, serverLaunch } from '../src/settings';
import { bigUserMessage, Sidecar, startSidecar } from './helpers';
import { EXTENSION_ROOT } from './paths';

const manifest = JSON.parse(readFileSync(resolve(EXTENSION_ROOT, 'package.json'), 'utf8'));
const properties: Record<string, { default: unknown; markdownDescription?: string; description?: string }> =
  manifest.contributes.configuration.properties;

describe('settings', () => {
  it('nests explicitly set values and leaves the rest to the server', () => {
    const set: Record<string, unknown> = { contextWindow: 4000, 'compaction.maxTokens': -1, 'llm.model': null };
    assert.deepEqual(protocolSettings((key) => set[key]), {
      contextWindow: 4000,
      compaction: { maxTokens: -1 },
      llm: { model: null },
    });
    assert.deepEqual(protocolSettings(() => undefined), {});
  });

  it('launches context-sidecar from PATH unless told otherwise', () => {
    assert.deepEqual(serverLaunch(undefined, undefined), { command: 'context-sidecar', args: [] });
    assert.deepEqual(serverLaunch(' /venv/bin/context-sidecar ', ['-v', 3]), {
      command: '/venv/bin/context-sidecar',
      args: ['-v'],
    });
  });

  it('contributes exactly the protocol settings plus the extension own ones, each described', () => {
    const expected = [...EXTENSION_SETTING_KEYS, ...PROTOCOL_SETTING_KEYS].map((k) => `contextSidecar.${k}`).sort();
    assert.deepEqual(Object.keys(properties).sort(), expected);
    for (const [key, entry] of Object.entries(properties)) {
      assert.ok((entry.markdownDescription ?? entry.description ?? '').length > 20, `${key} needs a description`);
    }
  });
});

describe('settings with the real sidecar', () => {
  let sidecar: Sidecar;
  before(async () => {
    const set: Record<string, unknown> = {
      contextWindow: 4000,
      'compaction.auto': false,
      'compaction.maxTokens': -1,
      'compaction.reserveTokens': 500,
      'prune.protectedTools': ['skill', 'read'],
      'llm.model': null,
    };
    sidecar = await startSidecar({ initializationOptions: protocolSettings((key) => set[key]) });
  });
  after(async () => {
    assert.equal(await sidecar.close(), 0, sidecar.stderr());
  });

  it('takes them as initializationOptions without complaint', async () => {
    const result = await sidecar.requests.ingest('cfg', [bigUserMessage('c1', 2000)]);
    assert.equal(result.usage.contextWindow, 4000);
    assert.equal(result.usage.threshold, 3000);
    assert.deepEqual(
      sidecar.notifications.filter((n) => n.method === 'window/showMessage'),
      [],
      'the server complained about a forwarded setting',
    );
  });

  it('pushes new usage after workspace/didChangeConfiguration', async () => {
    const pushed = sidecar.next<Usage>(Methods.CONTEXT_DID_CHANGE_USAGE, (u) => u.contextWindow === 8000);
    await sidecar.connection.sendNotification('workspace/didChangeConfiguration', {
      settings: { contextSidecar: protocolSettings((key) => ({ contextWindow: 8000 })[key]) },
    });
    const usage = await pushed;
    assert.equal(usage.sessionId, 'cfg');
    assert.equal(usage.percent, Math.round((1000 * usage.tokens) / 8000) / 10);
  });
});
