/**
 * The extension's settings: how to start the server, and the protocol settings that are
 * forwarded as `initializationOptions` and `workspace/didChangeConfiguration`.
 */

import { AGENT_ENV_NAMES } from './protocol';

/** Protocol settings, as dotted keys under `contextSidecar.` (and in the protocol's Settings object). */
export const PROTOCOL_SETTING_KEYS = [
  'storage.path',
  'storage.memoryLimit',
  'storage.share',
  'contextWindow',
  'compaction.auto',
  'compaction.mode',
  'compaction.maxTokens',
  'compaction.threshold',
  'compaction.reserveTokens',
  'compaction.suggestAt',
  'compaction.freshTail',
  'compaction.keepRecentTokens',
  'compaction.leafChunkSize',
  'compaction.condensedMinFanout',
  'compaction.maxRounds',
  'compaction.hookTimeoutSeconds',
  'compaction.minSavings',
  'compaction.summarizeAhead',
  'prune.enabled',
  'prune.protectTokens',
  'prune.minimumTokens',
  'prune.maxTokensPerPart',
  'prune.protectedTools',
  'prune.postponeCompaction',
  'prune.cacheReadPrice',
  'prune.cacheWritePrice',
  'llm.baseUrl',
  'llm.model',
  'llm.apiKeyEnv',
  'llm.timeoutSeconds',
  'llm.maxConcurrency',
  'llm.temperature',
  'llm.maxCallsPerMinute',
  'llm.contextWindow',
  'models',
  'agents.transcriptDirectories',
] as const;

/** Protocol settings the server reads only at start: changing one restarts it. */
export const RESTART_SETTING_SECTIONS = ['serverCommand', 'serverArgs', 'storage'] as const;

/** Settings of the extension itself, never sent to the server (it reports unknown keys). */
export const EXTENSION_SETTING_KEYS = [
  'serverCommand',
  'serverArgs',
  'trace.server',
  'followWorkspace',
  'watchAgents',
] as const;

export type SettingLookup = (key: string) => unknown;

/** The variables of an environment that say where agents keep their transcripts, as `memory/watch` takes them. */
export function agentEnv(env: NodeJS.ProcessEnv = process.env): Record<string, string> {
  const found: Record<string, string> = {};
  for (const name of AGENT_ENV_NAMES) {
    const value = env[name];
    if (value) {
      found[name] = value;
    }
  }
  return found;
}

/**
 * The protocol Settings object holding only what the user set explicitly: the server owns the
 * defaults, and a setting the user removes goes back to the server's default on the next change.
 */
export function protocolSettings(explicitValue: SettingLookup): Record<string, unknown> {
  const settings: Record<string, unknown> = {};
  for (const key of PROTOCOL_SETTING_KEYS) {
    const value = explicitValue(key);
    if (value !== undefined) {
      setPath(settings, key.split('.'), value);
    }
  }
  return settings;
}

function setPath(target: Record<string, unknown>, path: string[], value: unknown): void {
  let node = target;
  for (const part of path.slice(0, -1)) {
    const next = node[part];
    if (typeof next !== 'object' || next === null) {
      node[part] = {};
    }
    node = node[part] as Record<string, unknown>;
  }
  node[path[path.length - 1]] = value;
}

export interface ServerLaunch {
  command: string;
  args: string[];
}

/** The command line from `serverCommand` and `serverArgs`; an empty command means the default. */
export function serverLaunch(command: unknown, args: unknown): ServerLaunch {
  const cmd = typeof command === 'string' && command.trim() ? command.trim() : 'context-sidecar';
  const list = Array.isArray(args) ? args.filter((a): a is string => typeof a === 'string') : [];
  return { command: cmd, args: list };
}
