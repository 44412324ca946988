/**
 * The extension follows the sessions of its workspace folder: an agent on the same database (a
 * second server process, which relays to the host the extension's server started) ingests, and
 * the status bar shows that session live; compacting from the editor compacts it.
 */
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import Module from 'node:module';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { ContextSidecarApi } from '../src/api';
import { CompactResult, Methods, Usage } from '../src/protocol';
import { statusText } from '../src/status';
import { createFakeVscode, FakeVscode } from './fakeVscode';
import { bigUserMessage, Sidecar, sidecarCommand, startSidecar, until } from './helpers';
import { EXTENSION_ROOT } from './paths';

describe('following an agent session of the workspace', () => {
  let vscode: FakeVscode;
  let extension: { activate(context: unknown): Promise<ContextSidecarApi>; deactivate(): Promise<void> };
  let api: ContextSidecarApi;
  let agent: Sidecar | undefined;
  let dir: string;
  let db: string;
  let workspace: string;
  const originalLoad = (Module as any)._load;
  const status = () => vscode.statusItems[0];

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'ctx-sidecar-follow-'));
    db = join(dir, 'memory.duckdb');
    workspace = join(dir, 'project');
    mkdirSync(workspace);
    const [command, ...args] = sidecarCommand();
    vscode = createFakeVscode({
      'contextSidecar.serverCommand': command,
      'contextSidecar.serverArgs': [...args, '--db', db],
      'contextSidecar.contextWindow': 4000,
      'contextSidecar.compaction.auto': false,
      'contextSidecar.compaction.maxTokens': -1,
      'contextSidecar.compaction.reserveTokens': 500,
      'contextSidecar.compaction.freshTail': 4,
    });
    vscode.module.workspace.workspaceFolders = [{ uri: vscode.module.Uri.file(workspace), name: 'project', index: 0 }];
    (Module as any)._load = function (request: string, ...rest: unknown[]) {
      return request === 'vscode' ? vscode.module : originalLoad.call(this, request, ...rest);
    };
    extension = require(resolve(EXTENSION_ROOT, 'out', 'extension.js'));
    api = await extension.activate({ subscriptions: [] });
    // A session of another folder in the same database, newer than any of the agent's until it ingests.
    const elsewhere = await startSidecar({ db, cwd: dir });
    await elsewhere.requests.ingest('elsewhere', [bigUserMessage('e1', 100)]);
    assert.equal(await elsewhere.close(), 0, elsewhere.stderr());
  });

  after(async () => {
    (Module as any)._load = originalLoad;
    await agent?.close();
    await extension.deactivate();
    rmSync(dir, { recursive: true, force: true });
  });

  it('shows the agent session after each of its ingests, and not one of another folder', async () => {
    assert.equal(status().text, '$(pulse) ctx –');
    agent = await startSidecar({ db, cwd: workspace });
    const turns = Array.from({ length: 24 }, (_, i) => ({ ...bigUserMessage(`t${i}`, 100), role: (i % 2 ? 'assistant' : 'user') as 'assistant' | 'user' }));
    const first = (await agent.requests.ingest('agent-1', turns)).usage;
    await until('the agent usage', () => api.getUsage()?.tokens === first.tokens);
    assert.equal(api.getSession(), 'agent-1');
    assert.equal(status().text, `$(pulse) ${statusText(first)}`);

    const second = (await agent.requests.ingest('agent-1', [bigUserMessage('a-more', 2000)])).usage;
    await until('the overflow after the second ingest', () => api.getUsage()?.tokens === second.tokens);
    assert.match(status().text, /^\$\(error\) ctx 1\d\d% overflow/);
    const listed = await api.sendRequest<{ sessions: Array<{ sessionId: string; workspace?: string }> }>(
      Methods.MEMORY_SESSIONS,
      { workspace },
    );
    assert.deepEqual(listed.sessions.map((s) => s.sessionId), ['agent-1']);
  });

  it('compacts the followed session from the editor', async () => {
    const before = await agent!.requests.usage('agent-1');
    vscode.inputs.push('');
    const result = (await vscode.commands.get('contextSidecar.compact')!()) as CompactResult;
    assert.equal(result.compacted, true, JSON.stringify(result));
    assert.equal(result.tokensBefore, before.tokens);
    await until('the compacted usage', () => api.getUsage()?.tokens === result.tokensAfter);
    assert.equal(api.getSession(), 'agent-1');
    assert.equal((await agent!.requests.usage('agent-1')).tokens, result.tokensAfter);
  });

  it('starts on the newest session of the folder, not of the database', async () => {
    const elsewhere = await startSidecar({ db, cwd: dir });
    await elsewhere.requests.ingest('elsewhere', [bigUserMessage('e2', 100)]);
    assert.equal(await elsewhere.close(), 0, elsewhere.stderr());
    await vscode.commands.get('contextSidecar.restart')!();
    await until('usage after the restart', () => api.getUsage() !== undefined);
    assert.equal(api.getSession(), 'agent-1');
  });

  it('with followWorkspace off, shows only sessions it works on itself', async () => {
    vscode.settings['contextSidecar.followWorkspace'] = false;
    vscode.fireConfigurationChange('contextSidecar.followWorkspace');
    const seen: string[] = [];
    api.onDidChangeUsage((usage: Usage | undefined) => usage && seen.push(usage.sessionId));
    // The change sent `context/follow {follow: false}` at once; a reply to a later request on the same
    // connection means the host has handled it.
    await api.sendRequest(Methods.MEMORY_SESSIONS, {});
    // The change also re-reads the default session (the newest of the whole database, with following off):
    // one more refresh on the same connection ends after it, so none is still reading when the agent ingests.
    await api.setSession(undefined);
    seen.length = 0;
    await agent!.requests.ingest('agent-2', [bigUserMessage('b1', 100)]);
    // The host would send agent-2's usage to the editor's connection before the reply to this later ingest.
    const mine = (await api.sendRequest<{ usage: Usage }>(Methods.MEMORY_INGEST, {
      sessionId: 'mine',
      messages: [bigUserMessage('m1', 200)],
    })).usage;
    await until('usage of its own session', () => api.getUsage()?.tokens === mine.tokens && api.getSession() === 'mine');
    assert.ok(!seen.includes('agent-2'), JSON.stringify(seen));
  });

  it('follows a pinned session that others change, also with followWorkspace off', async () => {
    await agent!.requests.ingest('agent-3', [bigUserMessage('c1', 100)]);
    await api.setSession('agent-3');
    await until('the pinned usage', () => api.getUsage()?.sessionId === 'agent-3');
    const later = (await agent!.requests.ingest('agent-3', [bigUserMessage('c2', 300)])).usage;
    await until('the agent ingest in the status', () => api.getUsage()?.tokens === later.tokens);
    assert.equal(status().text, `$(pulse) ${statusText(later)}`);
  });
});
