#!/usr/bin/env bash
# Install rlm-magic with JupyterLab into ./.venv, add the `rlm` kernel to that
# environment, and open the example notebooks in JupyterLab. Arguments go to
# `jupyter lab` (e.g. --no-browser, --port 8899). As root (a container), it passes
# --allow-root, which JupyterLab otherwise requires, and says so.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/venv.sh lab
.venv/bin/python -m rlm_magic.jupyter.kernelspec install --sys-prefix >/dev/null
export LITELLM_LOCAL_MODEL_COST_MAP="${LITELLM_LOCAL_MODEL_COST_MAP:-True}"
if [ "$(id -u)" = 0 ]; then
    echo "lab.sh: running as root, so passing --allow-root to jupyter lab" >&2
    set -- --allow-root "$@"
fi
# Saving an example keeps the kernel metadata it is stored with: opening one leaves the
# clone clean whichever Python or kernel runs it (scripts/jupyter_server_config.py).
exec .venv/bin/jupyter lab notebooks --config=scripts/jupyter_server_config.py "$@"
