#!/usr/bin/env bash
# Create or refresh .venv: the project and its test tools, or with --run the project alone (what
# scripts/demo.sh runs); quick when nothing changed. A test install serves --run as well.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
kind=test
[ "${1:-}" = "--run" ] && kind=run
stamp=.venv/.installed
hash=$(sha256sum pyproject.toml | cut -d' ' -f1)
have=$(cat "$stamp" 2>/dev/null || true)
if [ "$have" = "$hash test" ] || [ "$have" = "$hash $kind" ]; then
    exit 0
fi
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
if [ "$kind" = test ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e '.[test]'
else
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e .
fi
echo "$hash $kind" > "$stamp"
