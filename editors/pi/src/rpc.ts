/**
 * JSON-RPC 2.0 with LSP framing (`Content-Length` headers) over a pair of streams, the way every
 * context-sidecar client speaks: requests with cancellation and a time limit, notifications both ways,
 * and answers to the few requests the server sends.
 */
import type { Readable, Writable } from 'node:stream';

export class RpcError extends Error {
  constructor(
    readonly code: number,
    message: string,
    readonly data?: unknown,
  ) {
    super(message);
    this.name = 'RpcError';
  }
}

/** The connection is gone (the process exited, a stream closed, a frame could not be read). */
export class ConnectionClosed extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ConnectionClosed';
  }
}

export class RequestTimeout extends Error {
  constructor(method: string, ms: number) {
    super(`${method} got no answer within ${Math.round(ms / 1000)} s`);
    this.name = 'RequestTimeout';
  }
}

interface Pending {
  method: string;
  resolve: (value: unknown) => void;
  reject: (error: Error) => void;
  timer?: NodeJS.Timeout;
}

export interface RequestOptions {
  signal?: AbortSignal;
  /** No answer within this many milliseconds rejects with RequestTimeout (and cancels the request). */
  timeoutMs?: number;
}

type RequestHandler = (params: unknown) => unknown;
type NotificationHandler = (params: any) => void;

const HEADER_END = Buffer.from('\r\n\r\n');

/** Splits a byte stream into LSP frames' bodies. */
export class FrameReader {
  private buffer: Buffer = Buffer.alloc(0);

  /** Adds bytes; returns the complete bodies now available. Throws on a header without Content-Length. */
  push(chunk: Buffer): string[] {
    this.buffer = this.buffer.length ? Buffer.concat([this.buffer, chunk]) : chunk;
    const bodies: string[] = [];
    for (;;) {
      const end = this.buffer.indexOf(HEADER_END);
      if (end < 0) {
        return bodies;
      }
      const header = this.buffer.subarray(0, end).toString('ascii');
      const match = /^content-length:\s*(\d+)\s*$/im.exec(header);
      if (!match) {
        throw new Error(`a frame header without Content-Length: ${JSON.stringify(header.slice(0, 200))}`);
      }
      const length = Number(match[1]);
      const start = end + HEADER_END.length;
      if (this.buffer.length < start + length) {
        return bodies;
      }
      bodies.push(this.buffer.subarray(start, start + length).toString('utf8'));
      this.buffer = this.buffer.subarray(start + length);
    }
  }
}

/** One body as a frame. */
export function frame(body: string): Buffer {
  const bytes = Buffer.from(body, 'utf8');
  return Buffer.concat([Buffer.from(`Content-Length: ${bytes.length}\r\n\r\n`, 'ascii'), bytes]);
}

export class Connection {
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  private readonly requestHandlers = new Map<string, RequestHandler>();
  private readonly notificationHandlers = new Map<string, NotificationHandler[]>();
  private readonly reader = new FrameReader();
  private closedWith: ConnectionClosed | undefined;
  /** Called when requests start or all have ended: lets the owner keep the process alive only while waiting. */
  onBusyChange: (busy: boolean) => void = () => {};

  constructor(
    input: Readable,
    private readonly output: Writable,
  ) {
    input.on('data', (chunk: Buffer) => this.receive(chunk));
    input.on('end', () => this.close('the server closed its output'));
    input.on('error', (error) => this.close(`reading from the server failed: ${error.message}`));
    output.on('error', (error) => this.close(`writing to the server failed: ${error.message}`));
  }

  get closed(): boolean {
    return this.closedWith !== undefined;
  }

  /** Answers the server's requests of `method` with what `handler` returns. */
  onRequest(method: string, handler: RequestHandler): void {
    this.requestHandlers.set(method, handler);
  }

  onNotification(method: string, handler: NotificationHandler): void {
    this.notificationHandlers.set(method, [...(this.notificationHandlers.get(method) ?? []), handler]);
  }

