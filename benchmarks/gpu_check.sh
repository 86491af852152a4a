#!/usr/bin/env bash
# The GPU run in one command (see benchmarks/gpu_check.py and docs/testing.md):
#   bash benchmarks/gpu_check.sh [--smoke] [OUTDIR]      # writes OUTDIR/gpu_check.json (default $OUT, else
#                                                        # benchmarks/gpu_results); under 8 minutes on one H100
# Python: $PYTHON, else this checkout's .venv, else python3 (on a lent GPU machine: its python3, which holds
# CUDA torch and numba-cuda). Without a CUDA device it runs the smoke mode and says the GPU checks were skipped.
# On a lent machine, with the wheels it lacks: bash benchmarks/gpu_wheels.sh here, then carry .whl there.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
# the wheels carried in .whl that this Python lacks, and the numpy.row_stack shim its numba-cuda may need
# (benchmarks/gpu_site.py; nothing where neither is needed)
SITE=$("$PY" benchmarks/gpu_site.py) || exit 2
if [ -n "$SITE" ]; then
    echo "gpu_check: PYTHONPATH starts with $SITE (benchmarks/gpu_site.py: wheels from .whl, numpy shim)"
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
# a fresh machine has the checkout but not the package: install it in place, offline, without dependencies
if ! "$PY" -c "import emunum.kernels" >/dev/null 2>&1; then
    echo "gpu_check: installing this checkout (pip install --no-deps --no-build-isolation -e .)"
    "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 2
fi
PYTHONUNBUFFERED=1 exec "$PY" benchmarks/gpu_check.py "$@"
