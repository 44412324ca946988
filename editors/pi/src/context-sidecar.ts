/**
 * context-sidecar for pi: every LLM call sends the sidecar's assembled context, pi's compaction goes
 * through the sidecar, and the model gets the memory tools. Load with `pi -e <this directory>`; see
 * README.md.
 */
import { PiSidecar } from './extension';
import type { ExtensionApi } from './pi';

export default function contextSidecar(pi: ExtensionApi): void {
  new PiSidecar(pi).register();
}
