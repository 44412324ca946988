/**
 * The context-sidecar process this extension spawns (it relays to the shared host of its database,
 * so editors on the same database see pi's session live): start, `initialize`, requests, stop.
 */
import { ChildProcess, spawn } from 'node:child_process';
import { basename } from 'node:path';
import { pathToFileURL } from 'node:url';
import { EXPERIMENTAL_KEY, ErrorCodes, PROTOCOL_VERSION, REQUIRED_METHODS } from './protocol';
import { Connection, ConnectionClosed, RequestOptions, RpcError } from './rpc';

export const CLIENT_NAME = 'context-sidecar-pi';
export const CLIENT_VERSION = '0.1.0';
/** How long a start may take: spawning, and a host opening its database for the first time. */
export const START_TIMEOUT_MS = 20_000;
const STOP_TIMEOUT_MS = 2_000;
/** How long a closed connection waits for the process's exit status, which says more. */
const EXIT_WAIT_MS = 2_000;
const STDERR_KEPT = 2_000;

export interface StartOptions {
  command: string[];
  db?: string;
  /** The server's working directory and the client's root: the workspace pi's sessions are recorded under. */
  cwd: string;
  initializationOptions: Record<string, unknown>;
  env?: NodeJS.ProcessEnv;
  /** Runs the server's summary calls (`context/summarize`) on pi's model; declared as `summaries` when given. */
  summarize?: (params: any) => Promise<unknown>;
}

/** Why the sidecar cannot be used, in words for the user. */
export class Unavailable extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'Unavailable';
  }
}

/** Only the streams that keep Node's event loop alive: refed while a request waits, so pi can exit when idle. */
function setRef(child: ChildProcess, on: boolean): void {
  for (const handle of [child, child.stdin, child.stdout, child.stderr] as Array<{ ref?(): void; unref?(): void } | null>) {
    if (on) {
      handle?.ref?.();
    } else {
      handle?.unref?.();
    }
  }
}

export class Sidecar {
  readonly ready: Promise<void>;
  private readonly connection: Connection;
  private stderr = '';
  private exited: Promise<void>;
  private failure: Unavailable | undefined;

  private constructor(
    private readonly child: ChildProcess,
    private readonly options: StartOptions,
  ) {
    this.connection = new Connection(child.stdout!, child.stdin!);
    this.connection.onBusyChange = (busy) => setRef(child, busy);
    child.stderr!.on('data', (chunk: Buffer) => {
      this.stderr = (this.stderr + chunk.toString('utf8')).slice(-STDERR_KEPT);
    });
    this.exited = new Promise((resolve) => {
      child.on('exit', (code, signal) => {
        const how = signal ? `was killed by ${signal}` : `exited with code ${code}`;
        const said = this.stderr.trim().split('\n').slice(-3).join(' | ');
        this.fail(`context-sidecar ${how}${said ? `: ${said}` : ''}`);
        resolve();
      });
      child.on('error', (error: NodeJS.ErrnoException) => {
        const command = options.command[0];
        this.fail(
          error.code === 'ENOENT'
            ? `cannot run "${command}": not found (install context-sidecar, or set contextSidecar.command or CONTEXT_SIDECAR_COMMAND)`
            : `cannot run "${command}": ${error.message}`,
        );
        resolve(); // It never ran, or cannot be reached: no exit status will come.
      });
    });
    this.connection.onRequest('workspace/configuration', (params: any) =>
      (params?.items ?? []).map((item: { section?: string }) => (item.section === EXPERIMENTAL_KEY ? options.initializationOptions : null)),
    );
    this.connection.onRequest('window/workDoneProgress/create', () => null);
    this.connection.onRequest('client/registerCapability', () => null);
    this.connection.onRequest('window/showMessageRequest', () => null);
    this.connection.onRequest('context/willCompact', () => ({ action: 'proceed' }));
    const summarize = options.summarize;
    if (summarize) {
      this.connection.onRequest('context/summarize', (params: any) => summarize(params));
    }
    this.ready = this.initialize();
    this.ready.catch(() => {});
  }

