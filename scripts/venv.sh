# Sourced by quickstart.sh and test.sh, from the repository root: make ./.venv (with
# $PYTHON, default python3) and install rlm-magic into it with the extra named in $1.
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[$1]"
