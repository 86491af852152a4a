"""CUDA matrix-instruction kernel (kernels/mma_cuda.py) against MMA-Sim's vectors (tests/data/mmasim).

Without a GPU it runs in numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1, which ``make test`` sets), one
launch per vector, on the first 24 vectors of every preset and chain length. Oracle: MMA-Sim's outputs.
"""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import torch

from emunum.mad.mma import MMA_PRESETS

import tiers

HAVE_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None
SIM = False
if HAVE_NUMBA_CUDA:
    from numba import cuda

    SIM = cuda.to_device.__module__.startswith("numba.cuda.simulator")
needs_kernels = pytest.mark.skipif(not HAVE_NUMBA_CUDA or not (SIM or torch.cuda.is_available()),
                                   reason="needs numba-cuda and a GPU or NUMBA_ENABLE_CUDASIM=1")
DATA = os.path.join(os.path.dirname(__file__), "..", "data", "mmasim")
LIMIT = 24


@needs_kernels
@pytest.mark.parametrize("name,steps", tiers.grid([list(MMA_PRESETS), [1, 3]]))  # each unit; steps in turn
def test_cuda_kernel_reproduces_mmasim(name, steps):
    from emunum.kernels import mma_cuda

    d = np.load(os.path.join(DATA, f"{name}.npz"))
    unit = MMA_PRESETS[name]
    a, b, c, want = d[f"a{steps}"], d[f"b{steps}"], d[f"c{steps}"], d[f"d{steps}"]
    sa = d[f"sa{steps}"] if unit.scale else np.ones((len(a), 1), np.float32)
    sb = d[f"sb{steps}"] if unit.scale else np.ones((len(a), 1), np.float32)
    got = np.zeros(LIMIT, np.float32)
    for v in range(LIMIT):
        out = np.zeros((1, 1), np.float64)
        mma_cuda.gemm(a[v:v + 1], b[v:v + 1], sa[v:v + 1], sb[v:v + 1], c[v:v + 1].reshape(1, 1), out, unit.params())
        got[v] = out[0, 0]
    want = want[:LIMIT]
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), np.nonzero(~same)


_LOWER = """
import sys, types as pytypes
from numba import types
import numba.cuda.dispatcher as disp
from numba.cuda.compiler import compile_cuda
if not hasattr(disp, "get_current_device"):
    print("SKIP numba-cuda internals changed: no dispatcher.get_current_device"); sys.exit(0)
disp.get_current_device = lambda: pytypes.SimpleNamespace(compute_capability=(8, 0))
from emunum.kernels import mma_cuda as g
i64, f32, f64 = types.int64, types.float32, types.float64
m = f32[:, ::1]
sig = (m, m, m, m, m, f64[:, ::1], types.UniTuple(i64, 8))
try:
    cres = compile_cuda(g.gemm_kernel.py_func, types.void, sig, cc=(8, 0))
    assert "define" in cres.library.get_llvm_str()
    print("LOWERED")
except Exception as err:
    print("FAILED", type(err).__name__, str(err).replace(chr(10), " | ")[-1500:])
"""


@pytest.mark.skipif(not HAVE_NUMBA_CUDA, reason="needs numba-cuda")
def test_mma_kernel_lowers_for_the_cuda_target():
    """Typing and lowering to NVVM IR, as on a GPU (no GPU or CUDA toolkit needed)."""
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    r = subprocess.run([sys.executable, "-c", _LOWER], capture_output=True, text=True, timeout=600, env=env)
    if r.stdout.startswith("SKIP"):
        pytest.skip(r.stdout)
    assert "LOWERED" in r.stdout, r.stdout + r.stderr
