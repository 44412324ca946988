#!/usr/bin/env bash
# Every check: lint, types, the Python suite (server over stdio, real DuckDB, real openai client), the editor
# plugins. Every suite runs even when an earlier one fails; the exit code is 1 if any failed, and each is named.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || exit 1
export PATH="$PWD/.venv/bin:$PATH"
failed=()
run() {
    local name=$1 began=$SECONDS
    shift
    printf '\n== %s\n' "$name"
    "$@" || failed+=("$name")
    printf '== %s took %d s\n' "$name" "$((SECONDS - began))"
}
# A Node.js with npm for the agents, the MCP conformance suite and the editor plugins: the node on PATH if it
# is new enough, else Node 24 from PyPI, installed once into the cache (scripts/node.sh).
printf '\n== node\n'
if node_bin="$(scripts/node.sh)"; then
    [ "$(command -v node)" = "$node_bin/node" ] || export PATH="$node_bin:$PATH"
    echo "node $(node --version) ($node_bin)"
else
    failed+=("node")
fi
# The real coding agents the tests drive (pinned in tests/agents/npm, installed once into a cache); with them
# installed here, a missing agent fails its tests instead of skipping them. SKIP_AGENTS=1 leaves them out.
if [ -z "${SKIP_AGENTS:-}" ]; then
    run agents .venv/bin/python -m tests.agents.install
    export CONTEXT_SIDECAR_REQUIRE_AGENTS=1
fi
# A throwaway PostgreSQL server for the team-store tests (Debian's, installed if missing; as root it runs as the
# postgres user), stopped on exit; with it started here, a test that cannot reach it fails instead of skipping.
printf '\n== postgresql\n'
pg_dir=$(mktemp -d /tmp/cs-pg-XXXXXX)
trap '.venv/bin/python -m tests.helpers.postgres stop "$pg_dir"' EXIT
if pg_url=$(.venv/bin/python -m tests.helpers.postgres start "$pg_dir"); then
    export CONTEXT_SIDECAR_TEST_PG="$pg_url" CONTEXT_SIDECAR_TEST_PG_DIR="$pg_dir" CONTEXT_SIDECAR_REQUIRE_PG=1
    echo "PostgreSQL at $pg_url"
else
    failed+=("postgresql")
    export CONTEXT_SIDECAR_REQUIRE_PG=1
fi
run ruff .venv/bin/ruff check sidecar protocol tests bench examples
run mypy .venv/bin/mypy
run pytest .venv/bin/python -m pytest -q "$@"
conformance() {  # exit 2: skipped, no registry to install the suite from
    scripts/mcp-conformance.sh
    case $? in 0 | 2) ;; *) return 1 ;; esac
}
run mcp-conformance conformance
if [ -x editors/run-tests.sh ] && [ -z "${SKIP_EDITORS:-}" ]; then
    run editors editors/run-tests.sh
fi
if [ ${#failed[@]} -gt 0 ]; then
    printf '\nFAILED: %s (%d s)\n' "${failed[*]}" "$SECONDS" >&2
    exit 1
fi
printf '\nall checks passed (%d s)\n' "$SECONDS"
