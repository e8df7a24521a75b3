#!/usr/bin/env bash
# The guardrails, run by CI before the tests: formatting, lint (with each function's size
# limits), types, the import layering (imports point down the layers; no module imports
# another that imports it), the layout rules no linter checks (a long module says why,
# a class's attribute count, a ceiling on copied code: scripts/check_layout.py) and the
# test suite's shape (no test module imports another: scripts/check_tests.py).
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
.venv/bin/python scripts/check_layout.py
.venv/bin/python scripts/check_tests.py
