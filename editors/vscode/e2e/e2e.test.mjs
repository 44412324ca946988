// End-to-end: the packaged extension in real VS Code (code-server), driven through headless Chromium.
// Run by e2e/run.sh, which installs what this needs and passes it in the environment:
//   E2E_CODE_SERVER  code-server's entry script; E2E_NODE  the Node 24 that runs it
//   E2E_PLAYWRIGHT   playwright-core's directory; E2E_CHROMIUM  the browser executable
//   E2E_VSIX         the packaged extension;     E2E_ARTIFACTS  where screenshots and logs go
//   CONTEXT_SIDECAR_COMMAND  the server, as for the Node suite
// One code-server start for the whole file: a cold start takes minutes on a small machine.
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { appendFileSync, chmodSync, cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { pidsWith, REACTION_MS, seed, SESSION, sidecarCommand, startLlm, until } from './support.mjs';

const { chromium } = createRequire(import.meta.url)(process.env.E2E_PLAYWRIGHT);

const ARTIFACTS = process.env.E2E_ARTIFACTS;
const SHOTS = join(ARTIFACTS, 'screenshots');
/** Cold start (code-server, the workbench, the extension host, the server) can take minutes on 2 busy cores. */
const STARTUP_MS = 12 * 60 * 1000;

describe('the packaged extension in VS Code (code-server in headless Chromium)', { timeout: STARTUP_MS + 15 * 60 * 1000 }, () => {
  let dir, db, exits, settingsFile, codeServer, codeServerExit, browser, page, seeded, llm;
  let shot = 0;
  const baseSettings = {};

  /** The window giving `percent` for the seeded tokens, and the status percent the extension will show for it. */
  const windowFor = (percent) => Math.round((seeded.tokens * 100) / percent);
  const shownPercent = (window) => Math.round(Math.round((1000 * seeded.tokens) / window) / 10);

  function writeSettings(extra) {
    writeFileSync(settingsFile, JSON.stringify({ ...baseSettings, ...extra }, null, 2));
  }

  /**
   * As a user editing settings.json does: the user settings opened from the palette, their text replaced
   * with the new window, saved; then the status bar text once it matches `pattern`, and the editor closed.
   * (The Settings editor was flaky under load: it writes after a debounce and renders the row again, so a
   * value filled in was sometimes never written. A change to the file from outside is not picked up.)
   */
  async function setContextWindow(window, pattern) {
    await runCommand('Preferences: Open User Settings (JSON)');
    const editor = page.locator('.editor-group-container.active .monaco-editor[data-uri$="settings.json"]');
    await editor.waitFor();
    await editor.locator('.view-lines').click();
    await page.keyboard.press('Control+A');
    const text = JSON.stringify({ ...baseSettings, 'contextSidecar.contextWindow': window, 'contextSidecar.llm.baseUrl': llm.baseUrl }, null, 2);
    await page.keyboard.insertText(text);  // no key events: nothing auto-closed or auto-indented
    await page.keyboard.press('Control+S');
    const status = await statusMatching(pattern);
    await runCommand('View: Close Editor');
    await editor.waitFor({ state: 'detached' });
    return status;
  }

  async function screenshot(name) {
    shot += 1;
    await page.screenshot({ path: join(SHOTS, `${String(shot).padStart(2, '0')}-${name}.png`) });
  }

  /** Runs a step; on failure keeps a screenshot and the page's DOM for a look, then fails. */
  async function step(name, run) {
    try {
      await run();
      await screenshot(name);
    } catch (error) {
      await page?.screenshot({ path: join(SHOTS, `FAILED-${name}.png`) }).catch(() => undefined);
      if (page) writeFileSync(join(ARTIFACTS, `FAILED-${name}.html`), await page.content().catch(() => ''));
      throw error;
    }
  }

  /** The status bar item's text once it matches `pattern` (the codicon is a CSS glyph, not text). */
  async function statusMatching(pattern, timeout = REACTION_MS) {
    const handle = await page.waitForFunction(
      (source) =>
        [...document.querySelectorAll('.statusbar-item')].find((item) => new RegExp(source).test(item.innerText.trim())),
      pattern.source,
      { timeout, polling: 'raf' },
    );
    return { text: await handle.evaluate((item) => item.innerText.trim()), className: await handle.evaluate((item) => item.className) };
  }

  /** F1, the command's title, a click on it: as a user runs a command from the palette. */
  async function runCommand(title) {
    await page.keyboard.press('Escape');
    await page.keyboard.press('F1');
    const input = page.locator('.quick-input-widget .quick-input-box input');
    await input.waitFor({ state: 'visible', timeout: REACTION_MS });
    await input.fill(`>${title}`);
    // The first row is the best fuzzy match, not always the command: pick the one whose label is the title.
    const exact = new RegExp(`^${title.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}$`);
    const row = page.locator('.quick-input-list .monaco-list-row').filter({ has: page.locator('.label-name', { hasText: exact }) });
    await row.first().click();
  }

  /** Answers the input box the command opened, whose prompt contains `prompt`. */
  async function answerInput(prompt, text) {
    await page.locator('.quick-input-widget', { hasText: prompt }).waitFor({ state: 'visible', timeout: REACTION_MS });
    const input = page.locator('.quick-input-widget .quick-input-box input');
    await input.fill(text);
    await page.keyboard.press('Enter');
  }

  const toast = (text) => page.locator('.notification-toast', { hasText: text });

  before(async () => {
    mkdirSync(SHOTS, { recursive: true });
    dir = mkdtempSync(join(tmpdir(), 'ctx-sidecar-e2e-'));
    db = join(dir, 'memory.duckdb');
    exits = join(dir, 'exits');
    const home = join(dir, 'home');
    const userData = join(dir, 'user-data');
    const extensions = join(dir, 'extensions');
    const workspace = join(dir, 'workspace');
    for (const d of [home, join(userData, 'User'), extensions, workspace]) mkdirSync(d, { recursive: true });
    seeded = await seed(db, workspace);
    llm = await startLlm();
    writeFileSync(join(workspace, 'README.md'), '# a workspace\n');
    // Records each server's exit code, which VS Code does not show.
    const wrapper = join(dir, 'sidecar.sh');
    writeFileSync(wrapper, `#!/bin/sh\n"$@"\necho $? >> '${exits}'\n`);
    chmodSync(wrapper, 0o755);
    settingsFile = join(userData, 'User', 'settings.json');
    Object.assign(baseSettings, {
      'workbench.startupEditor': 'none',
      'workbench.tips.enabled': false,
      'extensions.autoCheckUpdates': false,
      'extensions.autoUpdate': 'off',
      'telemetry.telemetryLevel': 'off',
      'workbench.secondarySideBar.defaultVisibility': 'hidden',
      'chat.disableAIFeatures': true,
      // settings.json in a tab, not a modal overlay.
      'workbench.editor.useModal': 'off',
      // settings.json is edited by typing: nothing may add or complete characters.
      'editor.autoClosingBrackets': 'never',
      'editor.autoClosingQuotes': 'never',
      'editor.autoSurround': 'never',
      'editor.formatOnType': false,
      'editor.formatOnPaste': false,
      'editor.quickSuggestions': { other: false, comments: false, strings: false },
      'editor.suggestOnTriggerCharacters': false,
      // The JSON-RPC traffic in the Context Sidecar output (copied to the artifacts), for a failing run.
      'contextSidecar.trace.server': 'messages',
      'contextSidecar.compaction.auto': false,
      'contextSidecar.compaction.maxTokens': -1,
      'contextSidecar.compaction.reserveTokens': 0,
      'contextSidecar.compaction.freshTail': 4,
      'contextSidecar.llm.model': 'e2e-model',
      'contextSidecar.llm.apiKeyEnv': 'CTX_SIDECAR_E2E_KEY',
    });
    writeSettings({ 'contextSidecar.contextWindow': windowFor(50), 'contextSidecar.llm.baseUrl': llm.baseUrl });
    // The extension host runs on the code-server side: machine-scoped settings come from its Machine settings.
    mkdirSync(join(userData, 'Machine'), { recursive: true });
    writeFileSync(
      join(userData, 'Machine', 'settings.json'),
      JSON.stringify({ 'contextSidecar.serverCommand': wrapper, 'contextSidecar.serverArgs': [...sidecarCommand(), '--db', db, '-v', '--log-file', join(ARTIFACTS, 'server.log')] }, null, 2),
    );
    const configFile = join(dir, 'code-server.yaml');
    writeFileSync(configFile, 'auth: none\ncert: false\n');

    const env = {
      ...process.env,
      HOME: home,
      XDG_CONFIG_HOME: join(home, '.config'),
      XDG_DATA_HOME: join(home, '.local', 'share'),
      XDG_CACHE_HOME: join(home, '.cache'),
      // Without it the extension host takes PATH from a login shell and may not find the server.
      VSCODE_CLI: '1',
      CTX_SIDECAR_E2E_KEY: 'sk-e2e',
    };
    const common = ['--extensions-dir', extensions, '--user-data-dir', userData, '--config', configFile];
    execFileSync(process.env.E2E_NODE, [process.env.E2E_CODE_SERVER, ...common, '--install-extension', process.env.E2E_VSIX], { env, stdio: 'inherit' });

    const log = join(ARTIFACTS, 'code-server.log');
    writeFileSync(log, '');
    codeServer = spawn(
      process.env.E2E_NODE,
      [
        process.env.E2E_CODE_SERVER, ...common,
        '--auth', 'none', '--bind-addr', '127.0.0.1:0',
        '--disable-telemetry', '--disable-update-check', '--disable-workspace-trust', '--disable-getting-started-override',
        workspace,
      ],
      { env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    codeServerExit = new Promise((r) => codeServer.on('exit', r));
    // Its own process group, so that teardown ends it with its extension host and server; also if this process fails.
    process.on('exit', () => {
      try {
        process.kill(-codeServer.pid, 'SIGKILL');
      } catch {
        // Already gone.
      }
    });
    const url = await new Promise((resolveUrl, reject) => {
      let seen = '';
      const onData = (chunk) => {
        appendFileSync(log, chunk);
        seen += chunk.toString();
        const match = /HTTP server listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(seen);
        if (match) resolveUrl(match[1]);
      };
      codeServer.stdout.on('data', onData);
      codeServer.stderr.on('data', onData);
      codeServer.on('exit', (code) => reject(new Error(`code-server exited with ${code}; see ${log}`)));
    });

    browser = await chromium.launch({
      executablePath: process.env.E2E_CHROMIUM,
      env, // its crash reports and config go to the temporary HOME too
      args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--disable-background-networking', '--disable-component-update', '--no-first-run'],
    });
    page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
    page.setDefaultTimeout(REACTION_MS);
    await page.goto(`${url}/?folder=${encodeURIComponent(workspace)}`, { timeout: STARTUP_MS });
    await step('started', async () => {
      await statusMatching(/^ctx /, STARTUP_MS);
      await statusMatching(/^ctx \d+%$/);
    });
  });

  after(async () => {
    await browser?.close();
    if (codeServer && codeServer.exitCode === null) {
      process.kill(-codeServer.pid, 'SIGTERM');
      await codeServerExit;
    }
    // The extension host ends with code-server; its server must not outlive it.
    if (db) {
      await until('the server to exit with VS Code', () => pidsWith(db).length === 0, 30000).catch((error) => {
        pidsWith(db).forEach((pid) => process.kill(pid, 'SIGKILL'));
        throw error;
      });
    }
    await llm?.close();
    // The extension's output channel, for a failing run.
    const logs = dir && join(dir, 'user-data', 'logs');
    if (logs && existsSync(logs)) cpSync(logs, join(ARTIFACTS, 'vscode-logs'), { recursive: true });
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('shows the state of the selected session in the status bar: ok, suggest, compact, overflow', async () => {
    const cases = [
      { percent: 50, pattern: (p) => new RegExp(`^ctx ${p}%$`), kind: null },
      { percent: 72, pattern: (p) => new RegExp(`^ctx ${p}% suggest: click to compact and free up context$`), kind: null },
      { percent: 80, pattern: (p) => new RegExp(`^ctx ${p}% compact: click to compact now$`), kind: 'warning-kind' },
      { percent: 110, pattern: (p) => new RegExp(`^ctx ${p}% overflow: click to compact, or older messages are dropped$`), kind: 'error-kind' },
    ];
    for (const { percent, pattern, kind } of cases) {
      await step(`status-${percent}`, async () => {
        const window = windowFor(percent);
        const status = await setContextWindow(window, pattern(shownPercent(window)));
        for (const look of ['warning-kind', 'error-kind']) {
          assert.equal(status.className.includes(look), look === kind, `${status.text}: ${status.className}`);
        }
      });
    }
  });

  it('compacts from the command palette with progress, and cancels', async () => {
    const window = windowFor(80);
    await step('compact-state', async () => {
      await setContextWindow(window, new RegExp(`^ctx ${shownPercent(window)}% compact: `));
    });
    await step('compact-focus-input', async () => {
      await runCommand('Context Sidecar: Compact Context…');
      await page.locator('.quick-input-widget', { hasText: `Compact session ${SESSION}` }).waitFor();
    });
    await step('compacting-with-progress', async () => {
      await answerInput(`Compact session ${SESSION}`, 'the parser');
      // The summarizer hangs: the progress notification stays, the status says compacting.
      await toast('Compacting context').locator('a.monaco-button', { hasText: 'Cancel' }).waitFor();
      await statusMatching(/^ctx \d+% compacting…$/);
    });
    await step('compaction-cancelled', async () => {
      await toast('Compacting context').locator('a.monaco-button', { hasText: 'Cancel' }).click();
      await toast('Compaction cancelled; the session is unchanged.').waitFor();
      await statusMatching(new RegExp(`^ctx ${shownPercent(window)}% compact: `));
    });

    // Again, with a summarizer that answers.
    await step('compacted', async () => {
      llm.hang = false;
      await runCommand('Context Sidecar: Compact Context…');
      await answerInput(`Compact session ${SESSION}`, '');
      await toast(/Context compacted: [\d,]+ → [\d,]+ tokens\./).waitFor();
      const after = await statusMatching(/^ctx \d+%/);
      assert.ok(Number(/ctx (\d+)%/.exec(after.text)[1]) < shownPercent(window), after.text);
    });
  });

  it('shows the usage of the selected session', async () => {
    await step('show-usage', async () => {
      await runCommand('Context Sidecar: Show Context Usage');
      const shown = toast(`Session ${SESSION}`);
      await shown.waitFor();
      const text = await shown.innerText();
      assert.match(text, /tokens/);
      assert.match(text, /Compaction threshold/);
      await shown.locator('a.monaco-button', { hasText: 'Compact…' }).waitFor();
      await shown.locator('a.monaco-button', { hasText: 'Sessions…' }).waitFor();
    });
  });

  it('expands a summary into a read-only editor', async () => {
    await step('expanded', async () => {
      await runCommand('Context Sidecar: Expand Summary…');
      await answerInput('Id of a summary', seeded.summaryId);
      await page.locator('.tab.active', { hasText: `${seeded.summaryId}.md` }).waitFor();
      const lines = page.locator('.editor-group-container.active .monaco-editor .view-lines');
      await lines.filter({ hasText: 'Session' }).waitFor();
      const text = (await lines.innerText()).replace(/\u00a0/g, ' ');
      assert.match(text, new RegExp(`# \\w+ ${seeded.summaryId}`));
      assert.match(text, /a0: word/);
    });
    await step('read-only', async () => {
      const before = await page.locator('.editor-group-container.active .monaco-editor .view-lines').innerText();
      await page.locator('.editor-group-container.active .monaco-editor .view-lines').click();
      await page.keyboard.type('x');
      await page.locator('.monaco-editor-overlaymessage', { hasText: 'Cannot edit in read-only editor' }).waitFor();
      assert.equal(await page.locator('.editor-group-container.active .monaco-editor .view-lines').innerText(), before);
    });
  });

  it('restarts the server from the command palette, shutting the old one down cleanly', async () => {
    await step('restarted', async () => {
      const servers = () => pidsWith(db, { hosts: false }); // the extension's own server, not the host
      const [old] = await until('a running server', () => servers());
      const exited = existsSync(exits) ? readFileSync(exits, 'utf8').trim().split('\n').length : 0;
      await runCommand('Context Sidecar: Restart Server');
      const codes = await until('the old server to exit', () => {
        const lines = existsSync(exits) ? readFileSync(exits, 'utf8').trim().split('\n') : [];
        return lines.length > exited && lines.slice(exited);
      });
      assert.deepEqual(codes, ['0']);
      const [fresh] = await until('a new server', () => servers().filter((pid) => pid !== old).length === 1 && servers());
      assert.notEqual(fresh, old);
      // The new server answers: with the old notifications cleared, Show Usage brings a fresh one.
      await runCommand('Notifications: Clear All Notifications');
      await page.locator('.notification-toast').first().waitFor({ state: 'detached' });
      await runCommand('Context Sidecar: Show Context Usage');
      await toast(`Session ${SESSION}`).waitFor();
      await statusMatching(/^ctx \d+%/);
    });
  });
});
