"""CUDA multi-term / exact kernel (kernels/gemm_multiterm_cuda.py): the CPU kernel's bits, and the GPU's.

Without a GPU it runs in numba's CUDA simulator (every thread as Python), on small sizes. Oracles: the CPU
kernel ``gemm_multiterm.gemm`` (itself checked against the exact reference in tests/test_mad_multiterm.py)
and the measured tensor-core outputs (tests/data/tensor_cores, 24 vectors per preset here).
"""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import torch

import emunum
from emunum import MADUnit
from emunum.mad import hwdata
from emunum.mad.presets import TABLE, UNVALIDATED
from emunum.mad.unit import stream_keys

HAVE_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None
SIM = False
if HAVE_NUMBA_CUDA:
    from numba import cuda

    SIM = cuda.to_device.__module__.startswith("numba.cuda.simulator")
needs_kernels = pytest.mark.skipif(not HAVE_NUMBA_CUDA or not (SIM or torch.cuda.is_available()),
                                   reason="needs numba-cuda and a GPU or NUMBA_ENABLE_CUDASIM=1")
DATA = os.path.join(os.path.dirname(__file__), "..", "data", "tensor_cores")


def _params(unit, dtype=torch.float32):
    return tuple(tuple(int(v) for v in p) for p in unit.multiterm_params(dtype))


def _both(unit, A, B, C, bias=None):
    """(cpu, cuda) float64 outputs of the two kernels on numpy operands A (b, M, K), B (b, K, N)."""
    from emunum.kernels import gemm_multiterm, gemm_multiterm_cuda

    BT = np.ascontiguousarray(B.transpose(0, 2, 1))
    nb, M, N = C.shape
    prm, mulp, accp, outerp = _params(unit)
    keys = tuple(np.uint64(k) for k in stream_keys(5))
    has_bias = bias is not None
    bias = bias if has_bias else np.zeros((1, 1, 1))
    cpu, gpu = np.empty((nb, M, N)), np.zeros((nb, M, N))
    gemm_multiterm.gemm(A, BT, C, bias, has_bias, cpu, prm, mulp, accp, outerp, keys, unit.sr_bits)
    gemm_multiterm_cuda.gemm(A, BT, C, bias, has_bias, gpu, prm, mulp, accp, outerp, keys, unit.sr_bits)
    return cpu, gpu


def _operands(rng, shape, fmt):
    x = rng.standard_normal(int(np.prod(shape))) * np.exp2(rng.integers(-8, 8, int(np.prod(shape))))
    x[rng.random(x.size) < 0.1] = 0.0
    return emunum.quantize(torch.from_numpy(x.reshape(shape)), fmt).float().numpy()


UNITS = {
    "h100_fp8_e4m3": MADUnit.preset("h100_fp8_e4m3"),
    "carry_promote": MADUnit("bf16", "fp16", mul_rounding="toward_zero", acc_rounding="up", terms=4, align_bits=5,
                             align_rounding="nearest", carry_bits=1, promote_every=8, align_floor=-3),
    "lossless_terms3": MADUnit(None, "bf16", fused=True, acc_rounding="odd", terms=3),
    "exact_stochastic": MADUnit(None, "exact", fused=True, acc_rounding="stochastic", sr_bits=7),
    "exact_mul_bf16": MADUnit("bf16", "exact", acc_rounding="down"),
}


@needs_kernels
@pytest.mark.parametrize("name", list(UNITS))
def test_cuda_multiterm_gemm_equals_cpu(name):
    unit = UNITS[name]
    rng = np.random.default_rng(len(name))
    A = _operands(rng, (2, 5, 19), "bf16")
    B = _operands(rng, (2, 19, 6), "bf16")
    C = _operands(rng, (2, 5, 6), "fp32").astype(np.float64)
    bias = rng.standard_normal((2, 5, 6))
    cpu, gpu = _both(unit, A, B, C, bias)
    np.testing.assert_array_equal(gpu, cpu)
    assert np.array_equal(np.signbit(gpu), np.signbit(cpu))


@needs_kernels
@pytest.mark.parametrize("gpu,fmt", [("V100", "fp16"), ("A100", "bf16"), ("Ada", "E5M2"), ("H100", "E4M3"),
                                     ("H100", "tf32"), ("B200", "fp16"), ("B200", "E4M3")])
def test_cuda_kernel_reproduces_measured_outputs(gpu, fmt):
    p = hwdata.load_pair(DATA, gpu, fmt, limit=24)
    name = f"{hwdata.PRESET_GPU[gpu]}_{hwdata.PRESET_FMT[fmt]}"
    assert name in TABLE or name in UNVALIDATED
    unit = MADUnit.preset(name)
    c = np.zeros_like(p.c) if p.c_is_zero else p.c
    n = p.a.shape[0]
    cpu, got = _both(unit, p.a.reshape(n, 1, -1), p.b.reshape(n, -1, 1), c.astype(np.float64).reshape(n, 1, 1))
    assert np.array_equal(got.reshape(-1).astype(np.float32).view(np.uint32), p.d32.view(np.uint32))
