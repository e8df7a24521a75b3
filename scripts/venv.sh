# Sourced by quickstart.sh, test.sh, lab.sh and check.sh, from the repository root: make
# the venv $VENV (default ./.venv) with $PYTHON (default python3) and install rlm-magic
# into it with the extra named in $1. A venv of another Python than an explicit $PYTHON is
# refused, not kept. (.ci/run tests other Pythons in venvs of their own: VENV=.venv-3.10.)
PYTHON="${PYTHON:-}"
VENV="${VENV:-.venv}"
if [ -x "$VENV/bin/python" ] && [ -n "$PYTHON" ]; then
    have="$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    want="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    if [ "$have" != "$want" ]; then
        echo "./$VENV is Python $have, but PYTHON=$PYTHON is Python $want: remove $VENV (rm -rf $VENV) to rebuild it with $PYTHON, or unset PYTHON" >&2
        exit 1
    fi
fi
[ -x "$VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# setuptools' "Editable installation... Please be careful with folders..." banner, which
# pip shows even with --quiet: nothing to act on.
PYTHONWARNINGS="ignore:Editable installation" \
    "$VENV/bin/python" -m pip install --quiet -e ".[$1]"
