"""CUDA MAD kernels (kernels/gemm_cuda.py): bit-identical to the CPU kernels.

Without a GPU they run in numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1, which ``make test`` sets; this
module sets it too when numba.cuda is not imported yet and no GPU is visible), on tiny sizes (8x8x16):
the simulator runs every thread as Python. The CPU's ``gemm_general`` is the oracle (it is checked against
the exact reference in tests/test_mad.py). That both kernels type and lower for the real CUDA target (no GPU
needed), which the simulator cannot check: tests/kernels/test_cuda_lowering.py. Tests marked ``gpu`` need a real
GPU.
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

import emunum
from emunum import FloatFormat, MADUnit
from emunum.mad.unit import stream_keys

HAVE_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None
HAVE_GPU = torch.cuda.is_available()
SIM = False
if HAVE_NUMBA_CUDA:
    from numba import cuda

    SIM = cuda.to_device.__module__.startswith("numba.cuda.simulator")

needs_kernels = pytest.mark.skipif(
    not HAVE_NUMBA_CUDA or not (SIM or HAVE_GPU),
    reason="needs numba-cuda and either a GPU or NUMBA_ENABLE_CUDASIM=1 set before numba.cuda is imported")


def _operands(rng, shape, fmt="fp8_152"):
    x = rng.standard_normal(int(np.prod(shape))) * np.exp2(rng.integers(-6, 6, int(np.prod(shape))))
    x[rng.random(x.size) < 0.1] = 0.0
    return emunum.quantize(torch.from_numpy(x.reshape(shape)), fmt).float().numpy()


UNITS = {
    "e5m2-e6m9_chunk3_lanes2": MADUnit("fp8_152", "fp16_169", chunk=3, lanes=2),
    "fused_bf16_sr_lanes3_chunk2": MADUnit(None, "bf16", fused=True, acc_rounding="stochastic", lanes=3, chunk=2,
                                           sr_bits=9),
    "e4m3_sr-fixed16_12_odd": MADUnit("fp8_143", "fixed16_12", mul_rounding="stochastic", acc_rounding="odd"),
    "fp16_down-e4m3fn_up_lanes4": MADUnit("fp16", "e4m3fn", mul_rounding="down", acc_rounding="up", lanes=4),
    "hifloat8_sr-hifloat8sat_odd_chunk2": MADUnit("hifloat8", "hifloat8_sat", mul_rounding="stochastic",
                                                  acc_rounding="odd", chunk=2, lanes=2),
}


@needs_kernels
@pytest.mark.parametrize("name", list(UNITS))
def test_cuda_gemm_equals_cpu_gemm(name):
    from emunum.kernels import gemm_cpu, gemm_cuda

    unit = UNITS[name]
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    A = _operands(rng, (2, 8, 16))
    B = _operands(rng, (1, 16, 8))  # broadcast over the batch
    bias = rng.standard_normal((2, 8, 8))
    mulp, accp = unit.kernel_params()
    keys = stream_keys(77)
    want = np.empty((2, 8, 8))
    gemm_cpu.gemm(A, B, bias, want, int(unit.fused), mulp, accp, unit.lanes, unit.chunk or 0, keys, unit.sr_bits,
                  fast=False)
    got = np.zeros((2, 8, 8))
    gemm_cuda.gemm(A, B, bias, True, got, int(unit.fused), mulp, accp, unit.lanes, unit.chunk or 0, keys,
                   unit.sr_bits)
    assert np.array_equal(got.view(np.int64), want.view(np.int64))  # bits: signs of zeros included


FLUSH_UNITS = {  # negative sums that round to zero: -0 where the accumulator has -0, +0 where it has none
    "e5m2-fp16_nosub_lanes2": MADUnit("fp8_152", FloatFormat(5, 10, subnormals=False), lanes=2),
    "e6m9-fp16 (below half the smallest subnormal)": MADUnit("fp16_169", "fp16", chunk=3),
    "e5m2-e4m3fnuz (no -0)": MADUnit("fp8_152", FloatFormat(4, 3, special="fnuz")),
}


@needs_kernels
@pytest.mark.parametrize("name", list(FLUSH_UNITS))
def test_cuda_gemm_keeps_the_cpu_kernels_signed_zeros(name):
    """Invariant: on sums and products that flush or underflow to zero, the CUDA kernel, gemm_general and the
    kernel the CPU dispatcher picks (gemm_fast here) give the same float64 bits, signs of zeros included."""
    from emunum.kernels import gemm_cpu

    unit = FLUSH_UNITS[name]
    acc = unit.acc_fmt
    rng = np.random.default_rng(len(name))
    e = (acc.emin - (acc.man if acc.subnormals else 0)) // 2

    def tiny(shape):
        n = int(np.prod(shape))
        x = rng.choice([1.0, -1.0, 1.25, -1.5], n) * np.exp2(rng.integers(e - 4, e + 1, n))
        return emunum.quantize(torch.from_numpy(x.reshape(shape)), unit.mul_fmt).float().numpy()

    A, B = tiny((2, 8, 16)), tiny((1, 16, 8))
    tz = 2.0 ** (acc.emin - (acc.man if acc.subnormals else 0) - 2)
    bias = rng.choice([-0.0, 0.0, -tz, tz], (2, 8, 8))
    mulp, accp = unit.kernel_params()
    assert gemm_cpu.kernel_choice(A, B, 0, mulp, accp) == "fast"
    keys = stream_keys(3)
    for b in (bias, None):
        general, fast, got = _three_kernels(A, B, b, unit, keys)
        assert (general == 0).sum() >= 4
        assert np.array_equal(got.view(np.int64), general.view(np.int64)), name
        assert np.array_equal(fast.view(np.int64), got.view(np.int64)), name


def _three_kernels(A, B, bias, unit, keys):
    """(gemm_general, gemm_fast via the dispatcher, the CUDA kernel)'s (2, 8, 8) outputs for one unit."""
    from emunum.kernels import gemm_cpu, gemm_cuda

    mulp, accp = unit.kernel_params()
    general, fast, got = np.empty((2, 8, 8)), np.empty((2, 8, 8)), np.zeros((2, 8, 8))
    gemm_cpu.gemm(A, B, bias, general, 0, mulp, accp, unit.lanes, unit.chunk or 0, keys, 32, fast=False)
    gemm_cpu.gemm(A, B, bias, fast, 0, mulp, accp, unit.lanes, unit.chunk or 0, keys, 32)
    gemm_cuda.gemm(A, B, np.zeros((1, 1, 1)) if bias is None else bias, bias is not None, got, 0, mulp, accp,
                   unit.lanes, unit.chunk or 0, keys, 32)
    return general, fast, got


