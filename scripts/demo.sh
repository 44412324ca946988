#!/usr/bin/env bash
# The main job: a generated coding session through the real sidecar, on the default embedded DuckDB file.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/context-sidecar demo "$@"