  request<R>(method: string, params: unknown, options: RequestOptions = {}): Promise<R> {
    if (this.closedWith) {
      return Promise.reject(this.closedWith);
    }
    if (options.signal?.aborted) {
      return Promise.reject(new RpcError(-32800, `${method} cancelled`));
    }
    const id = this.nextId++;
    return new Promise<R>((resolve, reject) => {
      const cancel = () => this.notify('$/cancelRequest', { id });
      const signal = options.signal;
      signal?.addEventListener('abort', cancel, { once: true });
      const entry: Pending = {
        method,
        resolve: (value) => {
          signal?.removeEventListener('abort', cancel);
          resolve(value as R);
        },
        reject: (error) => {
          signal?.removeEventListener('abort', cancel);
          reject(error);
        },
      };
      if (options.timeoutMs !== undefined) {
        entry.timer = setTimeout(() => {
          this.settle(id);
          cancel();
          entry.reject(new RequestTimeout(method, options.timeoutMs as number));
        }, options.timeoutMs);
      }
      this.pending.set(id, entry);
      if (this.pending.size === 1) {
        this.onBusyChange(true);
      }
      this.write({ jsonrpc: '2.0', id, method, params });
    });
  }

  notify(method: string, params: unknown): void {
    if (!this.closedWith) {
      this.write({ jsonrpc: '2.0', method, params });
    }
  }

  /** Rejects everything pending; later requests reject at once. */
  close(reason: string): void {
    if (this.closedWith) {
      return;
    }
    this.closedWith = new ConnectionClosed(reason);
    for (const id of [...this.pending.keys()]) {
      this.settle(id)?.reject(this.closedWith);
    }
  }

  private settle(id: number): Pending | undefined {
    const entry = this.pending.get(id);
    if (entry) {
      clearTimeout(entry.timer);
      this.pending.delete(id);
      if (this.pending.size === 0) {
        this.onBusyChange(false);
      }
    }
    return entry;
  }

  private write(message: unknown): void {
    try {
      this.output.write(frame(JSON.stringify(message)));
    } catch (error) {
      this.close(`writing to the server failed: ${(error as Error).message}`);
    }
  }

  private receive(chunk: Buffer): void {
    let bodies: string[];
    try {
      bodies = this.reader.push(chunk);
    } catch (error) {
      this.close(`the server sent an unreadable frame: ${(error as Error).message}`);
      return;
    }
    for (const body of bodies) {
      let message: any;
      try {
        message = JSON.parse(body);
      } catch {
        this.close(`the server sent a body that is not JSON: ${body.slice(0, 200)}`);
        return;
      }
      this.dispatch(message);
    }
  }

  private dispatch(message: any): void {
    if (typeof message !== 'object' || message === null) {
      return;
    }
    if (message.method === undefined && (typeof message.id === 'number' || typeof message.id === 'string')) {
      const entry = this.settle(Number(message.id));
      if (!entry) {
        return;
      }
      if (message.error) {
        const error = message.error;
        entry.reject(new RpcError(Number(error.code), String(error.message ?? 'error'), error.data));
      } else {
        entry.resolve(message.result);
      }
      return;
    }
    if (typeof message.method !== 'string') {
      return;
    }
    if (message.id !== undefined && message.id !== null) {
      const handler = this.requestHandlers.get(message.method);
      if (handler) {
        const id = message.id;
        const refuse = (error: unknown) =>
          this.write({
            jsonrpc: '2.0',
            id,
            error: error instanceof RpcError ? { code: error.code, message: error.message } : { code: -32603, message: String(error) },
          });
        let result: unknown;
        try {
          result = handler(message.params);
        } catch (error) {
          refuse(error);
          return;
        }
        if (result instanceof Promise) {
          // Answered when it settles (a summary call on pi's model), unless the connection closed meanwhile.
          result.then(
            (value) => this.closedWith || this.write({ jsonrpc: '2.0', id, result: value ?? null }),
            (error) => this.closedWith || refuse(error),
          );
          return;
        }
        this.write({ jsonrpc: '2.0', id: message.id, result: result ?? null });
      } else {
        this.write({ jsonrpc: '2.0', id: message.id, error: { code: -32601, message: `unhandled method ${message.method}` } });
      }
      return;
    }
    for (const handler of this.notificationHandlers.get(message.method) ?? []) {
      try {
        handler(message.params);
      } catch {
        // A notification handler's failure must not stop the connection.
      }
    }
  }
}
