#!/usr/bin/env bash
# The wheels that a lent GPU machine's own Python lacks (docs/testing.md), downloaded into .whl/ (git-ignored) for
# the device tool to carry (carry=[".whl"]); benchmarks/gpu_check.sh installs them there (benchmarks/gpu_site.py).
# Run it here, where the package registries can be reached:   bash benchmarks/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
# the device image's Python is 3.12 on x86-64 Linux
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl gfloat==0.5.2 array-api-compat==1.16.0 more-itertools==11.2.1 torchao==0.18.0 hydra-core==1.3.8 \
    omegaconf==2.3.1 mnist1d==0.0.2.post1 en_dtypes==0.0.4
"$PY" -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3  # an sdist only: its pure-Python wheel
ls .whl
