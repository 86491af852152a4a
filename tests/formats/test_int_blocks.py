"""MXINT4 and NVINT4 (integer elements in blocks) against their definitions written here in exact fractions:
every deterministic rounding mode, ties included, float64 and float32 inputs, on ``emunum.quantize`` (CPU
kernels), ``BlockFormat.encode/decode`` and ``emunum.mad.block_matmul``.

Definitions (docs/formats_2026.md gives the sources):
- mxint4: blocks of 32 along the axis; X = 2**floor(log2 amax) (OCP MX v1.0 section 6.3 with the element's
  emax 0; 2**-127 for an all-zero block); element = round(x / X) on the grid 0.25 (two's-complement int4 read
  with 2 fractional bits), clipped to [-2, 1.75]; value = element * X.
- nvint4: T = fp32(amax_tensor / (7 * 448)) (1 if that amax is 0); blocks of 16 with
  S = e4m3(amax_block / 7 / T) (nearest even, at most 448, at least 2**-9); element = round(x / (S*T)) to an
  integer in [-8, 7]; value = element * S * T.
"""
from __future__ import annotations

import math
from fractions import Fraction as F

import numpy as np
import pytest
import torch

import emunum
from emunum.mad import MADUnit, block_matmul

MODES = ["nearest", "nearest_away", "toward_zero", "up", "down", "odd"]


def round_int(q: F, mode: str) -> int:
    """q rounded to an integer (the rounding modes' definitions)."""
    fl = math.floor(q)
    frac = q - fl
    if frac == 0:
        return fl
    if mode == "nearest":
        return fl + (frac > F(1, 2) or (frac == F(1, 2) and fl % 2 == 1))
    if mode == "nearest_away":
        return fl + (frac > F(1, 2) or (frac == F(1, 2) and q > 0))
    if mode == "toward_zero":
        return fl + (q < 0)
    if mode == "up":
        return fl + 1
    if mode == "down":
        return fl
    t = fl + (q < 0)  # odd: truncate, then make the last bit 1 (inexact here)
    return t if t % 2 else t + (1 if q > 0 else -1)


def e4m3(r: F) -> F:
    """The e4m3fn value nearest r >= 0 (ties to even), saturated to 448 and raised to 2**-9."""
    r = min(r, F(448))
    if r == 0:
        return F(1, 512)
    e = max(math.floor(math.log2(r)), -6)
    while F(2) ** e > r:
        e -= 1
    while F(2) ** (e + 1) <= r:
        e += 1
    quantum = F(2) ** (max(e, -6) - 3)
    return max(min(round_int(r / quantum, "nearest") * quantum, F(448)), F(1, 512))


def f32(r: F) -> F:
    """r rounded to float32 (nearest even; r zero or of a normal float32 magnitude)."""
    if r == 0:
        return F(0)
    if r < 0:
        return -f32(-r)
    e = math.floor(math.log2(r))
    while F(2) ** e > r:
        e -= 1
    while F(2) ** (e + 1) <= r:
        e += 1
    quantum = F(2) ** (e - 23)
    return round_int(r / quantum, "nearest") * quantum


def tensor_scale(x: np.ndarray, name: str) -> F:
    amax = max(abs(F(float(v))) for v in x.reshape(-1))
    return F(1) if name == "mxint4" or amax == 0 else f32(amax / (7 * 448))


def ref_mxint4(x: np.ndarray, mode: str) -> np.ndarray:
    out = np.empty(x.shape, dtype=np.float64)
    for r in range(x.shape[0]):
        for b in range(0, x.shape[1], 32):
            blk = [F(float(v)) for v in x[r, b:b + 32]]
            amax = max(abs(v) for v in blk)
            e = -127 if amax == 0 else max(min(math.floor(math.log2(amax)), 127), -127)
            if amax:
                while F(2) ** e > amax:
                    e -= 1
                while F(2) ** (e + 1) <= amax:
                    e += 1
            X = F(2) ** e
            for i, v in enumerate(blk):
                k = min(max(round_int(F(float(v / X)) * 4, mode), -8), 7)
                out[r, b + i] = float(F(k, 4) * X)
    return out