  /** Spawns the server; `ready` settles once it answered `initialize` (or rejects with an Unavailable). */
  static start(options: StartOptions): Sidecar {
    const [command, ...args] = options.command;
    const child = spawn(command, [...args, ...(options.db ? ['--db', options.db] : [])], {
      cwd: options.cwd,
      env: options.env ?? process.env,
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    return new Sidecar(child, options);
  }

  /** Why it cannot be used, once it cannot. */
  get unavailable(): string | undefined {
    return this.failure?.message;
  }

  onNotification(method: string, handler: (params: any) => void): void {
    this.connection.onNotification(method, handler);
  }

  /** A request once started; a host that died mid-request (-32022, retryable) is asked again once. */
  async request<R>(method: string, params: unknown, options: RequestOptions = {}): Promise<R> {
    await this.ready;
    try {
      try {
        return await this.connection.request<R>(method, params, options);
      } catch (error) {
        if (error instanceof RpcError && error.code === ErrorCodes.HOST_CONNECTION_LOST) {
          return await this.connection.request<R>(method, params, options);
        }
        throw error;
      }
    } catch (error) {
      throw error instanceof ConnectionClosed ? await this.whyClosed(error.message) : error;
    }
  }

  notify(method: string, params: unknown): void {
    if (!this.failure) {
      this.connection.notify(method, params);
    }
  }

  /** `shutdown` and `exit` as LSP wants, then a kill if it is still there. */
  async stop(): Promise<void> {
    if (this.child.exitCode === null && this.child.signalCode === null && !this.connection.closed) {
      try {
        await this.connection.request('shutdown', null, { timeoutMs: STOP_TIMEOUT_MS });
        this.connection.notify('exit', null);
      } catch {
        // It is going away either way.
      }
    }
    this.fail('context-sidecar was stopped');
    const timer = setTimeout(() => this.child.kill('SIGKILL'), STOP_TIMEOUT_MS);
    timer.unref();
    if (this.child.exitCode === null && this.child.signalCode === null && this.child.pid !== undefined) {
      setRef(this.child, true); // Waiting for it to exit is waiting on it.
      this.child.stdin?.end();
      await this.exited;
    }
    clearTimeout(timer);
  }

  /** The process's exit status once it comes (a closed pipe says less), as an Unavailable. */
  private async whyClosed(fallback: string): Promise<Unavailable> {
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([this.exited, new Promise((resolve) => (timer = setTimeout(resolve, EXIT_WAIT_MS)))]);
    clearTimeout(timer);
    this.fail(fallback);
    return this.failure as Unavailable;
  }

  private fail(reason: string): void {
    if (!this.failure) {
      this.failure = new Unavailable(reason);
    }
    this.connection.close(this.failure.message);
  }

  private async initialize(): Promise<void> {
    const root = this.options.cwd;
    const uri = pathToFileURL(root).href;
    let result: any;
    try {
      result = await this.connection.request(
        'initialize',
        {
          processId: process.pid,
          clientInfo: { name: CLIENT_NAME, version: CLIENT_VERSION },
          rootUri: uri,
          rootPath: root,
          workspaceFolders: [{ uri, name: basename(root) }],
          capabilities: {
            experimental: { [EXPERIMENTAL_KEY]: { usageNotifications: true, compactionHooks: false, summaries: !!this.options.summarize } },
          },
          initializationOptions: this.options.initializationOptions,
        },
        { timeoutMs: START_TIMEOUT_MS },
      );
    } catch (error) {
      const reason = `context-sidecar did not start: ${(error as Error).message}`;
      if (error instanceof ConnectionClosed) {
        throw await this.whyClosed(reason);
      }
      this.fail(reason);
      throw this.failure;
    }
    const server = result?.capabilities?.experimental?.[EXPERIMENTAL_KEY];
    const methods: string[] = Array.isArray(server?.methods) ? server.methods : [];
    const missing = REQUIRED_METHODS.filter((m) => !methods.includes(m));
    if (server?.protocolVersion !== PROTOCOL_VERSION || missing.length) {
      const version = result?.serverInfo?.version ?? 'unknown';
      this.fail(
        `context-sidecar ${version} cannot serve pi: ` +
          (server?.protocolVersion !== PROTOCOL_VERSION
            ? `protocol version ${String(server?.protocolVersion)}, not ${PROTOCOL_VERSION}`
            : `it lacks ${missing.join(', ')}`),
      );
      void this.stop();
      throw this.failure;
    }
    this.connection.notify('initialized', {});
  }
}

