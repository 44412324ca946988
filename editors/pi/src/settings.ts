/**
 * The extension's settings: the `contextSidecar` object of pi's settings files (the global
 * `<agent dir>/settings.json`, then the project's `.pi/settings.json`), then environment variables.
 */
import { readFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';

export const SETTINGS_KEY = 'contextSidecar';
/** pi's default `compaction.reserveTokens`. */
export const PI_RESERVE_TOKENS = 16384;

export interface Settings {
  /** False turns the extension off: pi runs as if it were not loaded. */
  enabled: boolean;
  /** The server's command line (`context-sidecar` and its arguments). */
  command: string[];
  /** The DuckDB file (`--db`); unset: the server's per-user default, shared with editors. */
  db?: string;
  /** The window pi's prompts are assembled within; unset: the model's `contextWindow`. */
  contextWindow?: number;
  /** Tokens kept free for the answer (and pi's auto-compaction margin): pi's `compaction.reserveTokens`. */
  reserveTokens: number;
  /** pi's own `compaction.reserveTokens`: pi asks to compact once a prompt is over its window less this. */
  piReserveTokens: number;
  /** pi's own `compaction.enabled`. */
  piCompaction: boolean;
  /** The server's own settings (`initializationOptions`, docs/configuration.md). */
  sidecar: Record<string, unknown>;
}

/** What settings come from: the parsed files (undefined when absent) and the environment. */
export interface SettingsSources {
  global?: unknown;
  project?: unknown;
  env: Record<string, string | undefined>;
}

export interface Resolved {
  settings: Settings;
  /** Values ignored, each saying where and why (for one notice). */
  problems: string[];
}

type Json = Record<string, unknown>;

function isRecord(value: unknown): value is Json {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** pi's agent directory: `PI_CODING_AGENT_DIR` (with `~`), else `~/.pi/agent`. */
export function agentDir(env: Record<string, string | undefined>, home = homedir()): string {
  const dir = env.PI_CODING_AGENT_DIR;
  if (dir) {
    return dir === '~' ? home : dir.startsWith('~/') ? home + dir.slice(1) : dir;
  }
  return join(home, '.pi', 'agent');
}

/** A settings file's JSON: undefined when it does not exist, a problem when it is not a JSON object. */
export function readSettingsFile(path: string, problems: string[]): unknown {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch {
    return undefined;
  }
  try {
    const value = JSON.parse(text);
    if (isRecord(value)) {
      return value;
    }
    problems.push(`${path} is not a JSON object`);
  } catch (error) {
    problems.push(`${path} is not valid JSON (${(error as Error).message})`);
  }
  return undefined;
}

/** Reads pi's two settings files for `cwd`. */
export function readSources(cwd: string, env: Record<string, string | undefined>, problems: string[]): SettingsSources {
  return {
    global: readSettingsFile(join(agentDir(env), 'settings.json'), problems),
    project: readSettingsFile(join(cwd, '.pi', 'settings.json'), problems),
    env,
  };
}

function deepMerge(base: Json, over: Json): Json {
  const out: Json = { ...base };
  for (const [key, value] of Object.entries(over)) {
    out[key] = isRecord(value) && isRecord(out[key]) ? deepMerge(out[key] as Json, value) : value;
  }
  return out;
}

function section(file: unknown, key: string): Json {
  return isRecord(file) && isRecord(file[key]) ? (file[key] as Json) : {};
}

function splitCommand(line: string): string[] {
  return line.trim().split(/\s+/).filter(Boolean);
}

function positiveInt(value: unknown): number | undefined {
  const n = typeof value === 'string' && value.trim() ? Number(value) : value;
  return typeof n === 'number' && Number.isInteger(n) && n > 0 ? n : undefined;
}

function nonNegativeInt(value: unknown): number | undefined {
  const n = typeof value === 'string' && value.trim() ? Number(value) : value;
  return typeof n === 'number' && Number.isInteger(n) && n >= 0 ? n : undefined;
}

const OFF = new Set(['0', 'off', 'false', 'no']);
const ON = new Set(['1', 'on', 'true', 'yes']);

/** The settings from their sources; a value of the wrong type is reported and left at its default. */
export function resolveSettings(sources: SettingsSources): Resolved {
  const problems: string[] = [];
  const file = deepMerge(section(sources.global, SETTINGS_KEY), section(sources.project, SETTINGS_KEY));
  const piCompaction = deepMerge(section(sources.global, 'compaction'), section(sources.project, 'compaction'));
  const where = `settings.json "${SETTINGS_KEY}"`;
  const settings: Settings = {
    enabled: true,
    command: ['context-sidecar'],
    reserveTokens: PI_RESERVE_TOKENS,
    piReserveTokens: PI_RESERVE_TOKENS,
    piCompaction: piCompaction.enabled !== false,
    sidecar: {},
  };

  const reserve = nonNegativeInt(piCompaction.reserveTokens);
  if (reserve !== undefined) {
    settings.reserveTokens = settings.piReserveTokens = reserve;
  }
  if (file.enabled !== undefined) {
    if (typeof file.enabled === 'boolean') {
      settings.enabled = file.enabled;
    } else {
      problems.push(`${where}.enabled must be true or false`);
    }
  }
  if (file.command !== undefined) {
    const command =
      typeof file.command === 'string'
        ? splitCommand(file.command)
        : Array.isArray(file.command) && file.command.every((a) => typeof a === 'string')
          ? (file.command as string[])
          : [];
    if (command.length && command[0]) {
      settings.command = command;
    } else {
      problems.push(`${where}.command must be a command line or a non-empty list of strings`);
    }
  }
  if (file.db !== undefined) {
    if (typeof file.db === 'string' && file.db) {
      settings.db = file.db;
    } else {
      problems.push(`${where}.db must be a file path`);
    }
  }
  if (file.contextWindow !== undefined) {
    settings.contextWindow = positiveInt(file.contextWindow);
    if (settings.contextWindow === undefined) {
      problems.push(`${where}.contextWindow must be a positive integer`);
    }
  }
  if (file.reserveTokens !== undefined) {
    const value = nonNegativeInt(file.reserveTokens);
    if (value === undefined) {
      problems.push(`${where}.reserveTokens must be a non-negative integer`);
    } else {
      settings.reserveTokens = value;
    }
  }
  if (file.settings !== undefined) {
    if (isRecord(file.settings)) {
      settings.sidecar = file.settings;
    } else {
      problems.push(`${where}.settings must be an object (the server's settings)`);
    }
  }

  const env = sources.env;
  const enabled = env.CONTEXT_SIDECAR_PI?.trim().toLowerCase();
  if (enabled) {
    if (OFF.has(enabled) || ON.has(enabled)) {
      settings.enabled = ON.has(enabled);
    } else {
      problems.push('CONTEXT_SIDECAR_PI must be on or off');
    }
  }
  if (env.CONTEXT_SIDECAR_COMMAND?.trim()) {
    settings.command = splitCommand(env.CONTEXT_SIDECAR_COMMAND);
  }
  if (env.CONTEXT_SIDECAR_DB) {
    settings.db = env.CONTEXT_SIDECAR_DB;
  }
  if (env.CONTEXT_SIDECAR_CONTEXT_WINDOW) {
    const value = positiveInt(env.CONTEXT_SIDECAR_CONTEXT_WINDOW);
    if (value === undefined) {
      problems.push('CONTEXT_SIDECAR_CONTEXT_WINDOW must be a positive integer');
    } else {
      settings.contextWindow = value;
    }
  }
  if (env.CONTEXT_SIDECAR_RESERVE_TOKENS) {
    const value = nonNegativeInt(env.CONTEXT_SIDECAR_RESERVE_TOKENS);
    if (value === undefined) {
      problems.push('CONTEXT_SIDECAR_RESERVE_TOKENS must be a non-negative integer');
    } else {
      settings.reserveTokens = value;
    }
  }
  return { settings, problems };
}

/** The server's settings as sent: the user's, with the reserve pi keeps unless they set one themselves. */
export function initializationOptions(settings: Settings): Record<string, unknown> {
  const compaction = isRecord(settings.sidecar.compaction) ? settings.sidecar.compaction : {};
  if (compaction.reserveTokens !== undefined) {
    return settings.sidecar;
  }
  return { ...settings.sidecar, compaction: { ...compaction, reserveTokens: settings.reserveTokens } };
}
