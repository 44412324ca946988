#!/usr/bin/env bash
# The main job: a generated coding session through the real sidecar, on the default embedded DuckDB file.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --run  # the package alone: the test tools are for scripts/test.sh
exec .venv/bin/context-sidecar demo "$@"
