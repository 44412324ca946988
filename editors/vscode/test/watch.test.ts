/**
 * Opening a folder shows its agents' sessions with no MCP server or hook running: the extension has the
 * server follow the transcripts Claude Code writes for the folder (`memory/watch`). A line appended to
 * a live transcript, written as Claude Code writes it, is found by `memory_grep` and moves the usage the
 * status bar shows.
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { appendFileSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import Module from 'node:module';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { ContextSidecarApi } from '../src/api';
import { AGENT_ENV_NAMES, Methods } from '../src/protocol';
import { agentEnv } from '../src/settings';
import { createFakeVscode, FakeVscode } from './fakeVscode';
import { sidecarCommand, until } from './helpers';
import { EXTENSION_ROOT } from './paths';

/** Appends entries to a Claude Code project transcript as Claude Code 2.1 writes them. */
class ClaudeTranscript {
  private parent: string | null = null;
  private responses = 0;

  constructor(
    readonly path: string,
    private readonly cwd: string,
    readonly sessionId: string,
  ) {}

  private entry(type: string, fields: Record<string, unknown>): Record<string, unknown> {
    const uuid = randomUUID();
    const entry = { parentUuid: this.parent, isSidechain: false, userType: 'external', cwd: this.cwd,
      sessionId: this.sessionId, version: '2.1.197', gitBranch: 'main', type, ...fields, uuid,
      timestamp: new Date().toISOString() };
    this.parent = uuid;
    return entry;
  }

  private write(...entries: Array<Record<string, unknown>>): void {
    appendFileSync(this.path, entries.map((entry) => JSON.stringify(entry) + '\n').join(''));
  }

  user(text: string): void {
    this.write(
      { type: 'queue-operation', operation: 'enqueue', timestamp: new Date().toISOString(), sessionId: this.sessionId,
        content: text },
      this.entry('user', { message: { role: 'user', content: text }, permissionMode: 'default' }),
    );
  }

  /** An answer, with the usage the provider counted for its call; returns that count. */
  assistant(text: string, cacheRead: number): number {
    this.responses += 1;
    const id = `msg_01${String(this.responses).padStart(22, '0')}`;
    const usage = { input_tokens: 4, cache_creation_input_tokens: 600, cache_read_input_tokens: cacheRead,
      output_tokens: 40, service_tier: 'standard' };
    this.write(this.entry('assistant', { requestId: `req_${id}`, message: { id, type: 'message', role: 'assistant',
      model: 'claude-sonnet-4-5-20250929', content: [{ type: 'text', text }], stop_reason: 'end_turn',
      stop_sequence: null, usage } }));
    return 4 + 600 + cacheRead + 40;
  }
}

describe('the agents of the workspace folder, with no MCP server running', () => {
  let vscode: FakeVscode;
  let extension: { activate(context: unknown): Promise<ContextSidecarApi>; deactivate(): Promise<void> };
  let api: ContextSidecarApi;
  let dir: string;
  let transcript: ClaudeTranscript;
  const originalLoad = (Module as any)._load;
  const originalEnv = Object.fromEntries(AGENT_ENV_NAMES.map((name) => [name, process.env[name]]));

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'ctx-sidecar-watch-'));
    const workspace = join(dir, 'project');
    mkdirSync(workspace);
    // Where the agents of this window keep their transcripts: the extension passes its environment on.
    process.env.CLAUDE_CONFIG_DIR = join(dir, 'claude');
    process.env.CODEX_HOME = join(dir, 'codex');
    process.env.PI_CODING_AGENT_DIR = join(dir, 'pi');
    const project = join(dir, 'claude', 'projects', workspace.replace(/[^a-zA-Z0-9]/g, '-'));
    mkdirSync(project, { recursive: true });
    transcript = new ClaudeTranscript(join(project, 'cc-vscode.jsonl'), workspace, 'cc-vscode');
    transcript.user('Where does the parser drop the last token?');
    transcript.assistant('In tokenize(): the loop stops one short.', 20_000);

    const [command, ...args] = sidecarCommand();
    vscode = createFakeVscode({
      'contextSidecar.serverCommand': command,
      'contextSidecar.serverArgs': [...args, '--db', join(dir, 'memory.duckdb')],
      'contextSidecar.compaction.auto': false,
    });
    vscode.module.workspace.workspaceFolders = [{ uri: vscode.module.Uri.file(workspace), name: 'project', index: 0 }];
    (Module as any)._load = function (request: string, ...rest: unknown[]) {
      return request === 'vscode' ? vscode.module : originalLoad.call(this, request, ...rest);
    };
    extension = require(resolve(EXTENSION_ROOT, 'out', 'extension.js'));
    api = await extension.activate({ subscriptions: [] });
  });

  after(async () => {
    (Module as any)._load = originalLoad;
    await extension.deactivate();
    for (const [name, value] of Object.entries(originalEnv)) {
      if (value === undefined) {
        delete process.env[name];
      } else {
        process.env[name] = value;
      }
    }
    rmSync(dir, { recursive: true, force: true });
  });

  it('passes on only the variables that say where agents keep transcripts', () => {
    assert.deepEqual(agentEnv({ HOME: '/home/me', CODEX_HOME: '', PATH: '/bin', CLAUDE_CONFIG_DIR: '/c' }), {
      HOME: '/home/me',
      CLAUDE_CONFIG_DIR: '/c',
    });
  });

  it("shows the agent's session, with the provider's count of its last call", async () => {
    await until('the agent session', () => api.getSession() === 'cc-vscode' && api.getUsage()?.source === 'provider',
      30000);
    assert.equal(api.getUsage()?.tokens, 4 + 600 + 20_000 + 40);
    assert.equal(api.getUsage()?.messages, 2);
  });

  it('a line the agent appends is found by memory_grep, and its next answer moves the usage', async () => {
    transcript.user('And the PELICAN test, why does it fail?');
    await until('the appended line', () => api.getUsage()?.messages === 3, 30000);
    const found = await api.sendRequest<{ message: { content: string } }>(Methods.MEMORY_CALL_TOOL, {
      sessionId: 'cc-vscode',
      name: 'memory_grep',
      arguments: JSON.stringify({ pattern: 'PELICAN' }),
    });
    assert.match(found.message.content, /And the PELICAN test, why does it fail\?/);
    const counted = transcript.assistant('It reads a fixture that moved.', 26_000);
    await until('the new count in the status bar', () => api.getUsage()?.tokens === counted, 30000);
    assert.equal(api.getUsage()?.source, 'provider');
    assert.equal(api.getSession(), 'cc-vscode');
  });
});
