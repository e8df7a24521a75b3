#!/usr/bin/env bash
# Re-execute the example notebooks in place against the offline demo model, so their
# saved outputs (which nbval compares) match what the code now shows. Run after a change
# to what a run displays or sends (the system prompt changes token counts and costs).
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/venv.sh test
export LITELLM_LOCAL_MODEL_COST_MAP="${LITELLM_LOCAL_MODEL_COST_MAP:-True}"
for notebook in notebooks/[0-9]*.ipynb; do
    .venv/bin/python scripts/run_notebook.py "$notebook" --out "$notebook"
done
