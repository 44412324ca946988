// The part of pi's model API (`@mariozechner/pi-ai`, which pi hands to its extensions) that the summary calls use;
// the extension has no dependencies, so it is declared here, as src/pi.ts declares pi's extension API.
declare module '@mariozechner/pi-ai' {
  export interface SimpleAssistantMessage {
    stopReason: string;
    errorMessage?: string;
    model?: string;
    content: Array<{ type: string; text?: string }>;
    usage?: { input: number; output: number; cacheRead: number; cacheWrite: number };
  }
  export function completeSimple(
    model: unknown,
    context: { systemPrompt: string; messages: unknown[] },
    options: { maxTokens?: number; signal?: AbortSignal; apiKey?: string; headers?: Record<string, string> },
  ): Promise<SimpleAssistantMessage>;
}