def ref_nvint4(x: np.ndarray, mode: str) -> np.ndarray:
    fin = [F(float(v)) for v in x.reshape(-1)]
    amax_t = max(abs(v) for v in fin)
    T = F(1) if amax_t == 0 else f32(amax_t / (7 * 448))
    out = np.empty(x.shape, dtype=np.float64)
    for r in range(x.shape[0]):
        for b in range(0, x.shape[1], 16):
            blk = [F(float(v)) for v in x[r, b:b + 16]]
            S = e4m3(max(abs(v) for v in blk) / 7 / T)
            for i, v in enumerate(blk):
                k = min(max(round_int(F(float(v / (S * T))), mode), -8), 7)
                out[r, b + i] = float(k * S * T)
    return out


REF = {"mxint4": ref_mxint4, "nvint4": ref_nvint4}


def inputs(name: str) -> np.ndarray:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 64)) * 2.0 ** rng.integers(-6, 6, (4, 1))
    x[1, :16] = 0.0  # an all-zero block (nvint4), half of one (mxint4)
    if name == "mxint4":  # every midpoint of the 0.25 grid under X = 1: j/8, j = -16..15
        x[2, :32] = np.arange(-16, 16) / 8.0
        x[2, 31] = 1.0
    else:  # T = 1 (tensor amax 7*448); a block of amax 7 (S = 1) holding every midpoint j/2 of the integers
        x[2, :16] = np.arange(-16, 0) / 2.0 + 0.25 * (np.arange(16) % 2)
        x[2, 15] = 7.0
        x[2, 16] = 7 * 448.0
        x[3, :16] = np.arange(-16, 16, 2) / 2.0
        x[3, 15] = 7.0
    return x


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["mxint4", "nvint4"])
def test_quantize_equals_the_definition_in_exact_fractions(name, mode):
    x = inputs(name)
    want = REF[name](x, mode)
    assert np.array_equal(emunum.quantize(torch.from_numpy(x), name, mode).numpy(), want)
    x32 = x.astype(np.float32)
    want32 = REF[name](x32.astype(np.float64), mode).astype(np.float32)
    assert np.array_equal(emunum.quantize(torch.from_numpy(x32), name, mode).numpy(), want32)


@pytest.mark.parametrize("name", ["mxint4", "nvint4"])
def test_encode_decode_round_trip_the_quantised_values(name):
    fmt, x = emunum.get_format(name), inputs(name)
    codes, scales, t = fmt.encode(x)
    assert codes.min() >= 0 and codes.max() < 16  # 4-bit codes
    assert np.array_equal(fmt.decode(codes, scales, tensor_scale=t), REF[name](x, "nearest"))


@pytest.mark.parametrize("name", ["mxint4", "nvint4"])
def test_a_nan_makes_its_block_nan(name):
    x = torch.ones(2, 32)
    x[0, 3] = float("nan")
    q = emunum.quantize(x, name)
    n = 32 if name == "mxint4" else 16
    assert torch.isnan(q[0, :n]).all() and not torch.isnan(q[1]).any()


def test_presets_are_block_formats_of_integer_elements():
    mx, nv = emunum.get_format("mxint4"), emunum.get_format("nvint4")
    assert (mx.element, mx.block_size, mx.scale.name, mx.bits) == (emunum.FixedFormat(4, 2), 32, "e8m0", 4.25)
    assert (nv.element, nv.block_size, nv.scale.name, nv.tensor_scale) == (emunum.FixedFormat(4, 0), 16, "e4m3fn",
                                                                            True)


@pytest.mark.parametrize("name", ["mxint4", "nvint4"])
def test_block_matmul_is_the_block_pair_datapath_on_the_quantised_operands(name):
    """fp32 accumulation of exact block-pair sums (emunum.mad.block's datapath): acc <- f32(acc + sum of the
    block pair's products, tensor scales left out), then acc <- f32(acc * f32(Ta * Tb))."""
    rng = np.random.default_rng(4)
    K = 64
    A = rng.standard_normal((3, K)).astype(np.float32).astype(np.float64)
    B = rng.standard_normal((K, 2)).astype(np.float32).astype(np.float64)
    got = block_matmul(torch.from_numpy(A).float(), torch.from_numpy(B).float(), name, name,
                       MADUnit(None, "fp32", fused=True)).double().numpy()
    ta, tb = tensor_scale(A, name), tensor_scale(B, name)
    qa = REF[name](A, "nearest")
    qb = REF[name](B.T.copy(), "nearest").T
    L = emunum.get_format(name).block_size
    for i in range(3):
        for j in range(2):
            acc = F(0)
            for s in range(0, K, L):
                acc = f32(acc + sum(F(qa[i, k]) / ta * (F(qb[k, j]) / tb) for k in range(s, s + L)))
            assert got[i, j] == float(f32(acc * f32(ta * tb)))
