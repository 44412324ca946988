/** The real context-sidecar for the tests: the command and a fresh database. */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Sidecar } from '../src/sidecar';

/** `CONTEXT_SIDECAR_COMMAND` (split on spaces, so `python -m sidecar` works), else `context-sidecar` on PATH. */
export function sidecarCommand(): string[] {
  const configured = process.env.CONTEXT_SIDECAR_COMMAND?.trim();
  return configured ? configured.split(/\s+/) : ['context-sidecar'];
}

export interface TestServer {
  sidecar: Sidecar;
  dir: string;
  db: string;
  close(): Promise<void>;
}

/** A started sidecar on a fresh database in a temporary directory (its workspace too). */
export async function startServer(initializationOptions: Record<string, unknown> = {}): Promise<TestServer> {
  const dir = mkdtempSync(join(tmpdir(), 'ctx-sidecar-pi-'));
  const db = join(dir, 'memory.duckdb');
  const sidecar = Sidecar.start({ command: sidecarCommand(), db, cwd: dir, initializationOptions });
  await sidecar.ready;
  return {
    sidecar,
    dir,
    db,
    async close() {
      await sidecar.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
