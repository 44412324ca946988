/** Files outside the extension that the tests compare against. */
import { resolve } from 'node:path';

/** The repository root: editors/vscode/out/test is four levels below it. */
export const REPO_ROOT = resolve(__dirname, '..', '..', '..', '..');
export const EXTENSION_ROOT = resolve(__dirname, '..', '..');
