import assert from 'node:assert/strict';
import { PassThrough } from 'node:stream';
import { describe, it } from 'node:test';
import { Connection, ConnectionClosed, frame, FrameReader, RequestTimeout, RpcError } from '../src/rpc';

/** A connection and the other end of its streams, read frame by frame. */
function pair() {
  const toClient = new PassThrough();
  const toServer = new PassThrough();
  const connection = new Connection(toClient, toServer);
  const reader = new FrameReader();
  const received: any[] = [];
  const waiters: Array<() => void> = [];
  toServer.on('data', (chunk: Buffer) => {
    received.push(...reader.push(chunk).map((body) => JSON.parse(body)));
    waiters.splice(0).forEach((wake) => wake());
  });
  const next = async (): Promise<any> => {
    while (received.length === 0) {
      await new Promise<void>((resolve) => waiters.push(resolve));
    }
    return received.shift();
  };
  const send = (message: unknown) => toClient.write(frame(JSON.stringify(message)));
  return { connection, next, send, toClient };
}

describe('LSP framing', () => {
  it('counts Content-Length in bytes and reassembles bodies split anywhere', () => {
    const body = JSON.stringify({ text: 'héllo — 日本' });
    const bytes = Buffer.concat([frame(body), frame('{"n":2}')]);
    assert.match(bytes.toString('utf8'), new RegExp(`^Content-Length: ${Buffer.byteLength(body)}\r\n\r\n`));
    const reader = new FrameReader();
    const bodies: string[] = [];
    for (let i = 0; i < bytes.length; i += 3) {
      bodies.push(...reader.push(bytes.subarray(i, i + 3)));
    }
    assert.deepEqual(bodies, [body, '{"n":2}']);
  });

  it('refuses a header without Content-Length', () => {
    assert.throws(() => new FrameReader().push(Buffer.from('X: 1\r\n\r\n{}')), /without Content-Length/);
  });
});

describe('JSON-RPC connection', () => {
  it('matches answers to requests, and errors to RpcError with their code', async () => {
    const { connection, next, send } = pair();
    const first = connection.request('a/b', { x: 1 });
    const second = connection.request('c/d', {});
    const [r1, r2] = [await next(), await next()];
    assert.deepEqual([r1.method, r1.params, r2.method], ['a/b', { x: 1 }, 'c/d']);
    send({ jsonrpc: '2.0', id: r2.id, error: { code: -32001, message: 'unknown session', data: { field: 'sessionId' } } });
    send({ jsonrpc: '2.0', id: r1.id, result: { ok: true } });
    assert.deepEqual(await first, { ok: true });
    await assert.rejects(second, (error: unknown) => error instanceof RpcError && error.code === -32001 && (error.data as any).field === 'sessionId');
  });

  it('says when it is busy, so the process is kept alive only while a request waits', async () => {
    const { connection, next, send } = pair();
    const states: boolean[] = [];
    connection.onBusyChange = (busy) => states.push(busy);
    const a = connection.request('x', null);
    const b = connection.request('y', null);
    const [ra, rb] = [await next(), await next()];
    send({ jsonrpc: '2.0', id: ra.id, result: 1 });
    await a;
    send({ jsonrpc: '2.0', id: rb.id, result: 2 });
    await b;
    assert.deepEqual(states, [true, false]);
  });

  it('cancels a request on abort with $/cancelRequest, and one that is not answered in time', async () => {
    const { connection, next, send } = pair();
    const controller = new AbortController();
    const pending = connection.request('slow', null, { signal: controller.signal });
    const request = await next();
    controller.abort();
    assert.deepEqual(await next(), { jsonrpc: '2.0', method: '$/cancelRequest', params: { id: request.id } });
    send({ jsonrpc: '2.0', id: request.id, error: { code: -32800, message: 'cancelled' } });
    await assert.rejects(pending, (error: unknown) => error instanceof RpcError && error.code === -32800);

    const late = connection.request('late', null, { timeoutMs: 20 });
    const lateRequest = await next();
    await assert.rejects(late, RequestTimeout);
    assert.deepEqual(await next(), { jsonrpc: '2.0', method: '$/cancelRequest', params: { id: lateRequest.id } });
  });

  it("answers the server's requests: with the handler's result, else method not found", async () => {
    const { connection, next, send } = pair();
    connection.onRequest('workspace/configuration', (params: any) => params.items.map(() => ({ a: 1 })));
    send({ jsonrpc: '2.0', id: 7, method: 'workspace/configuration', params: { items: [{ section: 'contextSidecar' }] } });
    assert.deepEqual(await next(), { jsonrpc: '2.0', id: 7, result: [{ a: 1 }] });
    send({ jsonrpc: '2.0', id: 8, method: 'something/else', params: {} });
    const reply = await next();
    assert.equal(reply.id, 8);
    assert.equal(reply.error.code, -32601);
  });

  it('delivers notifications, and rejects everything pending when the server goes away', async () => {
    const { connection, next, send, toClient } = pair();
    const seen: unknown[] = [];
    connection.onNotification('context/didChangeUsage', (params) => seen.push(params));
    send({ jsonrpc: '2.0', method: 'context/didChangeUsage', params: { percent: 5 } });
    const pending = connection.request('never', null);
    await next();
    assert.deepEqual(seen, [{ percent: 5 }]);
    toClient.end();
    await assert.rejects(pending, (error: unknown) => error instanceof ConnectionClosed && /closed its output/.test(error.message));
    await assert.rejects(connection.request('after', null), ConnectionClosed);
  });

  it('closes on a body that is not JSON', async () => {
    const { connection, next, toClient } = pair();
    const pending = connection.request('x', null);
    await next();
    toClient.write(Buffer.from('Content-Length: 3\r\n\r\n{{{'));
    await assert.rejects(pending, /not JSON/);
  });
});
