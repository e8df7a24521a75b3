#!/usr/bin/env bash
# The guardrails, run by CI before the tests: formatting, lint, types, and the import
# layering (imports point down the layers; no module imports another that imports it).
#   bash scripts/check.sh          check only
#   bash scripts/check.sh --fix    format and fix what ruff can, then check
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/venv.sh lint
if [ "${1:-}" = "--fix" ]; then
    .venv/bin/ruff format .
    .venv/bin/ruff check --fix .
fi
.venv/bin/ruff format --check .
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/lint-imports --no-cache
