import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { branchMessages } from '../src/wire';
import { AssembleResult, ErrorCodes, IngestResult, MEMORY_TOOLS, Methods, REQUIRED_METHODS } from '../src/protocol';
import { Sidecar } from '../src/sidecar';
import { readSessionFile } from './entries';
import { PI_FIXTURE } from './paths';
import { startServer, TestServer } from './server';

describe('against a real context-sidecar', () => {
  let server: TestServer;
  before(async () => {
    server = await startServer();
  });
  after(async () => {
    await server?.close();
  });

  it('defines the memory tools byte for byte as the server does', async () => {
    await server.sidecar.request(Methods.MEMORY_INGEST, { sessionId: 'tools', messages: [{ role: 'user', content: 'hi' }] });
    const result = await server.sidecar.request<AssembleResult & { tools: unknown }>(Methods.CONTEXT_ASSEMBLE, {
      sessionId: 'tools',
      tools: true,
    });
    assert.deepEqual(result.tools, MEMORY_TOOLS);
    assert.equal(JSON.stringify(result.tools), JSON.stringify(MEMORY_TOOLS), 'the same bytes, keys in the same order');
  });

  it('stores a pi session under the ids memory/import gives it, so neither stores a message twice', async () => {
    const { branch } = readSessionFile(PI_FIXTURE);
    const { messages } = branchMessages(branch);
    const ingested = await server.sidecar.request<IngestResult>(Methods.MEMORY_INGEST, { sessionId: 'pi-live', messages });
    assert.equal(ingested.duplicates, 0);
    const imported = await server.sidecar.request<{ ids: string[]; duplicates: number; replaced?: number }>('memory/import', {
      path: PI_FIXTURE,
      sessionId: 'pi-live',
      format: 'pi',
    });
    assert.deepEqual(imported.ids, ingested.ids);
    assert.equal(imported.duplicates, messages.length, 'every message of the file was already stored');
    assert.equal(imported.replaced ?? 0, 0, "the import leaves the extension's messages as they are");
    const again = await server.sidecar.request<IngestResult>(Methods.MEMORY_INGEST, { sessionId: 'pi-live', messages });
    assert.equal(again.duplicates, messages.length);

    await server.sidecar.request('memory/import', { path: PI_FIXTURE, sessionId: 'pi-file', format: 'pi' });
    const live = await server.sidecar.request<AssembleResult>(Methods.CONTEXT_ASSEMBLE, { sessionId: 'pi-live' });
    const file = await server.sidecar.request<AssembleResult>(Methods.CONTEXT_ASSEMBLE, { sessionId: 'pi-file' });
    assert.deepEqual(live.items.map((i) => i.id), file.items.map((i) => i.id));
    const text = (r: AssembleResult) => r.messages.map((m) => JSON.stringify([m.role, m.content, m.tool_call_id ?? null]));
    assert.deepEqual(text(live), text(file), 'the same text reaches the model either way');
  });

  it('answers every method this extension needs', async () => {
    const probe = await startServer();
    try {
      for (const method of REQUIRED_METHODS) {
        // An unknown session, not an unknown method: the server has each of them.
        await assert.rejects(probe.sidecar.request(method, { sessionId: 'none', name: 'memory_grep', arguments: '{}' }), (error: any) => error.code !== ErrorCodes.METHOD_NOT_FOUND);
      }
    } finally {
      await probe.close();
    }
  });
});

describe('a sidecar that cannot be used', () => {
  const dir = mkdtempSync(join(tmpdir(), 'ctx-sidecar-pi-bad-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('says the command was not found', async () => {
    const sidecar = Sidecar.start({ command: [join(dir, 'no-such-sidecar')], cwd: dir, initializationOptions: {} });
    await assert.rejects(sidecar.ready, /no-such-sidecar.*not found.*CONTEXT_SIDECAR_COMMAND/);
    assert.match(sidecar.unavailable ?? '', /not found/);
  });

  it('says how it exited, with the last of what it printed', async () => {
    const sidecar = Sidecar.start({
      command: [process.execPath, '-e', 'console.error("no database for you"); process.exit(3)'],
      cwd: dir,
      initializationOptions: {},
    });
    await assert.rejects(sidecar.ready, /exited with code 3: no database for you/);
  });

  it('refuses a server that does not speak protocol version 1', async () => {
    const fake = `
      let buf = Buffer.alloc(0);
      process.stdin.on('data', (c) => {
        buf = Buffer.concat([buf, c]);
        const end = buf.indexOf('\\r\\n\\r\\n');
        if (end < 0) return;
        const len = Number(/Content-Length: (\\d+)/.exec(buf.subarray(0, end).toString())[1]);
        const msg = JSON.parse(buf.subarray(end + 4, end + 4 + len).toString());
        const body = JSON.stringify({ jsonrpc: '2.0', id: msg.id, result: { serverInfo: { version: '0.0.1' }, capabilities: { experimental: { contextSidecar: { protocolVersion: 0, methods: [] } } } } });
        process.stdout.write('Content-Length: ' + Buffer.byteLength(body) + '\\r\\n\\r\\n' + body);
      });`;
    const sidecar = Sidecar.start({ command: [process.execPath, '-e', fake], cwd: dir, initializationOptions: {} });
    await assert.rejects(sidecar.ready, /context-sidecar 0\.0\.1 cannot serve pi: protocol version 0, not 1/);
  });
});
