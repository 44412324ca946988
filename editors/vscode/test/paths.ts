/** Files outside the extension that the tests compare against. */
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';

/** The repository root: editors/vscode/out/test is four levels below it. */
export const REPO_ROOT = resolve(__dirname, '..', '..', '..', '..');
export const EXTENSION_ROOT = resolve(__dirname, '..', '..');

/** shared/PROTOCOL.md beside the clone, as on developer machines and CI; undefined when absent. */
export function protocolDoc(): string | undefined {
  const path = resolve(REPO_ROOT, '..', 'shared', 'PROTOCOL.md');
  return existsSync(path) ? path : undefined;
}
