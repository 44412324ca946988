// Type-checks the extension against pi's own declarations: `node scripts/check-pi-types.mjs PI_BINARY`,
// where PI_BINARY is a pinned pi's node_modules/.bin/pi (tests/agents installs one). The extension has
// no dependency on pi, so this is where a change in pi's extension API shows: typecheck/pi-types.ts
// assigns what pi hands over to the types of src/pi.ts, and what the extension returns to pi's.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, realpathSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const binary = process.argv[2];
if (!binary || !existsSync(binary)) {
  console.error(`usage: node scripts/check-pi-types.mjs PI_BINARY (got ${binary ?? 'nothing'})`);
  process.exit(2);
}
// node_modules/.bin/pi -> node_modules
const modules = resolve(dirname(binary), '..');
const pi = join(modules, '@mariozechner', 'pi-coding-agent');
if (!existsSync(join(pi, 'package.json'))) {
  console.error(`no @mariozechner/pi-coding-agent beside ${binary}`);
  process.exit(2);
}
const out = join(root, 'out');
mkdirSync(out, { recursive: true });
const config = join(out, 'tsconfig.pi-types.json');
writeFileSync(
  config,
  JSON.stringify({
    extends: join(root, 'tsconfig.json'),
    compilerOptions: {
      noEmit: true,
      incremental: false,
      module: 'nodenext',
      moduleResolution: 'nodenext',
      typeRoots: [join(root, 'node_modules', '@types')],
      paths: { '@mariozechner/*': [join(realpathSync(modules), '@mariozechner', '*')] },
    },
    include: [join(root, 'typecheck', 'pi-types.ts')],
  }),
);
const tsc = join(root, 'node_modules', '.bin', 'tsc');
const done = spawnSync(tsc, ['-p', config], { stdio: 'inherit' });
const version = JSON.parse(readFileSync(join(pi, 'package.json'), 'utf8')).version;
console.log(done.status === 0 ? `the extension fits pi ${version}'s extension API` : `the extension does not fit pi ${version}`);
process.exit(done.status ?? 1);
