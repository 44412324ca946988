/** Spawns the real context-sidecar and talks to it through vscode-jsonrpc, as VS Code's client does. */
import { ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createMessageConnection, MessageConnection, StreamMessageReader, StreamMessageWriter } from 'vscode-jsonrpc/node';
import { Methods, ServerCapabilities, Usage } from '../src/protocol';
import { SidecarRequests } from '../src/rpc';

/** `CONTEXT_SIDECAR_COMMAND` (split on spaces, so `python -m sidecar` works), else `context-sidecar` on PATH. */
export function sidecarCommand(): string[] {
  const configured = process.env.CONTEXT_SIDECAR_COMMAND?.trim();
  return configured ? configured.split(/\s+/) : ['context-sidecar'];
}

/** Options that make percentages move with a few kilobytes of text; auto-compaction off. */
export const SMALL_WINDOW = {
  contextWindow: 4000,
  compaction: { auto: false, maxTokens: -1, reserveTokens: 500 },
};

export interface Sidecar {
  connection: MessageConnection;
  requests: SidecarRequests;
  process: ChildProcess;
  capabilities: ServerCapabilities;
  /** Every notification received, in order. */
  notifications: Array<{ method: string; params: any }>;
  /**
   * Calls `handler` for each notification of `method`. Use this, not `connection.onNotification`:
   * a handler for one method would take over from the catch-all handler that records everything.
   */
  on(method: string, handler: (params: any) => void): void;
  stderr: () => string;
  /** Resolves with the next notification of `method` that `accept` takes. */
  next<T>(method: string, accept?: (params: T) => boolean, timeoutMs?: number): Promise<T>;
  /** `shutdown`, `exit`; resolves with the exit code. */
  close(): Promise<number | null>;
}

export interface StartOptions {
  initializationOptions?: unknown;
  env?: NodeJS.ProcessEnv;
  args?: string[];
  /** A database of the caller's (kept on close), e.g. one another server already hosts; default: a fresh one. */
  db?: string;
  /** The server's working directory: the workspace of its sessions, since this client names no root. */
  cwd?: string;
}

export async function startSidecar(options: StartOptions = {}): Promise<Sidecar> {
  const dir = mkdtempSync(join(tmpdir(), 'ctx-sidecar-vscode-'));
  const [command, ...baseArgs] = sidecarCommand();
  const db = options.db ?? join(dir, 'memory.duckdb');
  const child = spawn(command, [...baseArgs, '--db', db, '--stdio', ...(options.args ?? [])], {
    stdio: ['pipe', 'pipe', 'pipe'],
    env: { ...process.env, ...options.env },
    cwd: options.cwd,
  });
  let stderr = '';
  child.stderr!.on('data', (chunk: Buffer) => {
    stderr += chunk.toString();
  });
  const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  const spawnError = new Promise<never>((_, reject) =>
    child.on('error', (error) => reject(new Error(`cannot run ${command}: ${error.message}`))),
  );
  const connection = createMessageConnection(new StreamMessageReader(child.stdout!), new StreamMessageWriter(child.stdin!));
  const notifications: Array<{ method: string; params: any }> = [];
  const waiters: Array<{ method: string; accept: (p: any) => boolean; resolve: (p: any) => void }> = [];
  const handlers: Array<{ method: string; handler: (p: any) => void }> = [];
  connection.onNotification((method: string, params: any) => {
    notifications.push({ method, params });
    handlers.filter((h) => h.method === method).forEach((h) => h.handler(params));
    for (const waiter of [...waiters]) {
      if (waiter.method === method && waiter.accept(params)) {
        waiters.splice(waiters.indexOf(waiter), 1);
        waiter.resolve(params);
      }
    }
  });
  connection.listen();

  const init: any = await Promise.race([
    connection.sendRequest('initialize', {
      processId: process.pid,
      rootUri: null,
      capabilities: { experimental: { contextSidecar: { usageNotifications: true, compactionHooks: false } } },
      initializationOptions: options.initializationOptions ?? SMALL_WINDOW,
    }),
    spawnError,
  ]);
  await connection.sendNotification('initialized', {});

  let closed = false;
  return {
    connection,
    requests: new SidecarRequests(connection),
    process: child,
    capabilities: init.capabilities.experimental.contextSidecar,
    notifications,
    on: (method, handler) => {
      handlers.push({ method, handler });
    },
    stderr: () => stderr,
    next<T>(method: string, accept: (params: T) => boolean = () => true, timeoutMs = 10000): Promise<T> {
      return new Promise<T>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`no ${method} within ${timeoutMs} ms`)), timeoutMs);
        waiters.push({
          method,
          accept,
          resolve: (params) => {
            clearTimeout(timer);
            resolve(params);
          },
        });
      });
    },
    async close(): Promise<number | null> {
      if (!closed && child.exitCode === null) {
        closed = true;
        const shutdown = (async () => {
          await connection.sendRequest('shutdown');
          await connection.sendNotification('exit');
        })();
        // A server that is gone or wedged must not hang the suite: the exit code tells the test.
        await Promise.race([shutdown.catch(() => undefined), new Promise((r) => setTimeout(r, 5000).unref())]);
      }
      const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
      const code = child.exitCode ?? (await exited);
      clearTimeout(timer);
      connection.dispose();
      rmSync(dir, { recursive: true, force: true });
      return code;
    },
  };
}

/** A user message of about `tokens` tokens (the estimator counts about four characters a token). */
export function bigUserMessage(id: string, tokens: number): { role: 'user'; content: string; id: string } {
  return { role: 'user', content: 'word '.repeat(Math.max(1, Math.round((tokens * 4) / 5))).trim(), id };
}

export function usageOf(sidecar: Sidecar, sessionId: string): Usage[] {
  return sidecar.notifications
    .filter((n) => n.method === Methods.CONTEXT_DID_CHANGE_USAGE && n.params.sessionId === sessionId)
    .map((n) => n.params as Usage);
}

/** Waits up to `timeoutMs` for `check()` to be truthy, and returns it. */
export async function until<T>(what: string, check: () => T, timeoutMs = 10000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = check();
    if (value) {
      return value;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out waiting for ${what}`);
    }
    await new Promise((r) => setTimeout(r, 20));
  }
}
