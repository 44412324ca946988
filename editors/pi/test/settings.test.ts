import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { agentDir, initializationOptions, PI_RESERVE_TOKENS, readSources, resolveSettings } from '../src/settings';

/** What resolveSettings gives with nothing set. */
const DEFAULTS = {
  enabled: true,
  command: ['context-sidecar'],
  reserveTokens: PI_RESERVE_TOKENS,
  piReserveTokens: PI_RESERVE_TOKENS,
  piCompaction: true,
  sidecar: {},
};

describe('settings', () => {
  it('defaults to context-sidecar on PATH, the default database and pi\'s reserve', () => {
    const { settings, problems } = resolveSettings({ env: {} });
    assert.deepEqual(settings, DEFAULTS);
    assert.deepEqual(problems, []);
  });

  it("takes the project's settings over the global ones, key by key, and the environment over both", () => {
    const global = {
      compaction: { reserveTokens: 20000 },
      contextSidecar: { command: '/opt/cs/bin/context-sidecar -v', db: '/data/global.duckdb', settings: { compaction: { mode: 'handoff' }, prune: { enabled: false } } },
    };
    const project = { contextSidecar: { db: '/data/project.duckdb', contextWindow: 64000, settings: { compaction: { freshTail: 4 } } } };
    let { settings } = resolveSettings({ global, project, env: {} });
    assert.deepEqual(settings.command, ['/opt/cs/bin/context-sidecar', '-v']);
    assert.equal(settings.db, '/data/project.duckdb');
    assert.equal(settings.contextWindow, 64000);
    assert.equal(settings.reserveTokens, 20000, "pi's own compaction.reserveTokens");
    assert.deepEqual(settings.sidecar, { compaction: { mode: 'handoff', freshTail: 4 }, prune: { enabled: false } });
    ({ settings } = resolveSettings({
      global,
      project,
      env: { CONTEXT_SIDECAR_DB: '/tmp/env.duckdb', CONTEXT_SIDECAR_CONTEXT_WINDOW: '32000', CONTEXT_SIDECAR_RESERVE_TOKENS: '2048', CONTEXT_SIDECAR_COMMAND: 'python -m sidecar' },
    }));
    assert.deepEqual([settings.db, settings.contextWindow, settings.reserveTokens], ['/tmp/env.duckdb', 32000, 2048]);
    assert.equal(settings.piReserveTokens, 20000, "pi's own reserve stays pi's: it decides when pi asks to compact");
    assert.equal(resolveSettings({ global: { compaction: { enabled: false } }, env: {} }).settings.piCompaction, false);
    assert.deepEqual(settings.command, ['python', '-m', 'sidecar']);
  });

  it('is turned off by "enabled": false or CONTEXT_SIDECAR_PI=off, and on again by the environment', () => {
    assert.equal(resolveSettings({ global: { contextSidecar: { enabled: false } }, env: {} }).settings.enabled, false);
    assert.equal(resolveSettings({ env: { CONTEXT_SIDECAR_PI: 'off' } }).settings.enabled, false);
    assert.equal(resolveSettings({ global: { contextSidecar: { enabled: false } }, env: { CONTEXT_SIDECAR_PI: '1' } }).settings.enabled, true);
  });

  it('reports each value of the wrong type and keeps its default', () => {
    const { settings, problems } = resolveSettings({
      global: { contextSidecar: { enabled: 'yes', command: [], db: 3, contextWindow: -5, reserveTokens: 1.5, settings: 'fast' } },
      env: { CONTEXT_SIDECAR_CONTEXT_WINDOW: 'big', CONTEXT_SIDECAR_PI: 'maybe' },
    });
    assert.deepEqual(settings, { ...DEFAULTS, contextWindow: undefined });
    assert.equal(problems.length, 8, problems.join('\n'));
    assert.ok(problems.some((p) => p.includes('"contextSidecar".contextWindow')));
    assert.ok(problems.some((p) => p.includes('CONTEXT_SIDECAR_CONTEXT_WINDOW')));
  });

  it("sends the server pi's reserve unless the user set the server's own", () => {
    const { settings } = resolveSettings({ global: { compaction: { reserveTokens: 3000 } }, env: {} });
    assert.deepEqual(initializationOptions(settings), { compaction: { reserveTokens: 3000 } });
    settings.sidecar = { compaction: { reserveTokens: 100, mode: 'full' } };
    assert.deepEqual(initializationOptions(settings), { compaction: { reserveTokens: 100, mode: 'full' } });
  });

  describe('files', () => {
    const dir = mkdtempSync(join(tmpdir(), 'pi-settings-'));
    after(() => rmSync(dir, { recursive: true, force: true }));

    it("reads pi's agent directory from PI_CODING_AGENT_DIR, with ~ for the home directory", () => {
      assert.equal(agentDir({}, '/home/u'), '/home/u/.pi/agent');
      assert.equal(agentDir({ PI_CODING_AGENT_DIR: '~/pi' }, '/home/u'), '/home/u/pi');
      assert.equal(agentDir({ PI_CODING_AGENT_DIR: '/etc/pi' }, '/home/u'), '/etc/pi');
    });

    it('reads the global and project files, and says which file is broken', () => {
      const agent = join(dir, 'agent');
      const project = join(dir, 'project');
      mkdirSync(agent, { recursive: true });
      mkdirSync(join(project, '.pi'), { recursive: true });
      writeFileSync(join(agent, 'settings.json'), JSON.stringify({ contextSidecar: { db: '/g.duckdb' } }));
      writeFileSync(join(project, '.pi', 'settings.json'), '{"contextSidecar": ');
      const problems: string[] = [];
      const sources = readSources(project, { PI_CODING_AGENT_DIR: agent }, problems);
      assert.equal(resolveSettings(sources).settings.db, '/g.duckdb');
      assert.equal(problems.length, 1);
      assert.ok(problems[0].startsWith(join(project, '.pi', 'settings.json')), problems[0]);
    });
  });
});
