/** The server's summary calls (`context/summarize`) run on pi's current model, with pi's own credentials. */

import { completeSimple } from '@mariozechner/pi-ai';
import type { ContextView } from './pi';
import { RpcError } from './rpc';

/** The server's code for a summarizer that failed: it then writes that summary deterministically. */
const SUMMARIZER_FAILED = -32010;

export interface SummarizeParams {
  sessionId: string;
  kind: string;
  messages: Array<{ role: string; content: unknown }>;
  maxTokens: number;
  deadlineSeconds: number;
}

export interface SummarizeResult {
  text: string;
  model: string;
  usage?: { inputTokens: number; outputTokens: number; cacheReadTokens: number; cacheWriteTokens: number };
}

/**
 * One summary call on the model pi talks to now, as pi's own compaction calls it (the model registry's key and
 * headers, pi's completion API), given up after the server's deadline. The credential stays in pi.
 */
export async function summarize(params: SummarizeParams, ctx: ContextView | undefined): Promise<SummarizeResult> {
  const model = ctx?.model;
  if (!ctx || !model) {
    throw new RpcError(SUMMARIZER_FAILED, 'pi has no model selected');
  }
  const auth = await ctx.modelRegistry.getApiKeyAndHeaders(model);
  if (!auth.ok) {
    throw new RpcError(SUMMARIZER_FAILED, auth.error);
  }
  const text = (role: string) =>
    (params.messages ?? [])
      .filter((message) => (message.role === 'system') === (role === 'system'))
      .map((message) => (typeof message.content === 'string' ? message.content : ''))
      .join('\n\n');
  const seconds = Number(params.deadlineSeconds) > 0 ? Number(params.deadlineSeconds) : 120;
  const response = await completeSimple(
    model,
    { systemPrompt: text('system'), messages: [{ role: 'user', content: [{ type: 'text', text: text('user') }], timestamp: Date.now() }] },
    { maxTokens: params.maxTokens, signal: AbortSignal.timeout(seconds * 1000), apiKey: auth.apiKey, headers: auth.headers },
  );
  if (response.stopReason === 'error' || response.stopReason === 'aborted') {
    throw new RpcError(SUMMARIZER_FAILED, `pi's model answered no summary: ${response.errorMessage ?? response.stopReason}`);
  }
  const summary = response.content
    .filter((part) => part.type === 'text')
    .map((part) => part.text ?? '')
    .join('\n');
  const usage = response.usage;
  return {
    text: summary,
    model: model.id,
    usage: usage && {
      inputTokens: usage.input + usage.cacheRead + usage.cacheWrite,
      outputTokens: usage.output,
      cacheReadTokens: usage.cacheRead,
      cacheWriteTokens: usage.cacheWrite,
    },
  };
}
