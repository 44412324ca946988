#!/usr/bin/env bash
# Every check: lint, the Python suite (server over stdio, real DuckDB, real openai client), the editor plugins.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
.venv/bin/ruff check sidecar protocol tests bench
.venv/bin/python -m pytest -q "$@"
if [ -x editors/run-tests.sh ] && [ -z "${SKIP_EDITORS:-}" ]; then
    editors/run-tests.sh
fi
