"""The stochastic-rounding fast path of the block kernel (kernels/block_sr.py) gives the bits of the general loop
(``block_cpu.block_serial``, which ``quantize_blocks`` ran for every stochastic rounding before), scales
included, zero tolerance, with the same random bits (key, flat index): special values, element values and
midpoints at every scale, every sr_bits width, serial and parallel, with and without the amax pass; float
elements (NVFP4) and fixed-point ones (NVINT4's int4 and other codes), the latter also at their saturating
ends (-8 under subnormal or clipped scales). With per-row outer scales (``outer_scale="row"``, nvfp4_row) it gives
the bits and scales of the NVFP4-family scalar core (``nvfp4_cpu.quantize_nvfp4``'s ``row_block``), each row's
T_r in place of the tensor scale."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import emunum
from emunum.block_quantize import block_args
from emunum.formats import BLOCK_PRESETS, BlockFormat, FixedFormat, FloatFormat, RoundMode
from emunum.kernels import block_cpu, block_sr, nvfp4_cpu
from emunum.nvfp4_quantize import line_arrays

from test_block_fast import (blocks_led_by, both_signs, neighbours, rows_of_blocks,  # noqa: E402  (tests/kernels is
                             special_rows, tile_amaxes, tile_data)  # on sys.path)

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
    # power-of-two (E8M0) scales, every rule
    "mxfp8_e4m3": BLOCK_PRESETS["mxfp8_e4m3"],
    "mxfp8_e5m2_rceil": BlockFormat("e5m2", 32, "e8m0", scale_rule="rceil"),
    "mxfp6_e2m3_ceil": BlockFormat("fp6_e2m3", 32, "e8m0", scale_rule="ceil"),
    "mxfp4_e2m1_even": BlockFormat("fp4_e2m1", 32, "e8m0", scale_rule="even"),
    "mxfp6_e3m2_b16_rceil": BlockFormat("fp6_e3m2", 16, "e8m0", scale_rule="rceil"),
}
FIXED = {  # fixed-point elements (kind 1): codes code_min..code_max times 2**-f
    "nvint4": BLOCK_PRESETS["nvint4"],
    "int4_f3": BlockFormat(FixedFormat(4, 3), 16, "e4m3fn", scale_rule="amax", tensor_scale=True),
    "int4_fm2_e5m2_b32": BlockFormat(FixedFormat(4, -2), 32, "e5m2", scale_rule="amax"),  # codes * 4
    "int8_f4": BlockFormat(FixedFormat(8, 4), 16, "e4m3fn", scale_rule="amax", tensor_scale=True),
    "uint3": BlockFormat(FixedFormat(3, 0, signed=False), 8, "e4m3fn", scale_rule="amax"),  # x < 0: 0
    "mxint8": BLOCK_PRESETS["mxint8"],
    "mxint8_even": BlockFormat(BLOCK_PRESETS["mxint8"].element, 32, "e8m0", scale_rule="even"),
    "mxint4_rceil": BlockFormat(BLOCK_PRESETS["mxint4"].element, 32, "e8m0", scale_rule="rceil"),
}
FORMATS.update(FIXED)


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
@pytest.mark.parametrize("name", ["nvfp4", "e2m1fnuz_t", "e4m3_amax", "e3m2_nosub", "mxfp8_e4m3", "mxfp8_e5m2_rceil",
                                  "mxfp4_e2m1_even"])
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
    assert not block_sr.sr_ok(block_args(BlockFormat("fp32", 32, "e8m0", scale_rule="even"), 1.0))  # 23 bits: even
    assert not block_sr.sr_ok(block_args(BlockFormat(FixedFormat(1, 0), 16, "e4m3fn", scale_rule="amax"), 1.0))  # max 0
    huge = list(block_args(BLOCK_PRESETS["nvfp4"], 1.0))
    huge[13] = 2.0**901  # a largest scale whose quotients could leave float64's normal range
    assert not block_sr.sr_ok(tuple(huge))


@pytest.mark.parametrize("sr_bits", [None, 8])
@pytest.mark.parametrize("name", ["nvfp4", "nvint4"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_quantize_float32_stochastic_equals_the_float64_loop(axis, name, sr_bits):
    """emunum.quantize on float32 (this path, after the amax pass) equals float64 input (the general loop),
    rounded to float32, for the same seed and sr_bits: along every axis, with partial blocks, a NaN, and blocks
    of magnitudes 2**-14..2**8 (subnormal block scales: nvint4's -8)."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(40, 50, generator=g) * 2.0 ** torch.randint(-14, 9, (40, 1), generator=g)
    x[3, 7] = float("nan")
    for seed in (0, 11, -5):
        a = emunum.quantize(x, name, "stochastic", seed=seed, axis=axis, sr_bits=sr_bits)
        b = emunum.quantize(x.double(), name, "stochastic", seed=seed, axis=axis, sr_bits=sr_bits).float()
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), seed


