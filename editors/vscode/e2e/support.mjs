// What the end-to-end suite needs besides VS Code: the server's command line, its processes, a
// session stored before VS Code starts, and an OpenAI-compatible endpoint the test controls.
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const EXTENSION_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
// The extension's own vscode-jsonrpc seeds the database, as its tests talk to the server.
const rpc = createRequire(join(EXTENSION_ROOT, 'package.json'))('vscode-jsonrpc/node');
export const SESSION = 'e2e';
/** One user-visible reaction: a status bar change, a notification, an editor opening. */
export const REACTION_MS = 90 * 1000;

/** `CONTEXT_SIDECAR_COMMAND` split on spaces, its program resolved on PATH (the extension host gets a path). */
export function sidecarCommand() {
  const [program, ...args] = (process.env.CONTEXT_SIDECAR_COMMAND?.trim() || 'context-sidecar').split(/\s+/);
  const path = program.includes('/') ? resolve(program) : execFileSync('sh', ['-c', `command -v "${program}"`]).toString().trim();
  return [path, ...args];
}

/** Pids of live processes whose command line contains `marker`, shells excepted (and the database's host, with `hosts: false`). */
export function pidsWith(marker, { hosts = true } = {}) {
  const pids = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const argv = readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0');
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const isHost = argv.includes('host'); // the database's host, which the extension's server relays to
      if (argv.includes(marker) && !argv[0].endsWith('sh') && !/\) Z /.test(stat) && (hosts || !isHost)) {
        pids.push(Number(entry));
      }
    } catch {
      // The process ended while we looked.
    }
  }
  return pids;
}

/** Waits for `check()` to be truthy: for process table changes, which have no event to listen to here. */
export async function until(what, check, timeoutMs = REACTION_MS) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

function message(id, role, tokens) {
  return { id, role, content: `${id}: ` + 'word '.repeat(Math.round((tokens * 4) / 5)).trim() };
}

/**
 * Stores session `e2e` before VS Code starts (DuckDB lets one process hold the file): turns, one
 * compaction (whose summary the suite expands later), more turns. Returns the summary id and the tokens.
 */
export async function seed(db, workspace) {
  const [command, ...args] = sidecarCommand();
  const child = spawn(command, [...args, '--db', db, '--stdio'], { stdio: ['pipe', 'pipe', 'inherit'] });
  const exited = new Promise((r) => child.on('exit', r));
  const connection = rpc.createMessageConnection(new rpc.StreamMessageReader(child.stdout), new rpc.StreamMessageWriter(child.stdin));
  connection.listen();
  await connection.sendRequest('initialize', {
    processId: process.pid,
    rootUri: pathToFileURL(workspace).href, // the session belongs to the folder VS Code opens, as an agent's would
    capabilities: {},
    initializationOptions: { compaction: { auto: false, maxTokens: -1, freshTail: 4 } },
  });
  await connection.sendNotification('initialized', {});
  const turns = (prefix, n) => Array.from({ length: n }, (_, i) => message(`${prefix}${i}`, i % 2 ? 'assistant' : 'user', 60));
  await connection.sendRequest('memory/ingest', { sessionId: SESSION, messages: turns('a', 16), session: { title: 'End-to-end session' } });
  const compacted = await connection.sendRequest('context/compact', { sessionId: SESSION });
  assert.equal(compacted.compacted, true, JSON.stringify(compacted));
  const ingested = await connection.sendRequest('memory/ingest', { sessionId: SESSION, messages: turns('b', 16) });
  await connection.sendRequest('shutdown');
  await connection.sendNotification('exit');
  assert.equal(await exited, 0);
  connection.dispose();
  return { summaryId: compacted.summaryIds[0], tokens: ingested.usage.tokens };
}

/** An OpenAI-compatible endpoint; while `hang` is set it holds requests open (a compaction waits to be cancelled). */
export async function startLlm() {
  const held = [];
  const llm = { hang: true };
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (chunk) => (body += chunk));
    req.on('end', () => {
      if (llm.hang) {
        held.push(res);
        return;
      }
      const request = JSON.parse(body || '{}');
      const base = { id: 'e2e', created: 0, model: request.model ?? 'fake' };
      const text = 'Summary: the e2e turns so far.';
      if (request.stream) {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        for (const [delta, finish] of [[{ role: 'assistant', content: text }, null], [{}, 'stop']]) {
          const chunk = { ...base, object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason: finish }] };
          res.write(`data: ${JSON.stringify(chunk)}\n\n`);
        }
        res.end('data: [DONE]\n\n');
        return;
      }
      const choice = { index: 0, message: { role: 'assistant', content: text }, finish_reason: 'stop' };
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ ...base, object: 'chat.completion', choices: [choice], usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } }));
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return Object.assign(llm, {
    baseUrl: `http://127.0.0.1:${server.address().port}/v1`,
    close: () => {
      held.forEach((res) => res.destroy());
      server.closeAllConnections();
      return new Promise((r) => server.close(r));
    },
  });
}