NAN_UNITS = {
    "e4m3fn-e4m3fn_lanes2 (overflow to NaN)": MADUnit("e4m3fn", "e4m3fn", lanes=2),
    "e5m2-e6m9_chunk2 (inf accumulator)": MADUnit("fp8_152", "fp16_169", chunk=2),
}


@needs_kernels
@pytest.mark.parametrize("name", list(NAN_UNITS))
def test_cuda_nan_results_have_the_cpu_kernels_bits(name):
    """Invariant: NaN results from inf - inf, inf * 0, overflow to NaN, negative NaN operands (with a payload)
    and a negative NaN bias are the positive quiet NaN 0x7FF8000000000000 on the CUDA kernels, gemm_general and
    gemm_fast alike: raw float64 bits, no NaN-aware comparison; the element-wise mad as well."""
    from emunum.kernels import gemm_cpu, gemm_cuda

    unit = NAN_UNITS[name]
    rng = np.random.default_rng(len(name))
    neg_nan = np.array([0xFFC00001], np.uint32).view(np.float32)[0]
    v = np.array([np.inf, -np.inf, neg_nan, 0.0, -0.0, 49152.0, -49152.0, 1.0, -1.5], np.float32)
    p = np.array([0.5, 0.5, 0.3, 4, 2, 0.5, 0.5, 10, 10])
    A, B = rng.choice(v, (2, 8, 5), p=p / p.sum()), rng.choice(v, (1, 5, 8), p=p / p.sum())
    bias = rng.choice([0.0, float(neg_nan), np.inf, -2.0], (2, 8, 8), p=[0.6, 0.1, 0.1, 0.2])
    mulp, accp = unit.kernel_params()
    assert gemm_cpu.kernel_choice(A, B, 0, mulp, accp) == "fast"
    keys = stream_keys(3)
    for b in (bias, None):
        general, fast, got = _three_kernels(A, B, b, unit, keys)
        nan = np.isnan(general)
        assert nan.sum() >= 10 and (~nan).sum() >= 10
        assert (general.view(np.int64)[nan] == 0x7FF8000000000000).all()
        assert np.array_equal(got.view(np.int64), general.view(np.int64)), name
        assert np.array_equal(fast.view(np.int64), got.view(np.int64)), name
    a, bb, c = A.reshape(-1)[:64].copy(), B.reshape(-1)[:40].repeat(2)[:64].copy(), bias.reshape(-1)[:64].copy()
    want, got = np.empty(64), np.zeros(64)
    gemm_cpu.mad(a, bb, c, want, 0, mulp, accp, keys, 32)
    gemm_cuda.mad(a, bb, c, got, 0, mulp, accp, keys, 32)
    assert np.isnan(want).sum() >= 5 and np.array_equal(got.view(np.int64), want.view(np.int64))
    assert (want.view(np.int64)[np.isnan(want)] == 0x7FF8000000000000).all()


