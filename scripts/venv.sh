# Sourced by quickstart.sh, test.sh, lab.sh and check.sh, from the repository root: make
# ./.venv (with $PYTHON, default python3) and install rlm-magic into it with the extra
# named in $1. A .venv of another Python than an explicit $PYTHON is refused, not kept.
PYTHON="${PYTHON:-}"
if [ -x .venv/bin/python ] && [ -n "$PYTHON" ]; then
    have="$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    want="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    if [ "$have" != "$want" ]; then
        echo "./.venv is Python $have, but PYTHON=$PYTHON is Python $want: remove .venv (rm -rf .venv) to rebuild it with $PYTHON, or unset PYTHON" >&2
        exit 1
    fi
fi
[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# setuptools' "Editable installation... Please be careful with folders..." banner, which
# pip shows even with --quiet: nothing to act on.
PYTHONWARNINGS="ignore:Editable installation" \
    .venv/bin/python -m pip install --quiet -e ".[$1]"
