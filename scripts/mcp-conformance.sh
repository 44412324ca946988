#!/usr/bin/env bash
# `context-sidecar mcp` against the MCP conformance suite (@modelcontextprotocol/conformance, pinned in
# scripts/mcp-conformance/package-lock.json) and the MCP SDK's own client, offline once installed.
#
# The suite tests servers over Streamable HTTP only, so tests/helpers/mcp_http_bridge.py puts an HTTP front
# on the stdio server (one server process per MCP session). Of its server scenarios, those of the MCP subset
# this server implements run: server-initialize, ping, tools-list, logging-set-level. The others need the
# suite's fixture tools (test_simple_text, …), resources, prompts, completion, sampling or elicitation, which
# this server does not offer, or test an HTTP server itself (DNS rebinding, SSE streams). Then the SDK's
# client drives the stdio server directly (scripts/mcp-conformance/sdk-client.mjs), its schemas checking
# every reply. The suite needs Node >= 22: the node on PATH if it is, else Node 24 from PyPI
# (scripts/node.sh). The suite is installed once into the cache:
# ${XDG_CACHE_HOME:-~/.cache}/context-sidecar/mcp-conformance (CONTEXT_SIDECAR_MCP_CONFORMANCE_CACHE).
# Exits 0 when every check passed, 1 otherwise, 2 when it is skipped because a registry cannot be reached.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pins="$root/scripts/mcp-conformance"
cache="${CONTEXT_SIDECAR_MCP_CONFORMANCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/context-sidecar/mcp-conformance}"
python="${PYTHON:-$root/.venv/bin/python}"
SCENARIOS=(server-initialize ping tools-list logging-set-level)

skip() { echo "SKIPPED (MCP conformance): $*"; exit 2; }
fail() { echo "FAILED (MCP conformance): $*" >&2; exit 1; }
mkdir -p "$cache"

# --- Node >= 22 ---------------------------------------------------------------------------------
node_bin="$("$root/scripts/node.sh")"
case $? in
  0) ;;
  2) skip "no Node >= 22 on PATH, and PyPI did not give one" ;;
  *) fail "scripts/node.sh could not provide Node >= 22" ;;
esac
node="$node_bin/node"
npm=("$node_bin/npm")
echo "node $("$node" --version)"

# --- the suite, pinned ----------------------------------------------------------------------------
modules="$cache/suite"
if ! cmp -s "$pins/package-lock.json" "$modules/package-lock.json" || ! [ -f "$modules/node_modules/.package-lock.json" ]; then
  echo "installing the MCP conformance suite into $modules"
  rm -rf "$modules" && mkdir -p "$modules"
  cp "$pins/package.json" "$pins/package-lock.json" "$modules/"
  (cd "$modules" && PATH="$(dirname "$node"):$PATH" "${npm[@]}" ci --no-audit --no-fund --loglevel=error) \
    || { PATH="$(dirname "$node"):$PATH" "${npm[@]}" ping >/dev/null 2>&1 || skip "the npm registry cannot be reached"; \
         fail "npm ci failed"; }
fi
cp "$pins/sdk-client.mjs" "$modules/"

# --- run --------------------------------------------------------------------------------------------
work="$(mktemp -d)"
runtime="$(mktemp -d /tmp/cs-conf-XXXXXX)"  # short: socket paths are limited to 108 bytes
bridge_pid=""
cleanup() {
  [ -n "$bridge_pid" ] && kill "$bridge_pid" 2>/dev/null && wait "$bridge_pid" 2>/dev/null
  for sock in "$runtime"/context-sidecar/*.sock; do  # the host the servers started lingers: stop it
    [ -S "$sock" ] || continue
    pid="$(cd "$root" && "$python" -c 'import sys, pathlib; from tests.helpers.hosts import host_pid
print(host_pid(pathlib.Path(sys.argv[1])))' "$sock" 2>/dev/null)" && kill "$pid" 2>/dev/null
  done
  [ -n "${KEEP_WORK:-}" ] && echo "kept $work" || rm -rf "$work"; rm -rf "$runtime"
}
trap cleanup EXIT
export XDG_RUNTIME_DIR="$runtime"
server=("$python" -m sidecar mcp --db "$work/memory.duckdb" --log-file "$work/mcp.log" -v)
failed=0

(cd "$root" && exec "$python" -m tests.helpers.mcp_http_bridge -- "${server[@]}") >"$work/bridge.url" &
bridge_pid=$!
for _ in $(seq 100); do [ -s "$work/bridge.url" ] && break; sleep 0.1; done
url="$(head -1 "$work/bridge.url")"
[ -n "$url" ] || fail "the HTTP bridge did not start"
for scenario in "${SCENARIOS[@]}"; do
  if (cd "$work" && timeout 120 "$node" "$modules/node_modules/@modelcontextprotocol/conformance/dist/index.js" \
        server --url "$url" --scenario "$scenario" >"$work/$scenario.out" 2>&1); then
    echo "PASS conformance $scenario"
  else
    echo "FAIL conformance $scenario"; sed 's/\x1b\[[0-9;]*m//g' "$work/$scenario.out" | tail -20; failed=1
  fi
done
(cd "$work" && timeout 120 "$node" "$modules/sdk-client.mjs" "${server[@]}") || failed=1
if [ "$failed" -ne 0 ]; then
  echo "--- server log"; tail -40 "$work/mcp.log"
  fail "some checks failed"
fi
echo "MCP conformance: ${#SCENARIOS[@]} suite scenarios and the SDK client's checks passed"
