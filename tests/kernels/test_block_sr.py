"""The stochastic-rounding fast path of the block kernel (kernels/block_sr.py) gives the bits of the general loop
(``block_cpu.block_serial``, which ``quantize_blocks`` ran for every stochastic rounding before), scales
included, zero tolerance, with the same random bits (key, flat index): special values, element values and
midpoints at every scale, every sr_bits width, serial and parallel, with and without the amax pass."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import emunum
from emunum.block_quantize import block_args
from emunum.formats import BLOCK_PRESETS, BlockFormat, FloatFormat, RoundMode
from emunum.kernels import block_cpu, block_sr

from test_block_fast import neighbours, rows_of_blocks, special_rows  # noqa: E402  (tests/kernels is on sys.path)

SR = int(RoundMode.STOCHASTIC)
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast")

_E2M1FNUZ = FloatFormat(2, 1, special="fnuz")  # no -0: a zero result is +0 (negzero 0)
FORMATS = {
    "nvfp4": BLOCK_PRESETS["nvfp4"],
    "nvfp4_b32": BlockFormat("fp4_e2m1", 32, "e4m3fn", scale_rule="amax", tensor_scale=True),
    "e2m1fnuz_t": BlockFormat(_E2M1FNUZ, 16, "e4m3fn", scale_rule="amax", tensor_scale=True),
    "e1m2_e5m2": BlockFormat(FloatFormat(1, 2, special="none"), 16, "e5m2", scale_rule="amax"),
    "e4m3_amax": BlockFormat("e4m3fn", 16, "e4m3fn", scale_rule="amax"),
    "e3m2_nosub": BlockFormat(FloatFormat(3, 2, special="fnuz", subnormals=False), 8, "e4m3fn", scale_rule="amax"),
}


def reference(x: np.ndarray, fmt: BlockFormat, t: float, key: int, nbits: int):
    """(values, scales) of float32 rows x (R, C) by the general loop, float32 in and out (the old path)."""
    R, C = x.shape
    tc = fmt.tile[1]
    src = np.ascontiguousarray(x).reshape(1, R, C)
    dst, sc = np.empty_like(src), np.empty((1, R, -(-C // tc)))
    block_cpu.block_serial(src, dst, sc, 1, tc, *block_args(fmt, t), SR, np.uint64(key), nbits)
    return dst.reshape(R, C), sc.reshape(R, -1)


def assert_same(x: np.ndarray, fmt: BlockFormat, t: float, key: int = 12345, nbits: int = 32):
    args = block_args(fmt, t)
    assert block_sr.sr_ok(args)
    want, wsc = reference(x, fmt, t, key, nbits)
    R, C = x.shape
    tc = fmt.tile[1]
    src = np.ascontiguousarray(x).reshape(1, R, C)
    for parallel in (False, True):
        for scanned in (False, True):
            dst, sc = np.empty_like(src), np.empty((1, R, -(-C // tc)))
            if scanned:
                block_cpu.block_amaxes(src, sc, tc, parallel=parallel)
            block_cpu.quantize_blocks(src, dst, sc, (1, tc), args, SR, key, nbits, parallel=parallel,
                                      scanned=scanned)
            got = dst.reshape(R, C)
            bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
            assert bad.size == 0, (fmt.name, parallel, scanned, x.flat[bad[:5]], got.flat[bad[:5]],
                                   want.flat[bad[:5]])
            assert np.array_equal(sc.reshape(R, -1).view(np.uint64), wsc.view(np.uint64)), (parallel, scanned)


@pytest.mark.parametrize("nbits", [1, 3, 8, 23, 32])
@pytest.mark.parametrize("cols", [64, 96, 37, 16, 5])  # tiling the rows, and partial last blocks
@pytest.mark.parametrize("name", list(FORMATS))
def test_sr_path_matches_the_general_loop_on_special_values(name, cols, nbits):
    """NaN and inf blocks, zeros of both signs, float32 subnormals, near-overflow and wide-range blocks."""
    fmt = FORMATS[name]
    x = special_rows(np.random.default_rng(cols + nbits), cols)
    x = np.concatenate([x] * 8)  # more draws of the random bits per value
    for t in ([0.0123, 2.0**-140, 1.0, 3.0e35, 1 / 3] if fmt.tensor_scale else [1.0]):
        assert_same(x, fmt, float(np.float32(t)), key=cols * 1000 + nbits, nbits=nbits)


@pytest.mark.parametrize("nbits", [2, 32])
@pytest.mark.parametrize("name", ["nvfp4", "e2m1fnuz_t", "e4m3_amax", "e3m2_nosub"])
def test_sr_path_at_every_element_value_and_midpoint_of_every_scale(name, nbits):
    """Blocks whose amax fixes each scale S of the scale format (times T), holding the float32 neighbours of
    every element value and midpoint times S * T (values on the grid, exact halves at sr_bits ties, and
    their neighbours), each repeated for many random draws."""
    fmt = FORMATS[name]
    t = float(np.float32(0.0123)) if fmt.tensor_scale else 1.0
    el = np.unique(np.abs(fmt.element.values()))
    el = el[np.isfinite(el)]
    pts = np.concatenate([(el[:-1] + el[1:]) / 2, el, (3 * el[:-1] + el[1:]) / 4])
    scales = np.unique(np.abs(fmt.scale.values()))
    scales = scales[np.isfinite(scales) & (scales >= fmt.scale.min_subnormal)]
    rows = [rows_of_blocks(np.array([fmt.element.max * s * t]), np.tile(neighbours(pts * s * t), 4),
                           fmt.tile[1], fmt.tile[1] * 8) for s in scales[::3]]
    assert_same(np.concatenate(rows), fmt, t, key=77, nbits=nbits)


@pytest.mark.parametrize("t", [0.0, float("inf"), 0.1])  # zero, infinite, not a float32 (0.1)
def test_sr_path_is_not_taken_where_its_proof_does_not_hold(t):
    assert not block_sr.sr_ok(block_args(BLOCK_PRESETS["nvfp4"], t))
    assert not block_sr.sr_ok(block_args(BLOCK_PRESETS["mxfp4_e2m1"], 1.0))  # a power-of-two rule
    assert not block_sr.sr_ok(block_args(BLOCK_PRESETS["mxint8"], 1.0))  # a fixed-point element
    huge = list(block_args(BLOCK_PRESETS["nvfp4"], 1.0))
    huge[13] = 2.0**901  # a largest scale whose quotients could leave float64's normal range
    assert not block_sr.sr_ok(tuple(huge))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_quantize_float32_stochastic_equals_the_float64_loop(axis):
    """emunum.quantize on float32 (this path, after the amax pass) equals float64 input (the general loop),
    rounded to float32, for the same seed: along every axis, with partial blocks and a NaN."""
    x = torch.randn(40, 50, generator=torch.Generator().manual_seed(6)) * 7
    x[3, 7] = float("nan")
    for seed in (0, 11, -5):
        a = emunum.quantize(x, "nvfp4", "stochastic", seed=seed, axis=axis)
        b = emunum.quantize(x.double(), "nvfp4", "stochastic", seed=seed, axis=axis).float()
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), seed
