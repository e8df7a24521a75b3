#!/usr/bin/env bash
# Install rlm-magic with its test extra into ./.venv and run the whole test suite:
# unit and HTTP tests, real-kernel tests, and the example notebooks under nbval.
# The tests start their own local LLM server and install the `rlm` kernelspec into a
# temporary prefix; nothing outside this folder is touched.
#   bash scripts/test.sh           everything (what CI runs)
#   bash scripts/test.sh --fast    the fast tier: no kernels, terminals, proxy, notebooks
# Other arguments go to pytest (`-n 0` for one process). PYTHON and VENV choose another
# Python and its venv (PYTHON=python3.10 VENV=.venv-3.10 bash scripts/test.sh --fast).
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/venv.sh test
# Four workers on any machine: the tests mostly wait (servers with latency, kernels),
# and tests that share a kernel, a terminal or the proxy run on one worker together.
exec "$VENV/bin/python" -m pytest -n 4 "$@"
