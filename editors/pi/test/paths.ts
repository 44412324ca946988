/** Files outside the extension that the tests read. */
import { resolve } from 'node:path';

/** The repository root: editors/pi/out/test is four levels below it. */
export const REPO_ROOT = resolve(__dirname, '..', '..', '..', '..');
export const PI_FIXTURE = resolve(REPO_ROOT, 'tests', 'fixtures', 'pi-v3-thinking.jsonl');
