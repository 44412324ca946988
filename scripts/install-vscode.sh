#!/usr/bin/env bash
# Builds the VS Code extension from this clone and installs it: `npm ci` in editors/vscode, the .vsix
# (an esbuild bundle packaged by @vscode/vsce 3 through npx), then `code --install-extension` on it.
# Node.js 22 or later with npm: the node on PATH when it is new enough, else Node 24 from PyPI
# (scripts/node.sh, once). CODE names the editor's command (default: code; VS Code Insiders, VSCodium
# and code-server take the same flag). --package-only builds the .vsix and installs nothing (CI runs
# that); --out FILE puts it there (default editors/vscode/context-sidecar-VERSION.vsix). Needs the npm
# registry. Exits 0 once installed (or built), 1 when a step fails, 2 on a wrong argument.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ext="$root/editors/vscode"
say() { echo "install-vscode.sh: $*" >&2; }

install=1
out=""
while [ $# -gt 0 ]; do
  case $1 in
    --package-only) install=0 ;;
    --out) [ $# -ge 2 ] || { say "--out needs a file"; exit 2; }; out=$2; shift ;;
    -h | --help) sed -n '2,9p' "$0" | cut -c3-; exit 0 ;;
    *) say "unknown argument $1 (--package-only, --out FILE)"; exit 2 ;;
  esac
  shift
done
version="$(sed -n 's/^  "version": "\(.*\)",$/\1/p' "$ext/package.json")"
out="${out:-$ext/context-sidecar-$version.vsix}"
case $out in /*) ;; *) out="$PWD/$out" ;; esac

code="${CODE:-code}"
if [ "$install" = 1 ] && ! command -v "$code" >/dev/null 2>&1; then
  say "no '$code' command: in VS Code run 'Shell Command: Install 'code' command in PATH' (F1), or set CODE"
  exit 1
fi
node_bin="$("$root/scripts/node.sh")" || { say "no Node.js 22 or later with npm, and scripts/node.sh could not install one"; exit 1; }
export PATH="$node_bin:$PATH"
say "node $(node --version), npm $(npm --version 2>/dev/null)"

cd "$ext"
npm ci --no-audit --no-fund --loglevel=error
npm run --silent package -- --out "$out" >/dev/null
say "built $out"
[ "$install" = 1 ] || exit 0
"$code" --install-extension "$out" --force
say "installed into $code; the status bar shows 'ctx' once a folder has a session (context-sidecar must be on PATH)"
