#!/usr/bin/env bash
# Install rlm-magic into ./.venv and run the quickstart notebook headless against the
# offline demo model (no API key, no network). Prints what the notebook did (the batch
# against one call at a time, an RLM's answer, the usage table) and where the executed
# copy is.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/venv.sh notebook
.venv/bin/python -m rlm_magic.jupyter.kernelspec install --sys-prefix >/dev/null
export LITELLM_LOCAL_MODEL_COST_MAP="${LITELLM_LOCAL_MODEL_COST_MAP:-True}"
.venv/bin/python scripts/run_notebook.py notebooks/01_quickstart.ipynb --summary
