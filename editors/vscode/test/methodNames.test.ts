import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { describe, it } from 'node:test';
import * as protocol from '../src/protocol';
import { REPO_ROOT } from './paths';

/** `NAME = "value"` and `NAME = -123` assignments at the top level of a Python module. */
function pythonConstants(file: string): Map<string, string | number> {
  const constants = new Map<string, string | number>();
  const text = readFileSync(resolve(REPO_ROOT, 'protocol', file), 'utf8');
  for (const match of text.matchAll(/^([A-Z][A-Z0-9_]*)\s*=\s*(?:"([^"]*)"|'([^']*)'|(-?\d+))\s*$/gm)) {
    constants.set(match[1], match[4] !== undefined ? Number(match[4]) : (match[2] ?? match[3]));
  }
  return constants;
}

describe('protocol constants match the Python protocol package', () => {
  const methods = pythonConstants('methods.py');
  const errors = pythonConstants('errors.py');

  it('has every method name of protocol/methods.py, under the same constant name', () => {
    const python = [...methods].filter(([, value]) => typeof value === 'string' && value.includes('/'));
    assert.ok(python.length >= 10, 'methods.py parsed to too few method names');
    assert.deepEqual(Object.entries(protocol.Methods).sort(), python.sort());
  });

  it('has the same protocol version, names and settings section', () => {
    assert.equal(protocol.PROTOCOL_VERSION, methods.get('PROTOCOL_VERSION'));
    assert.equal(protocol.SERVER_NAME, methods.get('SERVER_NAME'));
    assert.equal(protocol.EXPERIMENTAL_KEY, methods.get('EXPERIMENTAL_KEY'));
    assert.equal(protocol.SETTINGS_SECTION, methods.get('SETTINGS_SECTION'));
  });

  it('has every error code of protocol/errors.py', () => {
    assert.ok(errors.size >= 10, 'errors.py parsed to too few codes');
    assert.deepEqual(Object.entries(protocol.ErrorCodes).sort(), [...errors].sort());
  });

  it('declares the contributed commands in package.json', () => {
    const manifest = JSON.parse(readFileSync(resolve(__dirname, '..', '..', 'package.json'), 'utf8'));
    const commands = manifest.contributes.commands.map((c: { command: string }) => c.command).sort();
    assert.deepEqual(commands, [
      'contextSidecar.compact',
      'contextSidecar.expandSummary',
      'contextSidecar.listSessions',
      'contextSidecar.restart',
      'contextSidecar.selectSession',
      'contextSidecar.showUsage',
    ]);
    const compact = manifest.contributes.commands.find((c: { command: string }) => c.command === 'contextSidecar.compact');
    assert.equal(compact.title, 'Context Sidecar: Compact Context…');
  });
});
