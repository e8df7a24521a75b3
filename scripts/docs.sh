#!/usr/bin/env bash
# Install rlm-magic with its docs extra into ./.venv and build the documentation site
# (Sphinx + MyST-NB, sources in docs/) into build/docs/, every warning an error.
# The notebooks are rendered from their stored outputs, never executed.
#   bash scripts/docs.sh          build (what CI runs)
#   bash scripts/docs.sh --open   build, then open build/docs/index.html in a browser
# Other arguments go to sphinx-build (`-E` rebuilds every page).
set -euo pipefail
cd "$(dirname "$0")/.."

open=0
args=()
for arg in "$@"; do
    if [ "$arg" = "--open" ]; then open=1; else args+=("$arg"); fi
done

. scripts/venv.sh docs
# -W --keep-going: every warning fails the build, all of them reported; -n: every
# cross-reference must resolve. -j 2: the machines CI runs on have two cores.
.venv/bin/python -m sphinx -W --keep-going -n -q -j 2 -b html docs build/docs "${args[@]+"${args[@]}"}"
echo "docs: build/docs/index.html"
if [ "$open" = 1 ]; then
    .venv/bin/python -m webbrowser "file://$PWD/build/docs/index.html"
fi
