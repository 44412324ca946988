/** An OpenAI-compatible chat completions endpoint on 127.0.0.1, streamed or not, for summarizer tests. */
import { createServer, IncomingMessage, Server, ServerResponse } from 'node:http';
import { AddressInfo } from 'node:net';

export interface FakeLlm {
  baseUrl: string;
  /** The JSON bodies received, in order. */
  requests: any[];
  /** Resolves when the next request arrives (or at once if one already has). */
  firstRequest: Promise<void>;
  close(): Promise<void>;
}

/** `reply` is the summary text; `hang` holds every request open until `close`. */
export async function startFakeLlm(options: { reply?: string; hang?: boolean }): Promise<FakeLlm> {
  const requests: any[] = [];
  const held: ServerResponse[] = [];
  let arrived: () => void = () => {};
  const firstRequest = new Promise<void>((resolve) => {
    arrived = resolve;
  });
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    let body = '';
    req.on('data', (chunk) => {
      body += chunk;
    });
    req.on('end', () => {
      const parsed = body ? JSON.parse(body) : undefined;
      requests.push(parsed);
      arrived();
      if (options.hang) {
        held.push(res);
        return;
      }
      answer(res, parsed, options.reply ?? 'A short summary of the work so far.');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    baseUrl: `http://127.0.0.1:${port}/v1`,
    requests,
    firstRequest,
    async close() {
      held.forEach((res) => res.destroy());
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

function answer(res: ServerResponse, body: any, text: string): void {
  const base = { id: 'chatcmpl-fake', created: 0, model: body?.model ?? 'fake' };
  if (body?.stream) {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    const words = text.split(/(?<= )/);
    for (const piece of [...words.map((content) => ({ content })), {}]) {
      const done = Object.keys(piece).length === 0;
      const chunk = {
        ...base,
        object: 'chat.completion.chunk',
        choices: [{ index: 0, delta: piece, finish_reason: done ? 'stop' : null }],
      };
      res.write(`data: ${JSON.stringify(chunk)}\n\n`);
    }
    res.end('data: [DONE]\n\n');
    return;
  }
  res.writeHead(200, { 'content-type': 'application/json' });
  res.end(
    JSON.stringify({
      ...base,
      object: 'chat.completion',
      choices: [{ index: 0, message: { role: 'assistant', content: text }, finish_reason: 'stop' }],
      usage: { prompt_tokens: 100, completion_tokens: 10, total_tokens: 110 },
    }),
  );
}
