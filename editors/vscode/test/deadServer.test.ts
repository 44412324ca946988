import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { describe, it } from 'node:test';
import { createMessageConnection, ResponseError, StreamMessageReader, StreamMessageWriter } from 'vscode-jsonrpc/node';
import { Methods } from '../src/protocol';
import { sidecarCommand } from './helpers';

describe('a server whose pipe is gone', () => {
  // vscode-jsonrpc 8.2.0 rethrows a failed request write inside a `new Promise(async …)` executor:
  // besides rejecting the request, every such write left an unhandled rejection ("write EPIPE",
  // "ERR_STREAM_DESTROYED"). The extension sends requests while a crashed server's close is still
  // unseen (the usage refresh after a restart), and node:test failed whichever test was running.
  // scripts/patch-vscode-jsonrpc.mjs (postinstall) removes the rethrow, as vscode-jsonrpc 9.0.3 did.
  it('fails the request for its caller and leaves no unhandled rejection', async () => {
    const unhandled: unknown[] = [];
    const record = (reason: unknown) => unhandled.push(reason);
    process.on('unhandledRejection', record);
    const [command, ...args] = sidecarCommand();
    const child = spawn(command, [...args, '--db', ':memory:', '--stdio'], { stdio: ['pipe', 'pipe', 'ignore'] });
    const exited = new Promise((resolve) => child.on('exit', resolve));
    const connection = createMessageConnection(new StreamMessageReader(child.stdout!), new StreamMessageWriter(child.stdin!));
    connection.onError(() => undefined);
    connection.listen();
    try {
      await connection.sendRequest('initialize', { processId: process.pid, rootUri: null, capabilities: {} });
      // The pipe breaks before the connection has seen a close, as when the server has just died.
      child.stdin!.destroy();
      const request = connection.sendRequest(Methods.CONTEXT_USAGE, { sessionId: 'any' });
      await assert.rejects(request, (error: unknown) => error instanceof ResponseError);
      // Unhandled rejections are reported once the microtask queue drains, before the next macrotask.
      await new Promise((resolve) => setImmediate(resolve));
      assert.deepEqual(unhandled.map(String), []);
    } finally {
      process.off('unhandledRejection', record);
      child.kill('SIGKILL');
      await exited;
      connection.dispose();
    }
  });
});
