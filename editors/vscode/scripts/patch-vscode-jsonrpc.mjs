// Backports a fix of vscode-jsonrpc 9.0.3 to the 8.2.0 that vscode-languageclient 9 depends on (run
// as `postinstall`, so the tests and the bundle both get it). When a request cannot be written (the
// server has just died, its close not yet seen), 8.2.0 rejects the request for its caller and then
// also rethrows inside a `new Promise(async …)` executor, where nothing can catch it: an unhandled
// rejection ("write EPIPE", "ERR_STREAM_DESTROYED") that VS Code logs and node:test counts as a
// failure. test/deadServer.test.ts fails without this. Fails loudly when the code is not as expected.
import { readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';

const require = createRequire(import.meta.url);
const root = dirname(require.resolve('vscode-jsonrpc/package.json'));
const { version } = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
const file = join(root, 'lib', 'common', 'connection.js');
const UNPATCHED = "'Unknown reason'));\n                    throw error;";
const PATCHED = "'Unknown reason'));\n                    // context-sidecar: no rethrow (as upstream since 9.0.3).";

if (version !== '8.2.0') {
  console.error(`patch-vscode-jsonrpc: written for vscode-jsonrpc 8.2.0, found ${version}; check whether it is still needed`);
  process.exit(1);
}
const source = readFileSync(file, 'utf8');
if (!source.includes(PATCHED)) {
  if (source.split(UNPATCHED).length !== 2) {
    console.error(`patch-vscode-jsonrpc: the code to patch is not in ${file}`);
    process.exit(1);
  }
  writeFileSync(file, source.replace(UNPATCHED, PATCHED));
}
