#!/usr/bin/env bash
# Install rlm-magic with JupyterLab into ./.venv, add the `rlm` kernel to that
# environment, and open the example notebooks in JupyterLab. Arguments go to
# `jupyter lab` (e.g. --no-browser, --port 8899).
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/venv.sh lab
.venv/bin/python -m rlm_magic.jupyter.kernelspec install --sys-prefix >/dev/null
export LITELLM_LOCAL_MODEL_COST_MAP="${LITELLM_LOCAL_MODEL_COST_MAP:-True}"
exec .venv/bin/jupyter lab notebooks "$@"
