/** Status text for a Usage, shared by the status bar item and `showUsage`; no `vscode` import. */
import { Usage, UsageState } from './protocol';

export type StatusLook = 'normal' | 'warning' | 'error';

export interface StatusView {
  /** Status bar text, with a `$(codicon)` prefix. */
  text: string;
  /** The same without the icon, e.g. `ctx 72% suggest: click to compact and free up context`. */
  plain: string;
  tooltip: string;
  look: StatusLook;
}

const ICONS: Record<UsageState, string> = {
  ok: '$(pulse)',
  suggest: '$(lightbulb)',
  compact: '$(warning)',
  compacting: '$(sync~spin)',
  overflow: '$(error)',
};

const LOOKS: Record<UsageState, StatusLook> = {
  ok: 'normal',
  suggest: 'normal',
  compact: 'warning',
  compacting: 'warning',
  overflow: 'error',
};

/**
 * What to do, per state, in this editor's terms: the status bar item compacts when clicked in these
 * states. The server's own `hint` says "type /compact", a chat command, so it is not shown.
 */
const HINTS: Partial<Record<UsageState, string>> = {
  suggest: 'click to compact and free up context',
  compact: 'click to compact now',
  overflow: 'click to compact, or older messages are dropped',
};

/** The action for a state, e.g. `click to compact now`; undefined for `ok` and `compacting`. */
export function shortHint(usage: Usage): string | undefined {
  return HINTS[usage.state];
}

export function formatPercent(percent: number): string {
  return `${Math.round(percent)}%`;
}

/** `ctx 72% suggest: click to compact and free up context`, `ctx 80% compacting…`, `ctx 12%`. */
export function statusText(usage: Usage | undefined): string {
  if (!usage) {
    return 'ctx –';
  }
  const percent = `ctx ${formatPercent(usage.percent)}`;
  if (usage.state === 'ok') {
    return percent;
  }
  if (usage.state === 'compacting') {
    return `${percent} compacting…`;
  }
  const hint = shortHint(usage);
  return hint ? `${percent} ${usage.state}: ${hint}` : `${percent} ${usage.state}`;
}

export function formatTokens(tokens: number): string {
  return tokens.toLocaleString('en-US');
}

export function statusTooltip(usage: Usage | undefined, sessionId: string | undefined): string {
  if (!usage) {
    return sessionId
      ? `Context Sidecar: no usage yet for session ${sessionId}`
      : 'Context Sidecar: no session yet';
  }
  const lines = [
    `Session ${usage.sessionId}`,
    `${formatTokens(usage.tokens)} of ${formatTokens(usage.contextWindow)} tokens (${usage.percent}%), ` +
      `${usage.source === 'provider' ? 'as the provider reported' : 'estimated'}`,
    `Compaction threshold: ${formatTokens(usage.threshold)} tokens`,
    `${usage.messages} messages, ${usage.summaries} summaries`,
  ];
  const cache = cacheText(usage);
  if (cache) {
    lines.push(cache);
  }
  if (shortHint(usage)) {
    lines.push('To compact: click the status bar item, or run Context Sidecar: Compact Context…');
  }
  return lines.join('\n');
}

/** `Prompt cache hit rate: 80% last call, 64% smoothed`; undefined when the server sent neither figure. */
export function cacheText(usage: Usage): string | undefined {
  const parts: string[] = [];
  if (typeof usage.cacheHitRate === 'number') {
    parts.push(`${Math.round(usage.cacheHitRate * 100)}% last call`);
  }
  if (typeof usage.cacheHitRateSmoothed === 'number') {
    parts.push(`${Math.round(usage.cacheHitRateSmoothed * 100)}% smoothed`);
  }
  return parts.length ? `Prompt cache hit rate: ${parts.join(', ')}` : undefined;
}

export function formatStatus(usage: Usage | undefined, sessionId?: string): StatusView {
  const plain = statusText(usage);
  const icon = usage ? ICONS[usage.state] ?? ICONS.ok : '$(pulse)';
  return {
    text: `${icon} ${plain}`,
    plain,
    tooltip: statusTooltip(usage, sessionId ?? usage?.sessionId),
    look: usage ? LOOKS[usage.state] ?? 'normal' : 'normal',
  };
}
