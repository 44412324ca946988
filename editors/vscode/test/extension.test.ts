import assert from 'node:assert/strict';
import { chmodSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import Module from 'node:module';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { ContextSidecarApi } from '../src/api';
import { CompactResult, Methods, Usage } from '../src/protocol';
import { startFakeLlm } from './fakeLlm';
import { createFakeVscode, FakeVscode } from './fakeVscode';
import { bigUserMessage, sidecarCommand, until } from './helpers';
import { EXTENSION_ROOT } from './paths';

/** Pids of live processes whose command line contains `marker` (the test's unique database path). */
function serverPids(marker: string): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) {
      continue;
    }
    try {
      const argv = readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0');
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      if (argv.includes(marker) && !argv[0].endsWith('sh') && !/\) Z /.test(stat)) {
        pids.push(Number(entry));
      }
    } catch {
      // The process ended while we looked.
    }
  }
  return pids;
}

/** Retries `request` until the (re)started server answers it. */
async function answered<T>(request: () => Promise<T>, timeoutMs = 10000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      return await request();
    } catch (error) {
      if (Date.now() > deadline) {
        throw error;
      }
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}

describe('the bundled extension in a stand-in VS Code', () => {
  let vscode: FakeVscode;
  let extension: { activate(context: unknown): Promise<ContextSidecarApi>; deactivate(): Promise<void> };
  let api: ContextSidecarApi;
  let dir: string;
  let db: string;
  let exits: string;
  const exitCodes = () => (existsSync(exits) ? readFileSync(exits, 'utf8').trim().split('\n') : []);
  const originalLoad = (Module as any)._load;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'ctx-sidecar-extension-'));
    // CONTEXT_SIDECAR_VSCODE_DB (editors/run-tests.sh: a fresh team database's URL): these tests on that database.
    db = process.env.CONTEXT_SIDECAR_VSCODE_DB || join(dir, 'memory.duckdb');
    exits = join(dir, 'exits');
    // Records each server's exit code, which vscode-languageclient does not expose.
    const wrapper = join(dir, 'sidecar.sh');
    writeFileSync(wrapper, `#!/bin/sh\n"$@"\necho $? >> '${exits}'\n`);
    chmodSync(wrapper, 0o755);
    vscode = createFakeVscode({
      'contextSidecar.serverCommand': wrapper,
      'contextSidecar.serverArgs': [...sidecarCommand(), '--db', db, '--no-share'],  // its own process: these tests kill it
      'contextSidecar.contextWindow': 4000,
      'contextSidecar.compaction.auto': false,
      'contextSidecar.compaction.maxTokens': -1,
      'contextSidecar.compaction.reserveTokens': 500,
      'contextSidecar.compaction.freshTail': 4,
    });
    (Module as any)._load = function (request: string, ...rest: unknown[]) {
      return request === 'vscode' ? vscode.module : originalLoad.call(this, request, ...rest);
    };
    extension = require(resolve(EXTENSION_ROOT, 'out', 'extension.js'));
    api = await extension.activate({ subscriptions: [] });
  });

  after(async () => {
    (Module as any)._load = originalLoad;
    for (const pid of serverPids(db)) {
      process.kill(pid, 'SIGKILL');
    }
    rmSync(dir, { recursive: true, force: true });
  });

  const status = () => vscode.statusItems[0];

  it('activates, starts the server and shows an empty status', async () => {
    assert.equal(vscode.statusItems.length, 1);
    assert.equal(status().visible, true);
    assert.equal(status().text, '$(pulse) ctx –');
    assert.equal(serverPids(db).length, 1, `one server on ${db}`);
    for (const id of ['compact', 'showUsage', 'listSessions', 'expandSummary', 'selectSession', 'restart']) {
      assert.ok(vscode.commands.has(`contextSidecar.${id}`), id);
    }
    assert.deepEqual(vscode.messages.filter((m) => m.level === 'error'), []);
  });

  it('shows usage pushed after an agent ingests through the API, with hint and background', async () => {
    await api.sendRequest(Methods.MEMORY_INGEST, { sessionId: 'agent', messages: [bigUserMessage('a1', 2900)] });
    await until('the suggest status', () => status().text.includes('suggest'));
    assert.match(status().text, /^\$\(lightbulb\) ctx 7\d% suggest: click to compact and free up context$/);
    assert.equal(status().backgroundColor, undefined);
    assert.equal(status().command, 'contextSidecar.compact');
    assert.equal(api.getSession(), 'agent');
    assert.equal(api.getUsage()?.state, 'suggest');

    await api.sendRequest(Methods.MEMORY_INGEST, { sessionId: 'agent', messages: [bigUserMessage('a2', 1500)] });
    await until('the overflow status', () => status().text.includes('overflow'));
    assert.match(status().text, /^\$\(error\) ctx 1\d\d% overflow/);
    assert.equal(status().backgroundColor?.id, 'statusBarItem.errorBackground');
  });

  it('keeps a session pinned through the API', async () => {
    await api.setSession('other');
    assert.equal(status().text, '$(pulse) ctx –');
    await api.sendRequest(Methods.MEMORY_INGEST, { sessionId: 'agent', messages: [bigUserMessage('a3', 10)] });
    await api.sendRequest(Methods.MEMORY_INGEST, { sessionId: 'other', messages: [bigUserMessage('o1', 400)] });
    await until('the pinned usage', () => api.getUsage()?.sessionId === 'other');
    assert.equal(status().text, '$(pulse) ctx 10%');
    await api.setSession(undefined);
    assert.equal(api.getSession(), 'other');
  });

  it('sends changed settings and shows the new usage', async () => {
    vscode.settings['contextSidecar.contextWindow'] = 8000;
    vscode.fireConfigurationChange('contextSidecar.contextWindow');
    // Usage of every session is pushed, the most recently updated ('other') last.
    await until('usage in the new window', () => api.getSession() === 'other' && api.getUsage()?.contextWindow === 8000);
    assert.equal(status().text, '$(pulse) ctx 5%');
    assert.deepEqual(vscode.messages.filter((m) => m.level !== 'status'), []);
  });

  it('lists sessions and expands an id into read-only documents', async () => {
    await vscode.commands.get('contextSidecar.listSessions')!();
    const list = vscode.documents.get('context-sidecar:/sessions.md');
    assert.match(list ?? '', /\| ● \| `other` \|/);
    await vscode.commands.get('contextSidecar.expandSummary')!('no-such-id');
    assert.match(vscode.messages[vscode.messages.length - 1].text, /\(-32004\)/);
  });

  it('compacts with a focus from the input box, reporting progress', async (t) => {
    const usage = await api.sendRequest<Usage>(Methods.CONTEXT_USAGE, { sessionId: 'agent' });
    await api.setSession('agent');
    const caps = await api.sendRequest<unknown>(Methods.MEMORY_SESSIONS, {});
    assert.ok(caps);
    if (!(await servesCompact(api))) {
      t.skip('the server does not answer context/compact yet');
      return;
    }
    const turns = Array.from({ length: 24 }, (_, i) => ({ ...bigUserMessage(`t${i}`, 100), role: i % 2 ? 'assistant' : 'user' }));
    await api.sendRequest(Methods.MEMORY_INGEST, { sessionId: 'agent', messages: turns });
    vscode.inputs.push('the parser');
    const result = (await vscode.commands.get('contextSidecar.compact')!()) as CompactResult;
    assert.equal(result.compacted, true, JSON.stringify(result));
    assert.ok(result.tokensAfter < result.tokensBefore);
    assert.ok(result.tokensBefore > usage.tokens);
    assert.equal(vscode.progress[vscode.progress.length - 1].title, 'Compacting context');
    assert.match(vscode.messages[vscode.messages.length - 1].text, /^Context compacted: /);
    await until('the usage after compaction', () => api.getUsage()?.tokens === result.tokensAfter);
  });

  it('does nothing when the focus input box is dismissed', async () => {
    vscode.inputs.push(undefined);
    const before = vscode.progress.length;
    assert.equal(await vscode.commands.get('contextSidecar.compact')!(), undefined);
    assert.equal(vscode.progress.length, before);
  });

  it('cancels a compaction from the progress notification, leaving the session as it was', async (t) => {
    if (!(await servesCompact(api))) {
      t.skip('the server does not answer context/compact yet');
      return;
    }
    const llm = await startFakeLlm({ hang: true });
    try {
      process.env.CTX_SIDECAR_TEST_KEY = 'sk-test';
      Object.assign(vscode.settings, {
        'contextSidecar.llm.baseUrl': llm.baseUrl,
        'contextSidecar.llm.model': 'fake-model',
        'contextSidecar.llm.apiKeyEnv': 'CTX_SIDECAR_TEST_KEY',
      });
      await vscode.commands.get('contextSidecar.restart')!();
      await until('usage after the restart', () => api.getUsage() !== undefined);
      const turns = Array.from({ length: 24 }, (_, i) => ({ ...bigUserMessage(`c${i}`, 100), role: i % 2 ? 'assistant' : 'user' }));
      await api.sendRequest(Methods.MEMORY_INGEST, { sessionId: 'cancel', messages: turns });
      await api.setSession('cancel');
      const before = await api.sendRequest<Usage>(Methods.CONTEXT_USAGE, { sessionId: 'cancel' });
      vscode.inputs.push('');
      const running = vscode.commands.get('contextSidecar.compact')!();
      await llm.firstRequest;
      vscode.progress[vscode.progress.length - 1].cancel.cancel();
      assert.equal(await running, undefined);
      assert.equal(vscode.messages[vscode.messages.length - 1].text, 'Compaction cancelled; the session is unchanged.');
      const after = await api.sendRequest<Usage>(Methods.CONTEXT_USAGE, { sessionId: 'cancel' });
      assert.equal(after.tokens, before.tokens);
      assert.equal(after.summaries, 0);
    } finally {
      for (const key of ['baseUrl', 'model', 'apiKeyEnv']) {
        delete vscode.settings[`contextSidecar.llm.${key}`];
      }
      await llm.close();
    }
  });

  it('restarts the server on request, shutting the old one down cleanly', async () => {
    const before = exitCodes().length;
    await vscode.commands.get('contextSidecar.restart')!();
    // The new server can answer initialize before the old process has finished exiting.
    await until('the old server exit', () => exitCodes().length > before);
    assert.deepEqual(exitCodes().slice(before), ['0']);
    await until('usage after the restart', () => api.getUsage() !== undefined);
    const usage = await api.sendRequest<Usage>(Methods.CONTEXT_USAGE, { sessionId: 'agent' });
    assert.equal(usage.sessionId, 'agent');
  });

  it('shows new usage after a settings change for a session the server has not touched since it started', async () => {
    // The server restarted by the previous test has only been asked for 'agent', never ingested into.
    await api.setSession('agent');
    const before = api.getUsage()!;
    assert.equal(before.sessionId, 'agent');
    const wider = before.contextWindow * 2;
    vscode.settings['contextSidecar.contextWindow'] = wider;
    vscode.fireConfigurationChange('contextSidecar.contextWindow');
    await until('usage in the new window', () => api.getUsage()?.contextWindow === wider);
    const percent = Math.round(Math.round((1000 * before.tokens) / wider) / 10);
    assert.match(status().text, new RegExp(` ctx ${percent}%( |$)`));
    vscode.settings['contextSidecar.contextWindow'] = before.contextWindow;
    vscode.fireConfigurationChange('contextSidecar.contextWindow');
    await until('usage in the old window', () => api.getUsage()?.contextWindow === before.contextWindow);
  });

  it('restarts the server when a storage setting changes, which the server reads only at start', async () => {
    const [old] = await until('a running server', () => serverPids(db));
    const before = exitCodes().length;
    const errors = () => vscode.messages.filter((m) => m.level === 'error').length;
    const errorsBefore = errors();
    vscode.settings['contextSidecar.storage.memoryLimit'] = '256MB';
    vscode.fireConfigurationChange('contextSidecar.storage.memoryLimit');
    await until('the old server exit', () => exitCodes().length > before);
    assert.deepEqual(exitCodes().slice(before), ['0']);
    const [fresh] = await until('the new server', () => serverPids(db));
    assert.notEqual(fresh, old);
    const usage = await answered(() => api.sendRequest<Usage>(Methods.CONTEXT_USAGE, { sessionId: 'agent' }));
    assert.equal(usage.sessionId, 'agent');
    assert.equal(errors(), errorsBefore);
  });

  it('restarts a crashed server four times, then gives up with a message', async () => {
    for (let crash = 1; crash <= 5; crash++) {
      const [pid] = await until('a running server', () => serverPids(db));
      process.kill(pid, 'SIGKILL');
      if (crash <= 4) {
        await until(`the restart after crash ${crash}`, () => {
          const now = serverPids(db);
          return now.length === 1 && now[0] !== pid;
        });
        const usage = await answered(() => api.sendRequest<Usage>(Methods.CONTEXT_USAGE, { sessionId: 'agent' }));
        assert.equal(usage.sessionId, 'agent');
      }
    }
    const gaveUp = await until('the message', () =>
      vscode.messages.find((m) => m.level === 'error' && m.text.includes('will not be restarted')),
    );
    assert.match(gaveUp!.text, /Restart Server/);
    assert.deepEqual(serverPids(db), []);
  });

  it('starts again on request after giving up, and deactivates with shutdown and exit', async () => {
    await vscode.commands.get('contextSidecar.restart')!();
    await until('a running server', () => serverPids(db).length === 1);
    await until('usage', () => api.getUsage() !== undefined);
    const before = exitCodes().length;
    await extension.deactivate();
    await until('the exit', () => exitCodes().length > before);
    assert.deepEqual(exitCodes().slice(before), ['0']);
    assert.deepEqual(serverPids(db), []);
  });
});

async function servesCompact(api: ContextSidecarApi): Promise<boolean> {
  try {
    await api.sendRequest(Methods.CONTEXT_COMPACT, { sessionId: 'no-such-session' });
  } catch (error: any) {
    return error?.code !== -32601;
  }
  return true;
}