@needs_kernels
def test_cuda_gemm_ragged_tiles_without_bias():
    """M, N, K not multiples of the 16-wide tile; no bias."""
    from emunum.kernels import gemm_cpu, gemm_cuda

    unit = MADUnit("fp8_152", "bf16", acc_rounding="nearest_away", chunk=5)
    rng = np.random.default_rng(5)
    A, B = _operands(rng, (1, 3, 19)), _operands(rng, (1, 19, 5))
    mulp, accp = unit.kernel_params()
    want = np.empty((1, 3, 5))
    gemm_cpu.gemm(A, B, None, want, 0, mulp, accp, 1, 5, stream_keys(0), 32, fast=False)
    got = np.zeros((1, 3, 5))
    gemm_cuda.gemm(A, B, np.zeros((1, 1, 1)), False, got, 0, mulp, accp, 1, 5, stream_keys(0), 32)
    np.testing.assert_array_equal(got, want)


@needs_kernels
def test_cuda_mad_equals_cpu_mad():
    from emunum.kernels import gemm_cpu, gemm_cuda

    rng = np.random.default_rng(6)
    a, b = _operands(rng, (300,)), _operands(rng, (300,))
    c = rng.standard_normal(300) * 8
    for unit in [MADUnit(None, "e4m3fn", fused=True, acc_rounding="stochastic"), MADUnit("bf16", "fp8_152")]:
        mulp, accp = unit.kernel_params()
        want, got = np.empty(300), np.zeros(300)
        gemm_cpu.mad(a, b, c, want, int(unit.fused), mulp, accp, stream_keys(3), 32)
        gemm_cuda.mad(a, b, c, got, int(unit.fused), mulp, accp, stream_keys(3), 32)
        np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU or SIM or not HAVE_NUMBA_CUDA, reason="needs a CUDA GPU and numba-cuda")
def test_gpu_matmul_equals_cpu_matmul():
    rng = np.random.default_rng(8)
    A, B = torch.from_numpy(_operands(rng, (3, 40, 70))), torch.from_numpy(_operands(rng, (70, 33)))
    for unit in [MADUnit("fp8_152", "fp16_169", chunk=8, lanes=2), MADUnit(None, FloatFormat(8, 7), fused=True,
                                                                          acc_rounding="stochastic")]:
        cpu = emunum.matmul(A, B, unit, seed=4)
        gpu = emunum.matmul(A.cuda(), B.cuda(), unit, seed=4)
        assert torch.equal(gpu.cpu(), cpu)
