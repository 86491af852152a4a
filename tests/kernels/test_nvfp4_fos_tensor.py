"""4/6 with a tensor outer scale, the tensor's amax found by the kernel path (kernels/nvfp4_cpu.py's
``quantize_fos_tensor``), gives the bits and scales of the same kernels run with emunum/nvfp4_quantize.py's
line arrays (torch's float32 ops), with zero tolerance: on tensors whose amax is ordinary, 0 (no finite nonzero
value), a float32 subnormal (denom / amax overflows: ges = FLT_MAX), or near FLT_MAX, with inf and NaN beside
it, 1-D blocks and 16-row tiles, serial and parallel, rounded to nearest and stochastically; ``quantize`` takes it
for the presets."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import emunum
from emunum.block_quantize import block_args
from emunum.formats import BLOCK_PRESETS, BlockFormat, FourOverSix, RoundMode
from emunum.kernels import nvfp4_cpu
from emunum.nvfp4_quantize import line_arrays

NEAREST = int(RoundMode.NEAREST)
SR = int(RoundMode.STOCHASTIC)
FORMATS = [
    BLOCK_PRESETS["nvfp4_4over6"],
    BLOCK_PRESETS["nvfp4_4over6_mse"],
    BLOCK_PRESETS["nvfp4_4over6_2d"],
    BlockFormat("fp4_e2m1", 16, "e4m3fn", scale_rule="amax", tensor_scale=True,
                four_over_six=FourOverSix("absmax", 448)),
]
SHAPE = (2, 37, 16 * 67 + 5)


def ordinary(rng):
    x = (rng.standard_normal(SHAPE) * 2.0 ** rng.integers(-20, 21, SHAPE[:2] + (1,))).astype(np.float32)
    x[0, 3, 5], x[1, 7, 9], x[1, 8, 100] = np.nan, np.inf, -np.inf
    return x


def zeros_and_infinities(rng):
    x = np.zeros(SHAPE, np.float32)
    x[0, 1, 2], x[1, 30, 1000] = np.inf, -np.inf
    x[0, 2, : SHAPE[2] // 2] = -0.0
    return x


def subnormal_amax(rng):
    return (np.float32(1e-45) * rng.integers(-40, 41, SHAPE)).astype(np.float32)


def huge_amax(rng):
    x = ordinary(rng)
    x[1, 2, 3] = np.float32(3.4e38)
    return x


MAKERS = [ordinary, zeros_and_infinities, subnormal_amax, huge_amax]


def run(x, fmt, parallel, kernel_amax, mode=NEAREST):
    tile = fmt.tile if fmt.tile[0] else (1, fmt.tile[1])
    P, R, C = x.shape
    scales = np.full((P, -(-R // tile[0]), -(-C // tile[1])), 7.0)
    dst = np.full_like(x, 7.0)
    args = block_args(fmt, 1.0)[:-1]
    if kernel_amax:
        fos = fmt.four_over_six
        assert nvfp4_cpu.quantize_fos_tensor(x, dst, scales, tile, 6 * fos.bound,
                                             {"mae": 0, "mse": 1, "absmax": 2}[fos.metric.value], args, mode, 977,
                                             8, parallel=parallel)
    else:
        lines = tuple(v.numpy() if isinstance(v, torch.Tensor) else v for v in line_arrays(torch.from_numpy(x), fmt))
        nvfp4_cpu.quantize_nvfp4(x, dst, scales, tile, lines, args, mode, 977, 8, parallel=parallel)
    return scales, dst


@pytest.mark.parametrize("mode", [NEAREST, SR], ids=["nearest", "stochastic"])
@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("make", MAKERS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_kernel_amax_equals_line_arrays_bits_and_scales(fmt, make, parallel, mode):
    x = make(np.random.default_rng(len(fmt.name)))
    want_s, want = run(x, fmt, parallel, False, mode)
    got_s, got = run(x, fmt, parallel, True, mode)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(got_s.view(np.uint64), want_s.view(np.uint64))


@pytest.mark.parametrize("make", MAKERS, ids=lambda f: f.__name__)
def test_tensor_line_values_equal_line_arrays(make):
    x = make(np.random.default_rng(1))
    _, _, ges, gds, gamax, denom, _ = line_arrays(torch.from_numpy(x), FORMATS[0])
    amax = np.abs(x[np.isfinite(x)]).max(initial=0).astype(np.float32)
    got = nvfp4_cpu.tensor_line_values(int(amax.view(np.uint32)), denom)
    assert [np.float32(v).view(np.uint32) for v in got] == [np.float32(t[0]).view(np.uint32) for t in
                                                              (gamax.numpy(), ges.numpy(), gds.numpy())]


@pytest.mark.parametrize("name", ["nvfp4_4over6", "nvfp4_4over6_2d"])
def test_quantize_takes_the_kernel_amax_path(name, monkeypatch):
    x = torch.from_numpy(ordinary(np.random.default_rng(2))[0])
    calls = []
    real = nvfp4_cpu.quantize_fos_tensor
    monkeypatch.setattr(nvfp4_cpu, "quantize_fos_tensor", lambda *a, **k: calls.append(1) or real(*a, **k))
    got = emunum.quantize(x, name)
    assert calls
    monkeypatch.setattr(nvfp4_cpu, "quantize_fos_tensor", lambda *a, **k: False)
    assert torch.equal(got.view(torch.int32), emunum.quantize(x, name).view(torch.int32))


@pytest.mark.parametrize("bound", [448, 256])
def test_tensor_line_values_equal_torch_float32_rule_across_exponents(bound):
    # every float32 exponent, subnormals included, with the smallest, largest and random mantissas, and 0: the
    # quotient's rounding, its overflow to FLT_MAX and the reciprocal, against line_arrays' torch ops
    rng = np.random.default_rng(bound)
    mant = np.concatenate([[0, 1, 0x7FFFFF], rng.integers(0, 1 << 23, 5)]).astype(np.uint32)
    bits = np.concatenate([[0], ((np.arange(255, dtype=np.uint32)[:, None] << 23) | mant).ravel()[1:]])
    denom = np.float32(6 * bound)
    gamax = torch.from_numpy(bits.astype(np.uint32).view(np.float32))
    ges = torch.clamp(torch.tensor(float(denom), dtype=torch.float32) / gamax, max=float(np.finfo(np.float32).max))
    ges = torch.where(ges == 0, torch.ones_like(ges), ges)
    gds = torch.tensor(1.0, dtype=torch.float32) / ges
    want = np.stack([gamax.numpy(), ges.numpy(), gds.numpy()], 1).view(np.uint32)
    got = np.array([nvfp4_cpu.tensor_line_values(int(b), denom) for b in bits], np.float32).view(np.uint32)
    assert np.array_equal(got, want)
