#!/usr/bin/env bash
# Install rlm-magic with its test extra into ./.venv and run the whole test suite:
# unit and HTTP tests, real-kernel tests, and the example notebooks under nbval.
# The tests start their own local LLM server and install the `rlm` kernelspec into a
# temporary prefix; nothing outside this folder is touched.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/venv.sh test
exec .venv/bin/python -m pytest "$@"
