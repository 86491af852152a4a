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