def codes_of(x: np.ndarray, fmt: BlockFormat, t: float, key: int, nbits: int):
    """``assert_same``, then (codes, y): each element's code (q / (S T 2**-f), q a float32 rounding of the code
    times S T 2**-f) and x / (S T 2**-f) in float64."""
    assert_same(x, fmt, t, key=key, nbits=nbits)
    q, sc = reference(x, fmt, t, key, nbits)
    unit = np.repeat(sc, fmt.tile[1], axis=1)[:, :x.shape[1]] * t * fmt.element.eps
    codes = np.rint(q / unit)
    assert np.allclose(q / unit, codes, rtol=2.0**-20, atol=0)
    return codes, x / unit


@pytest.mark.parametrize("nbits", [1, 2, 8, 32])
@pytest.mark.parametrize("name", list(FIXED))
def test_fixed_sr_path_at_every_code_and_midpoint_of_every_scale(name, nbits):
    """For every scale S of the scale format (times T): blocks led by amax code_max 2**-f S T (its float32
    rounding), which sets S, holding the float32 neighbours of each code, midpoint and quarter point
    j/4 2**-f S T up to the amax, both signs, each 8 times (other random bits). With T = 0.375 every such point
    is a float32 (few significant bits), and at the exact midpoints both neighbouring codes occur: the random
    bits decide; T = float32(0.0123) puts most of them between float32s."""
    fmt = FIXED[name]
    el, tc = fmt.element, fmt.tile[1]
    scales = np.unique(np.abs(fmt.scale.values()))
    scales = scales[np.isfinite(scales) & (scales >= fmt.scale.min_subnormal)][::1 if el.bits <= 4 else 7]
    grid = np.arange(4 * el.code_max + 1) / 4 * el.eps
    for t in ((0.375, float(np.float32(0.0123))) if fmt.tensor_scale else (1.0,)):
        rows = []
        for s in scales:
            amax = np.float32(el.max * s * t)
            rest = both_signs(grid * s * t)
            rows.append(blocks_led_by(amax, np.tile(rest[np.abs(rest) <= amax], 8), tc))
        x = np.concatenate(rows)
        codes, y = codes_of(x, fmt, t, key=nbits * 7919, nbits=nbits)
        assert np.isin(codes, np.arange(el.code_min, el.code_max + 1)).all()
        if t not in (0.375, 1.0):  # midpoints not float32s
            continue
        for k in (0, 1, el.code_max // 2, el.code_max - 1):
            up = codes[y == k + 0.5]
            assert set(up.tolist()) == {k, k + 1}, (k, nbits)
            down = codes[y == -k - 0.5]
            assert set(down.tolist()) == ({-k, -k - 1} if el.signed else {0}), (k, nbits)


@pytest.mark.parametrize("nbits", [1, 8, 32])
@pytest.mark.parametrize("name", [n for n in FIXED if FIXED[n].element.signed and FIXED[n].scale_rule.value == "amax"])
def test_fixed_sr_path_saturates_and_reaches_code_min_where_the_scale_rounds_down(name, nbits):
    """Signed codes: y = x / (S T 2**-f) >= code_max gives code_max (+inf too), y <= code_min gives code_min (-inf
    too), and code_min < y < -code_max rounds stochastically to either end, both occurring. Such y arise where
    S lies below amax / (code_max 2**-f T): subnormal scales, a scale clipped at its max (T too small for the
    block) and an inf in the block (S = max). The blocks hold the float32 neighbours of (code_max - 1/2 ..
    code_max + 5) 2**-f S T, both signs, each 4 times. (Amax scales: a power-of-two scale's block maxima land
    elsewhere, and its largest scale times code_min overflows float32; the special-value and every-code tests
    cover those formats.)"""
    fmt = FIXED[name]
    el, sc, tc = fmt.element, fmt.scale, fmt.tile[1]
    t = float(np.float32(0.375)) if fmt.tensor_scale else 1.0
    near = (el.code_max + np.array([-0.5, 0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0])) * el.eps
    rows = []
    for want in np.linspace(sc.min_subnormal * 0.5, 2.0**sc.emin, 41)[1:]:
        amax = np.float32(want * el.max * t)
        _, s = reference(np.full((1, tc), amax, np.float32), fmt, t, 0, 32)
        rest = both_signs(near * float(s[0, 0]) * t)
        rows += [blocks_led_by(a, np.tile(rest[np.abs(rest) <= amax], 4), tc) for a in (amax, -amax)]
    full = float(sc.max) * t
    for first in (np.inf, -np.inf, 1e6 * full * el.max):  # an inf, or an amax past S's max: S = max
        rows.append(blocks_led_by(first, np.tile(both_signs(near * full), 4), tc))
    x = np.concatenate(rows)
    codes, y = codes_of(x, fmt, t, key=nbits + 3, nbits=nbits)
    assert (codes[y >= el.code_max] == el.code_max).all() and (codes[y <= el.code_min] == el.code_min).all()
    between = codes[(el.code_min < y) & (y < -el.code_max)]
    assert set(between.tolist()) == {-el.code_max, el.code_min}, nbits
    assert (codes == el.code_min).sum() > 100 and (y <= el.code_min).sum() > 100
    assert (codes[x == np.inf] == el.code_max).all() and (codes[x == -np.inf] == el.code_min).all()


# ---- round to nearest: fixed elements that no other float32 path takes (MXINT8/4, amax-scaled int8) -------------

NEAREST = int(RoundMode.NEAREST)
NEAREST_FIXED = [n for n in FIXED if block_cpu.fast_path_of(block_args(FIXED[n], 1.0)) is None]


def assert_same_nearest(x: np.ndarray, fmt: BlockFormat, t: float):
    """``quantize_blocks`` rounding float32 x to nearest (block_sr's ``nearest_range``) gives the general loop's
    bits and scales, serial and parallel, scanned or not, and in place."""
    args = block_args(fmt, t)
    R, C = x.shape
    tc = fmt.tile[1]
    src = np.ascontiguousarray(x).reshape(1, R, C)
    want, wsc = np.empty_like(src), np.empty((1, R, -(-C // tc)))
    block_cpu.block_serial(src, want, wsc, 1, tc, *args, NEAREST, np.uint64(0), 32)
    calls = []
    real = block_sr.quantize_sr
    for parallel, scanned, inplace in [(False, False, False), (True, False, False), (True, True, False),
                                       (False, False, True)]:
        dst, sc = (src.copy() if inplace else np.empty_like(src)), np.empty((1, R, -(-C // tc)))
        if scanned:
            block_cpu.block_amaxes(src, sc, tc, parallel=parallel)
        block_sr.quantize_sr = lambda *a, **k: calls.append(k.get("nearest")) or real(*a, **k)
        try:
            block_cpu.quantize_blocks(dst if inplace else src, dst, sc, (1, tc), args, NEAREST, 0, 32,
                                      parallel=parallel, scanned=scanned)
        finally:
            block_sr.quantize_sr = real
        bad = np.flatnonzero(dst.view(np.uint32) != want.view(np.uint32))
        assert bad.size == 0, (fmt.name, parallel, scanned, inplace, x.flat[bad[:5]], dst.flat[bad[:5]],
                               want.flat[bad[:5]])
        assert np.array_equal(sc.view(np.uint64), wsc.view(np.uint64)), (parallel, scanned, inplace)
    assert calls == [True] * 4  # the path was taken


@pytest.mark.parametrize("cols", [64, 96, 37, 5])
@pytest.mark.parametrize("name", NEAREST_FIXED)
def test_nearest_fixed_path_matches_the_general_loop_on_special_values(name, cols):
    fmt = FIXED[name]
    x = special_rows(np.random.default_rng(cols), cols)
    for t in ([0.0123, 1.0, 3.0e35] if fmt.tensor_scale else [1.0]):
        assert_same_nearest(x, fmt, float(np.float32(t)))


@pytest.mark.parametrize("name", NEAREST_FIXED)
def test_nearest_fixed_path_at_every_code_and_midpoint_of_every_scale(name):
    """Blocks led by amax code_max 2**-f S T for every scale S (of the power-of-two range: every 7th), holding
    the float32 neighbours of each code, midpoint (ties to the even code) and quarter point, both signs."""
    fmt = FIXED[name]
    el, tc = fmt.element, fmt.tile[1]
    scales = np.unique(np.abs(fmt.scale.values()))
    scales = scales[np.isfinite(scales) & (scales >= fmt.scale.min_subnormal)][::1 if el.bits <= 4 else 7]
    grid = np.arange(4 * el.code_max + 1) / 4 * el.eps
    t = 0.375 if fmt.tensor_scale else 1.0
    rows = []
    for s in scales:
        amax = np.float32(el.max * s * t)
        rest = both_signs(grid * s * t)
        rows.append(blocks_led_by(amax, neighbours(rest[np.abs(rest) <= amax]), tc))
    assert_same_nearest(np.concatenate(rows), fmt, t)


# ---- per-row outer scales (nvfp4_row): this path with each row's T_r, against the scalar core -----------------

ROW_FORMATS = {
    "nvfp4_row": BLOCK_PRESETS["nvfp4_row"],
    "e2m1_b32_row": BlockFormat("fp4_e2m1", 32, "e4m3fn", scale_rule="amax", outer_scale="row"),
    "e2m1_ue5m3_row": BlockFormat("fp4_e2m1", 16, "ue5m3", scale_rule="amax", outer_scale="row"),
    "e2m1fnuz_row": BlockFormat(_E2M1FNUZ, 16, "e4m3fn", scale_rule="amax", outer_scale="row"),
    "int4_row": BlockFormat(FixedFormat(4, 0), 16, "e4m3fn", scale_rule="amax", outer_scale="row"),
}


def row_rows(rng, cols: int) -> np.ndarray:
    """Rows of magnitudes 2**-60..2**60 (T_r far apart), ``special_rows``'s specials, and rows whose T_r would
    round to 0 (amax 2**-149, 2**-148: raised to 2**-149) or is 1 (all zeros)."""
    x = np.concatenate([special_rows(rng, cols),
                        (rng.standard_normal((12, cols)) * 2.0 ** rng.integers(-60, 61, (12, 1))).astype(np.float32)])
    x[13] = np.float32(1e-45) * (np.arange(cols) % 3)
    x[14] = np.float32(-1e-45) * (np.arange(cols) % 2)
    x[15, :cols // 2] = np.float32(1e-45)
    x[16, 0] = np.nan  # a NaN block in an otherwise tiny row
    x[16, 1:] = np.float32(3e-45)
    x[17, ::2] = np.inf
    return x


def row_core(x: np.ndarray, fmt: BlockFormat, key: int, nbits: int, fast: bool, parallel: bool = False):
    """(values, scales) of float32 x (P, R, C) by ``quantize_rows`` (fast; asserted to run) or by the scalar core
    ``quantize_nvfp4`` with emunum/nvfp4_quantize.py's line arrays, both from 7.0-filled outputs."""
    tc = fmt.tile[1]
    P, R, C = x.shape
    dst, sc = np.full_like(x, 7.0), np.full((P, R, -(-C // tc)), 7.0)
    args = block_args(fmt, 1.0)[:-1]
    if fast:
        assert nvfp4_cpu.quantize_rows(x, dst, sc, (1, tc), args, SR, key, nbits, parallel=parallel)
    else:
        lines = tuple(v.numpy() if isinstance(v, torch.Tensor) else v for v in line_arrays(torch.from_numpy(x), fmt))
        nvfp4_cpu.quantize_nvfp4(x, dst, sc, (1, tc), lines, args, SR, key, nbits, parallel=parallel)
    return dst, sc


@pytest.mark.parametrize("nbits", [32, 8, 1])
@pytest.mark.parametrize("cols", [64, 96, 37, 5])  # tiling the rows, and partial last blocks
@pytest.mark.parametrize("name", list(ROW_FORMATS))
def test_row_scaled_sr_path_gives_the_scalar_cores_bits_and_scales(name, cols, nbits):
    fmt = ROW_FORMATS[name]
    rng = np.random.default_rng(cols * 100 + nbits)
    x = np.stack([row_rows(rng, cols), row_rows(rng, cols)])  # P = 2: the row index runs over (p, r)
    for key in (12345, 2**64 - 1, 7):
        want, wsc = row_core(x, fmt, key, nbits, fast=False)
        for parallel in (False, True):
            got, sc = row_core(x, fmt, key, nbits, fast=True, parallel=parallel)
            bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
            assert bad.size == 0, (key, parallel, x.flat[bad[:5]], got.flat[bad[:5]], want.flat[bad[:5]])
            assert np.array_equal(sc.view(np.uint64), wsc.view(np.uint64)), (key, parallel)


@pytest.mark.parametrize("sr_bits", [None, 8])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_quantize_nvfp4_row_float32_stochastic_equals_the_float64_core(axis, sr_bits):
    """emunum.quantize on float32 (this path) equals float64 input (the scalar core), rounded to float32, for the
    same seed and sr_bits, along every axis: rows (lines along the axis) of magnitudes 2**-40..2**40, partial
    blocks, a NaN, an inf, a zero line and a line whose T_r would round to 0."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(40, 50, generator=g) * 2.0 ** torch.randint(-40, 41, (40, 1), generator=g)
    x = x * 2.0 ** torch.randint(-20, 21, (1, 50), generator=g)
    x[3, 7], x[5, 9], x[6, :], x[:, 11] = float("nan"), float("inf"), 0.0, 0.0
    x[8, :] = 1e-45 * (torch.arange(50) % 3)
    x[:, 12] = 1e-45 * (torch.arange(40) % 2)
    for seed in (0, 11, -5):
        a = emunum.quantize(x, "nvfp4_row", "stochastic", seed=seed, axis=axis, sr_bits=sr_bits)
        b = emunum.quantize(x.double(), "nvfp4_row", "stochastic", seed=seed, axis=axis, sr_bits=sr_bits).float()
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), seed


def test_row_scaled_sr_path_is_float32_1d_only():
    x = row_rows(np.random.default_rng(0), 32)[None]
    args = block_args(ROW_FORMATS["nvfp4_row"], 1.0)[:-1]
    sc = np.empty((1, x.shape[1], 2))
    assert not nvfp4_cpu.quantize_rows(x.astype(np.float64), x.astype(np.float64), sc, (1, 16), args, SR, 1, 32)
    assert nvfp4_cpu.quantize_rows(x, np.empty_like(x), sc, (1, 16), args, SR, 1, 32)
    assert not block_sr.rows_ok(args, np.array([1.0, 0.0]))  # a T_r of 0 (never made: raised to 2**-149)
    assert block_sr.rows_ok(args, np.array([1.0, 2.0**-149, float(np.float32(3.0e38))]))


# ---- 2-D tiles (nvfp4_2d): a block is tr rows x tc columns of the (P, R, C) array ------------------------------

TILE_FORMATS = {  # elements as above; the tile itself is a parameter of the tests
    "nvfp4_2d": BLOCK_PRESETS["nvfp4_2d"],
    "e2m1fnuz_t": FORMATS["e2m1fnuz_t"],
    "e3m2_nosub": FORMATS["e3m2_nosub"],
    "nvint4": FIXED["nvint4"],
    "uint3": FIXED["uint3"],
    "mxfp8_e4m3": FORMATS["mxfp8_e4m3"],
    "mxint8_even": FIXED["mxint8_even"],
}
TILES = [(16, 16), (8, 4), (1, 16), (32, 32), (3, 5)]
TILE_SHAPES = [(1, 64, 64), (2, 40, 50), (3, 17, 9), (2, 33, 48)]  # full tiles, and partial ones at either edge


def tile_reference(x: np.ndarray, tile, args: tuple, key: int, nbits: int):
    """(values, scales) of float32 x (P, R, C) in tiles by the general loop (``block_serial``), from 7.0-filled
    outputs."""
    P, R, C = x.shape
    dst, sc = np.full_like(x, 7.0), np.full((P, -(-R // tile[0]), -(-C // tile[1])), 7.0)
    block_cpu.block_serial(x, dst, sc, tile[0], tile[1], *args, SR, np.uint64(key), nbits)
    return dst, sc


def assert_same_tiles(x: np.ndarray, tile, args: tuple, key: int, nbits: int):
    """``quantize_blocks`` (serial, parallel, and in place) and ``quantize_sr`` from the tiles' amaxes
    (``scanned``) give ``tile_reference``'s bits and scales."""
    assert block_sr.sr_ok(args)
    want, wsc = tile_reference(x, tile, args, key, nbits)
    runs = []
    for parallel in (False, True):
        dst, sc = np.full_like(x, 7.0), np.full_like(wsc, 7.0)
        block_cpu.quantize_blocks(x, dst, sc, tile, args, SR, key, nbits, parallel=parallel)
        runs.append((("quantize_blocks", parallel), dst, sc))
        dst, sc = np.full_like(x, 7.0), tile_amaxes(x, tile)
        block_sr.quantize_sr(x, dst, sc, tile[1], args, key, nbits, parallel, True, tr=tile[0])
        runs.append((("scanned", parallel), dst, sc))
    inplace, sc = x.copy(), np.full_like(wsc, 7.0)
    block_cpu.quantize_blocks(inplace, inplace, sc, tile, args, SR, key, nbits, parallel=False)
    runs.append((("in place", False), inplace, sc))
    for how, got, sc in runs:
        bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
        assert bad.size == 0, (how, x.flat[bad[:5]], got.flat[bad[:5]], want.flat[bad[:5]])
        assert np.array_equal(sc.view(np.uint64), wsc.view(np.uint64)), how


@pytest.mark.parametrize("nbits", [32, 8, 1])
@pytest.mark.parametrize("tile", TILES, ids=[f"{r}x{c}" for r, c in TILES])
@pytest.mark.parametrize("name", list(TILE_FORMATS))
def test_sr_path_on_tiles_gives_the_general_loops_bits_and_scales(name, tile, nbits):
    """Tiles of every special kind (``tile_data``) on shapes with full and partial edge tiles and 1..3 planes,
    several tensor scales (tiny, huge, not a power of two) and keys."""
    fmt = TILE_FORMATS[name]
    rng = np.random.default_rng(tile[0] * 1000 + tile[1] * 10 + nbits)
    for shape in TILE_SHAPES:
        x = tile_data(rng, shape, tile)
        for t in ([0.0123, 2.0**-140, 1.0, 3.0e35, 1 / 3] if fmt.tensor_scale else [1.0]):
            for key in (12345, 2**64 - 1):
                assert_same_tiles(x, tile, block_args(fmt, float(np.float32(t))), key, nbits)


@pytest.mark.parametrize("name", ["nvfp4_2d", "nvint4"])
def test_sr_path_on_tiles_at_every_element_value_and_midpoint(name):
    """16x16 tiles whose amax (at a different row and column of each tile) fixes each scale S (times T), the rest
    of the tile the float32 neighbours of every element value, midpoint and quarter point times S * T, both
    signs."""
    fmt = TILE_FORMATS[name]
    el = fmt.element
    t = float(np.float32(0.0123))
    vals = np.unique(np.abs(el.values()))
    vals = vals[np.isfinite(vals)]
    pts = np.concatenate([(vals[:-1] + vals[1:]) / 2, vals, (3 * vals[:-1] + vals[1:]) / 4])
    scales = np.unique(np.abs(fmt.scale.values()))
    scales = scales[np.isfinite(scales) & (scales >= fmt.scale.min_subnormal)]
    tiles = []
    for i, s in enumerate(scales):
        v = np.resize(neighbours(pts * s * t), 256)
        v[np.abs(v) > np.float32(el.max * s * t)] = 0.0
        v[(i * 37) % 256] = np.float32(el.max * s * t) * (1 if i % 2 else -1)
        tiles.append(v.reshape(16, 16))
    x = np.concatenate(tiles, axis=1)[None]  # one row of tiles
    x = np.concatenate([x, x[:, :, ::-1]], axis=1)  # and again, each tile mirrored
    for nbits in (2, 32):
        assert_same_tiles(np.ascontiguousarray(x), (16, 16), block_args(fmt, t), 77 + nbits, nbits)


def test_float32_tiles_take_the_sr_path(monkeypatch):
    """``quantize_blocks`` hands float32 tiles with amax or power-of-two scales (mxfp4's rule) to block_sr (not the
    general loop); float64 data stays on the general loop."""
    calls = []
    real = block_sr.quantize_sr
    monkeypatch.setattr(block_sr, "quantize_sr", lambda *a, **k: calls.append(k.get("tr")) or real(*a, **k))
    x = tile_data(np.random.default_rng(1), (1, 32, 32), (16, 16))
    nvfp4_2d = BLOCK_PRESETS["nvfp4_2d"]
    for fmt, data, taken in [(nvfp4_2d, x, [16]), (nvfp4_2d, x.astype(np.float64), []),
                             (BLOCK_PRESETS["mxfp4_e2m1"], x, [16])]:
        calls.clear()
        block_cpu.quantize_blocks(data, np.empty_like(data), np.empty((1, 2, 2)), (16, 16), block_args(fmt, 0.375),
                                  SR, 1, 32)
        assert calls == taken, fmt.name


@pytest.mark.parametrize("sr_bits", [None, 8])
@pytest.mark.parametrize("name,block_size", [("nvfp4_2d", None), ("nvint4", (16, 16)), ("nvfp4", (8, 4)),
                                             ("nvfp4", (1, 16))])
def test_quantize_float32_tiles_stochastic_equal_the_float64_loop(name, block_size, sr_bits):
    """emunum.quantize of float32 (this path) equals float64 input (the general loop), rounded to float32, values
    and scales, for the same seed and sr_bits: a (2, 3, 40, 50) tensor (batch dims, partial edge tiles), tiles of
    magnitudes 2**-40..2**40, a NaN, an inf, a zero tile."""
    from emunum.block_quantize import quantize_block_checked
    from emunum.rng import seed_key
    fmt = emunum.get_format(name)
    if block_size is not None:
        fmt = BlockFormat(fmt.element, block_size, fmt.scale, scale_rule=fmt.scale_rule, tensor_scale=fmt.tensor_scale)
    g = torch.Generator().manual_seed(9)
    e = torch.randint(-40, 41, (2, 3, 3, 4), generator=g).repeat_interleave(16, 2).repeat_interleave(16, 3)
    x = torch.randn(2, 3, 40, 50, generator=g) * 2.0 ** e[..., :40, :50]
    x[0, 1, 3, 7], x[1, 2, 20, 33], x[1, 0, :16, :16] = float("nan"), float("inf"), 0.0
    nbits = 32 if sr_bits is None else sr_bits
    for seed in (0, 11, -5):
        a = emunum.quantize(x, fmt, "stochastic", seed=seed, sr_bits=sr_bits)
        b = emunum.quantize(x.double(), fmt, "stochastic", seed=seed, sr_bits=sr_bits).float()
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), seed
        _, sa = quantize_block_checked(x, fmt, RoundMode.STOCHASTIC, seed_key(seed), nbits, return_scales=True)
        _, sb = quantize_block_checked(x.double(), fmt, RoundMode.STOCHASTIC, seed_key(seed), nbits,
                                       return_scales=True)
        assert torch.equal(sa.view(torch.int64), sb.view(torch.int64)), seed
