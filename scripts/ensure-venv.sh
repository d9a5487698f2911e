#!/bin/sh
# ensure-venv.sh: makes sure the project's Python environment (.venv/) exists
# with exactly the pins of python/requirements.txt (the one place they are
# pinned) and the kvrepro package (python/, editable), so that `make test`
# runs the transformers lane's tests on a fresh machine. PyPI is the only
# source. Idempotent: reinstalls only when requirements.txt or the
# interpreter changed since the last successful install.
#
# The install is the lean CPU set (requirements.txt says which CUDA wheels
# torch needs just to import and which it never loads): pip --no-deps, so
# pip installs the listed set and nothing it was not told to.
#
# On failure it prints the exact commands and exits 2.
set -eu
cd "$(dirname "$0")/.."
VENV=.venv
REQ=python/requirements.txt
PY="${PYTHON:-python3}"

fail() {
    echo "kvrepro: $1" >&2
    echo "kvrepro: to set up by hand:" >&2
    echo "    $PY -m venv $VENV" >&2
    echo "    $VENV/bin/python -m pip install --no-deps -r $REQ" >&2
    echo "    $VENV/bin/python -m pip install --no-deps --no-build-isolation -e ./python" >&2
    exit 2
}

if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
    fail "$PY is missing or older than Python 3.11 (set PYTHON=...)"
fi
if [ ! -x "$VENV/bin/python" ]; then
    echo "kvrepro: creating the Python environment $VENV (torch, transformers: ~4.4 GB, ~1-2 min)" >&2
    "$PY" -m venv "$VENV" || fail "cannot create $VENV"
fi
STAMP="$VENV/.kvrepro-requirements"
WANT="$(cat "$REQ" python/pyproject.toml | sha256sum | cut -d' ' -f1) $("$VENV/bin/python" -c 'import sys; print(sys.version)' | head -1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
    exit 0
fi
# pip unpacks the wheels (torch alone is ~0.9 GB packed) under TMPDIR and
# installs ~4.4 GB into the environment: check both disks first, so that a full
# disk is named as such instead of an OSError deep inside pip.
NEED_GIB="${KVREPRO_VENV_NEED_GIB:-6}"
for dir in "$VENV" "${TMPDIR:-/tmp}"; do
    free_kib=$(df -Pk "$dir" | awk 'NR == 2 { print $4 }')
    if [ -n "$free_kib" ] && [ "$free_kib" -lt $((NEED_GIB * 1024 * 1024)) ]; then
        fail "installing $REQ needs about $NEED_GIB GiB free on the disk of $dir ($(df -Pk "$dir" | awk 'NR == 2 { print $6 }')): $((free_kib / 1024 / 1024)) GiB free; free some space there (for pip's temporary files, TMPDIR=... picks another disk) and run again"
    fi
done
echo "kvrepro: installing $REQ into $VENV" >&2
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$REQ" >&2 \
    || fail "pip install -r $REQ failed"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation \
    -e ./python >&2 || fail "pip install -e ./python failed"
"$VENV/bin/python" -c 'import torch, transformers, h5py, numpy, matplotlib, kvrepro' \
    || fail "the installed environment does not import"
echo "$WANT" > "$STAMP"
