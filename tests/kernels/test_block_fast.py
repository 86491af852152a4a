"""The float32 fast paths of the block kernel (kernels/block_fast.py) give the bits of the general float64 loop
(``block_cpu.block_serial``: the bit-level rounding core, x / full scale in float64), scales included, zero
tolerance: element midpoints and their float32 neighbours at every scale, clipped scales, NaN/inf blocks,
partial blocks, serial and parallel loops, and through ``emunum.quantize`` (axes, dtypes, out=, views)."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import emunum
from emunum.block_quantize import block_args
from emunum.formats import BLOCK_PRESETS, BlockFormat, FixedFormat, FloatFormat, RoundMode
from emunum.kernels import block_cpu, block_fast

POW2 = ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4_e2m1", "msfp12", "msfp16"]
RULES = ["ceil", "even", "rceil"]  # besides floor, the presets' own
NEAREST = int(RoundMode.NEAREST)
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # max * 2**127 in float32


def reference(x: np.ndarray, fmt: BlockFormat, t: float):
    """(values as float32, scales) of float32 rows x (R, C) by the general float64 loop."""
    R, C = x.shape
    tc = fmt.tile[1]
    src = x.astype(np.float64).reshape(1, R, C)
    dst, sc = np.empty_like(src), np.empty((1, R, -(-C // tc)))
    block_cpu.block_serial(src, dst, sc, 1, tc, *block_args(fmt, t), NEAREST, np.uint64(0), 32)
    return dst.astype(np.float32).reshape(R, C), sc.reshape(R, -1)


def fast(x: np.ndarray, fmt: BlockFormat, t: float, parallel: bool, path: str, prepass: bool = False):
    """The same through ``quantize_blocks`` (float32 in and out), asserting the fast path it takes; ``prepass``:
    with the per-block maxima of ``block_amaxes`` (as emunum.quantize runs NVFP4)."""
    args = block_args(fmt, t)
    assert block_cpu.fast_path_of(args) == path
    R, C = x.shape
    tc = fmt.tile[1]
    src = np.ascontiguousarray(x).reshape(1, R, C)
    dst, sc = np.empty((1, R, C), np.float32), np.empty((1, R, -(-C // tc)))
    if prepass:
        block_cpu.block_amaxes(src, sc, tc, parallel=parallel)
    block_cpu.quantize_blocks(src, dst, sc, (1, tc), args, NEAREST, 0, 32, parallel=parallel, scanned=prepass)
    return dst.reshape(R, C), sc.reshape(R, -1)


def assert_same(x, fmt, t, path):
    want, wsc = reference(x, fmt, t)
    for parallel, prepass in [(False, False), (True, False)] + [(False, True), (True, True)] * (path == "table"):
        got, gsc = fast(x, fmt, t, parallel, path, prepass)
        bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
        assert bad.size == 0, (fmt.name, parallel, prepass, x.flat[bad[:5]], got.flat[bad[:5]], want.flat[bad[:5]])
        assert np.array_equal(gsc.view(np.uint64), wsc.view(np.uint64)), (fmt.name, parallel, prepass)


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("cols", [4096, 96, 37, 5])  # tiling the rows (tc = 16 and 32), and partial last blocks
@pytest.mark.parametrize("tc", [16, 32])
def test_block_amaxes_are_each_blocks_largest_magnitude_and_the_finite_max(tc, cols, parallel):
    """``block_amaxes``: per block the largest |v| (from the bits: NaN above inf above every finite value), as
    float64, and over the whole array the largest finite |v| (inf and NaN skipped; 0.0 for none), from a numpy
    reading."""
    x = special_rows(np.random.default_rng(cols + tc), cols)
    x = np.concatenate([x] * (1 + 2**18 // x.size))  # past PARALLEL_MIN: the prange loop runs
    R = x.shape[0]
    src = x.reshape(1, R, cols)
    nbc = -(-cols // tc)
    amaxes = np.empty((1, R, nbc))
    amax = block_cpu.block_amaxes(src, amaxes, tc, parallel=parallel)
    pad = np.zeros((R, nbc * tc), np.uint32)
    pad[:, :cols] = x.view(np.uint32) & 0x7FFFFFFF
    want = pad.reshape(R, nbc, tc).max(axis=2).view(np.float32).astype(np.float64)
    assert np.array_equal(amaxes.reshape(R, nbc).view(np.uint64), want.view(np.uint64))
    finite = np.abs(x[np.isfinite(x)])
    assert amax == float(finite.max())
    only_special = np.array([[np.inf, np.nan, -np.inf] * 6], np.float32).reshape(1, 1, -1)
    assert block_cpu.block_amaxes(only_special, np.empty(-(-18 // tc)), tc, parallel=parallel) == 0.0


def neighbours(v: np.ndarray) -> np.ndarray:
    """The float32 values next to each float64 v: below, nearest (v itself when it is a float32) and above."""
    f = v.astype(np.float32)
    return np.concatenate([np.nextafter(f, np.float32(0)), f, np.nextafter(f, np.float32(np.inf)),
                           f * np.float32(-1)])


def rows_of_blocks(firsts: np.ndarray, rest: np.ndarray, tc: int, cols: int) -> np.ndarray:
    """Rows of ``cols`` elements in blocks of tc: each block's first element from ``firsts`` (its amax, fixing
    the scale), the other slots filled from ``rest`` in order (cycled)."""
    per_row = cols // tc
    nrows = -(-len(firsts) // per_row)
    x = np.resize(rest.astype(np.float32), (nrows, cols))
    x.reshape(nrows, per_row, tc)[:, :, 0] = np.resize(firsts.astype(np.float32), (nrows, per_row))
    return x


def special_rows(rng, cols: int) -> np.ndarray:
    x = (rng.standard_normal((16, cols)) * 2.0 ** rng.integers(-60, 60, (16, 1))).astype(np.float32)
    x[1, 4], x[2, 3], x[3, 0], x[4, 2] = np.nan, np.inf, -np.inf, -np.nan
    x[5] = 0.0
    x[6, :] = -0.0
    x[7] = (rng.standard_normal(cols) * 1e-42).astype(np.float32)  # float32 subnormals: scales clip low
    x[8] = rng.uniform(-3.4e38, 3.4e38, cols).astype(np.float32)  # near overflow
    x[9] = rng.choice([-1.0, 1.0], cols) * 2.0 ** rng.uniform(-126, 127, cols)  # wide range within blocks
    x[10, ::3] = 0.0
    x[11] = np.float32(3.4028235e38) * rng.choice([-1, 1], cols)
    x[12] = 2.0 ** -149
    return x


@pytest.mark.parametrize("cols", [64, 96, 37, 16, 5])  # tiling the rows, and partial last blocks
@pytest.mark.parametrize("name", POW2 + ["nvfp4"] + [f"{n}_{r}" for n in POW2[:5] for r in RULES])
def test_fast_paths_match_the_float64_loop_on_special_values(name, cols):
    fmt = emunum.get_format(name)
    x = special_rows(np.random.default_rng(cols), cols)
    for t in ([0.0123, 2.0**-140, 1.0, 3.0e35, float(np.float32(1 / 3))] if fmt.tensor_scale else [1.0]):
        assert_same(x, fmt, float(np.float32(t)), "table" if fmt.tensor_scale else "pow2")


@pytest.mark.parametrize("rule", ["floor", *RULES])
@pytest.mark.parametrize("name", POW2)
def test_pow2_path_at_every_element_midpoint_and_scale(name, rule):
    """Blocks whose amax fixes the scale at 2**e (e from below the clip at -127 to above 127 - emax), holding the
    float32 neighbours of every midpoint between element values (and of every value) times 2**e; every
    power-of-two scale rule."""
    fmt = BLOCK_PRESETS[name].with_scale_rule(rule)
    el = np.unique(np.abs(fmt.element.values()))
    mids = np.concatenate([(el[:-1] + el[1:]) / 2, el, [fmt.element.max * 1.0625, fmt.element.max * 2]])
    for e in list(range(-140, -100, 3)) + list(range(-12, 12)) + list(range(100, 128, 3)):
        amax = fmt.element.max * 2.0**e
        rest = neighbours(mids * 2.0**e)
        x = rows_of_blocks(np.array([amax, -amax]), rest, fmt.tile[1], fmt.tile[1] * 4)
        assert_same(x, fmt, 1.0, "pow2")


@pytest.mark.parametrize("t", [1.0, 0.375, 2.0**-20 * 1.5, float(np.float32(0.1)), float(np.float32(7e-40)),
                               float(np.float32(1e30))])
def test_table_path_at_every_threshold_of_every_scale(t):
    """For every e4m3 scale S (and T), blocks whose amax 6 * S * T (or its float32 rounding) sets the scale,
    holding the float32 neighbours of each midpoint M_i * S * T and of each value V_i * S * T: every compare of
    ``_threshold`` (ties up, ties down, RD/RU when M_i S T is no float32) at every row of the scale table."""
    fmt = BLOCK_PRESETS["nvfp4"]
    mids, ups, vals = block_fast.element_table(block_args(fmt, t)[:6])
    assert list(mids) == [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] and list(ups) == [False, True] * 3 + [False]
    scales = np.unique(np.abs(FloatFormat(4, 3, special="fn").values()))
    scales = scales[scales >= 2.0**-9]
    firsts, rest = [], []
    for s in scales:
        full = s * t
        firsts.append(6.0 * full)
        rest.append(neighbours(np.concatenate([mids, vals]) * full))
    x = np.concatenate([rows_of_blocks(np.array([f]), r, 16, 16 * 4) for f, r in zip(firsts, rest)])
    assert_same(x, fmt, t, "table")


@pytest.mark.parametrize("t", [0.0, float("inf"), 0.1])  # not float32 (0.1), zero or infinite: the old loop
def test_table_path_is_not_taken_where_its_proof_does_not_hold(t):
    fmt = BLOCK_PRESETS["nvfp4"]
    assert block_cpu.fast_path_of(block_args(fmt, t)) is None
    assert block_cpu.fast_path_of(block_args(BLOCK_PRESETS["mxint8"], 1.0)) is None
    e4m3_amax = BlockFormat("e4m3fn", 16, "e4m3fn", scale_rule="amax")  # 126 positive values: not a table
    assert block_cpu.fast_path_of(block_args(e4m3_amax, 1.0)) is None
    wide = BlockFormat("e4m3fn", 32, FloatFormat(8, 23), scale_rule="ocp")  # 2**-149..: 1/S is no float32
    assert block_cpu.fast_path_of(block_args(wide, 1.0)) is None


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "nvfp4", "mxfp4_e2m1"])
def test_quantize_float32_equals_float64_quantize_along_every_axis(name):
    """emunum.quantize on float32 (the fast paths) gives the float64 path's result rounded to float32: along
    every axis (partial last blocks), non-contiguous views, out= and new outputs."""
    rng = np.random.default_rng(3)
    x64 = rng.standard_normal((20, 33, 48)) * 2.0 ** rng.integers(-30, 30, (20, 1, 1))
    x64[3, 4, 5], x64[7, 0, 0] = np.nan, -np.inf
    x = torch.from_numpy(x64.astype(np.float32))
    for axis in (0, 1, 2, -1):
        want = emunum.quantize(x.double(), name, axis=axis).float()
        got = emunum.quantize(x, name, axis=axis)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), axis
    out = torch.empty_like(x)
    assert emunum.quantize(x, name, out=out) is out
    assert torch.equal(out.view(torch.int32), emunum.quantize(x.double(), name).float().view(torch.int32))
    inplace = x.clone()
    assert emunum.quantize(inplace, name, out=inplace) is inplace  # dst is src
    assert torch.equal(inplace.view(torch.int32), out.view(torch.int32))
    view = x.transpose(0, 2)  # non-contiguous
    want = emunum.quantize(view.contiguous().double(), name).float()
    assert torch.equal(emunum.quantize(view, name).view(torch.int32), want.view(torch.int32))
    out2 = torch.empty_like(view)
    emunum.quantize(view, name, out=out2)
    assert torch.equal(out2.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["mxfp8_e4m3", "nvfp4"])
def test_16bit_inputs_take_the_fast_path_through_float32(name, dtype):
    x = (torch.randn(8, 64, generator=torch.Generator().manual_seed(4)) * 100).to(dtype)
    x[1, 3] = float("nan")
    want = emunum.quantize(x.double(), name).to(dtype)
    assert torch.equal(emunum.quantize(x, name).view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "nvfp4"])
def test_stochastic_rounding_float32_equals_float64(name):
    """Stochastic rounding of float32 (kernels/block_sr.py for amax scales, else the general loop) gives the bits
    of float64 input (the general loop) for the same seed."""
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(5)) * 10
    for seed in (0, 7):
        a = emunum.quantize(x, name, "stochastic", seed=seed)
        b = emunum.quantize(x.double(), name, "stochastic", seed=seed).float()
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))


_E2M1FNUZ = FloatFormat(2, 1, special="fnuz")  # no -0: a zero result is +0 (negzero 0)
CUSTOM = [
    (BlockFormat(_E2M1FNUZ, 16, "e4m3fn", scale_rule="amax", tensor_scale=True), "table"),
    (BlockFormat(FloatFormat(1, 2, special="none"), 16, "e5m2", scale_rule="amax"), "table"),
    (BlockFormat(_E2M1FNUZ, 32), "pow2"),
    (BlockFormat(FloatFormat(4, 3, special="fnuz"), 32), "pow2"),
    (BlockFormat(FloatFormat(3, 2, special="fnuz", subnormals=False), 32), "pow2"),
    (BlockFormat(FloatFormat(2, 1, special="none", subnormals=False), 16), "pow2"),
    (BlockFormat("e4m3fn", 8, "e4m3fn", scale_rule="ocp"), "pow2"),  # scale exponents clipped to [-9, 8]
]


@pytest.mark.parametrize("fmt,path", CUSTOM, ids=[f.name for f, _ in CUSTOM])
def test_fast_paths_on_other_elements_and_scales(fmt, path):
    """Elements without -0 or without subnormals, other seven-value elements and scale formats."""
    tc = fmt.tile[1]
    t = float(np.float32(0.0123)) if fmt.tensor_scale else 1.0
    assert_same(special_rows(np.random.default_rng(9), 4 * tc + 3), fmt, t, path)
    el = np.unique(np.abs(fmt.element.values()))
    mids = np.concatenate([(el[:-1] + el[1:]) / 2, el])
    for e in (-130, -20, -3, 0, 5, 40, 120):
        full = 2.0**e * (0.75 if path == "table" else 1.0)
        x = rows_of_blocks(np.array([fmt.element.max * full]), neighbours(mids * full), tc, tc * 4)
        assert_same(x, fmt, 1.0, path)


def _binades(lo_exp: int, hi_exp: int, top: float):
    """Every positive float32 in [2**lo_exp, 2**(hi_exp + 1)) up to ``top``, one binade at a time."""
    for k in range(max(lo_exp, -149), hi_exp + 1):
        v = np.arange(np.float32(2.0**k).view(np.uint32), np.float32(2.0 ** (k + 1)).view(np.uint32),
                      dtype=np.uint32).view(np.float32)
        yield v[v <= top]


def _sweep(fmt, t, first, lo_exp, hi_exp, path):
    """Blocks led by ``first`` (their amax) holding every float32 of the binades, both signs."""
    tc = fmt.tile[1]
    for v in _binades(lo_exp, hi_exp, first):
        for sign in (1, -1):
            assert_same(rows_of_blocks(np.array([first]), v * np.float32(sign), tc, tc * 4096), fmt, t, path)


@pytest.mark.exhaustive
@pytest.mark.parametrize("name", POW2)
def test_pow2_path_on_every_float32_at_scale_one(name):
    """Scale 1 (amax = the element max): every float32 magnitude from below the element's smallest step to its
    max (other scales only move the exponent: module doc of kernels/block_fast.py)."""
    el = BLOCK_PRESETS[name].element
    _sweep(BLOCK_PRESETS[name], 1.0, el.max, el.emin - el.man - 3, int(np.floor(np.log2(el.max))), "pow2")


@pytest.mark.exhaustive
@pytest.mark.parametrize("s,t", [(1.0, 1.0), (0.140625, float(np.float32(0.1))), (448.0, float(np.float32(1 / 3))),
                                 (2.0**-9, float(np.float32(1 / 3)))])
def test_table_path_on_every_float32_around_the_thresholds(s, t):
    full = s * t
    _sweep(BLOCK_PRESETS["nvfp4"], t, np.float32(6 * full), int(np.floor(np.log2(full / 4))) - 1,
           int(np.floor(np.log2(6 * full))), "table")


def test_table_path_with_scanned_starts_from_the_amaxes_in_scales():
    """With ``scanned`` the table path takes each block's amax from ``scales`` (the amax pass's output), not from
    the data: amaxes of zero give every block the smallest scale, as all-zero blocks would."""
    fmt = BLOCK_PRESETS["nvfp4"]
    t = float(np.float32(0.0123))
    x = np.random.default_rng(5).standard_normal((4, 64)).astype(np.float32).reshape(1, 4, 64)
    args = block_args(fmt, t)
    dst, sc = np.empty_like(x), np.zeros((1, 4, 4))
    block_cpu.quantize_blocks(x, dst, sc, (1, 16), args, NEAREST, 0, 32, parallel=False, scanned=True)
    assert np.all(sc == fmt.scale.min_subnormal)
    want, wsc = reference(x.reshape(4, 64), fmt, t)
    assert not np.array_equal(dst.reshape(4, 64), want)
    block_cpu.block_amaxes(x, sc, 16, parallel=False)
    block_cpu.quantize_blocks(x, dst, sc, (1, 16), args, NEAREST, 0, 32, parallel=False, scanned=True)
    assert np.array_equal(dst.reshape(4, 64).view(np.uint32), want.view(np.uint32))
    assert np.array_equal(sc.reshape(4, 4), wsc)


# ---- signed int4 elements (NVINT4) on the table path: against block_serial and the definition in fractions ----

def _rne(q: Fraction) -> int:
    """q rounded to the nearest integer, ties to even."""
    fl = math.floor(q)
    r = q - fl
    return fl + (r > Fraction(1, 2) or (r == Fraction(1, 2) and fl % 2 == 1))


def _round_float(r: Fraction, man: int, emin: int) -> Fraction:
    """r >= 0 rounded to nearest (ties to even) on the grid of a float of man mantissa bits with subnormals below
    2**emin, no upper limit."""
    if r == 0:
        return r
    e = r.numerator.bit_length() - r.denominator.bit_length()
    e -= Fraction(2) ** e > r  # floor(log2 r)
    quantum = Fraction(2) ** (max(e, emin) - man)
    return _rne(r / quantum) * quantum


def _f32(r: Fraction, negative: bool) -> np.float32:
    """The float32 nearest r >= 0 (ties to even; inf from 2**128 on), negated where ``negative`` (-0 included)."""
    v = _round_float(r, 23, -126)
    f = np.float32(np.inf) if v >= 2**128 else np.float32(float(v))  # float(v): exact, v is a float32 value
    return -f if negative else f


def int4_definition(x: np.ndarray, fmt: BlockFormat, t: float):
    """(values, codes) of float32 rows x (R, C) through ``fmt`` (a signed 4-bit fixed element of frac_bits f,
    amax scales, tensor scale t) by the definition (emunum/formats/block.py), in exact fractions, per block of tc
    along the rows: NaN everywhere (code 99) if it holds a NaN; else S = the scale format's value nearest
    min(amax / (7 2**-f) / t, its max) (ties to even), at least its smallest; each element's code k = x / (S t)
    2**f rounded to the nearest integer (ties to even) and clamped to [-8, 7] (+inf: 7, -inf: -8), its value
    float32(k 2**-f S t): +0 for k = 0, else with k's sign."""
    el, sc, tc = fmt.element, fmt.scale, fmt.tile[1]
    T, step = Fraction(t), Fraction(2) ** -el.frac_bits
    values, codes = np.empty(x.shape, np.float32), np.full(x.shape, 99)
    for r in range(x.shape[0]):
        for c0 in range(0, x.shape[1], tc):
            blk = x[r, c0:c0 + tc]
            if np.isnan(blk).any():
                values[r, c0:c0 + tc] = np.nan
                continue
            want = Fraction(sc.max) if np.isinf(blk).any() else \
                min(max(abs(Fraction(float(v))) for v in blk) / (7 * step) / T, Fraction(sc.max))
            full = max(_round_float(want, sc.man, sc.emin), Fraction(sc.min_subnormal)) * T
            for j, v in enumerate(blk):
                k = (7 if v > 0 else -8) if np.isinf(v) else min(max(_rne(Fraction(float(v)) / (full * step)), -8), 7)
                codes[r, c0 + j] = k
                values[r, c0 + j] = np.float32(0.0) if k == 0 else _f32(abs(k) * step * full, k < 0)
    return values, codes


def assert_int4(x: np.ndarray, fmt: BlockFormat, t: float) -> np.ndarray:
    """``assert_same`` (the table path against ``block_serial``, scales included, serial and parallel, with and
    without the amax pass), and its values against ``int4_definition``, bit for bit; returns the codes."""
    assert_same(x, fmt, t, "table")
    want, codes = int4_definition(x, fmt, t)
    got, _ = fast(x, fmt, t, False, "table")
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, (fmt.name, t, x.flat[bad[:5]], got.flat[bad[:5]], want.flat[bad[:5]], codes.flat[bad[:5]])
    return codes


def blocks_led_by(first: float, rest: np.ndarray, tc: int) -> np.ndarray:
    """Rows of one block of tc each: ``first`` (the amax that sets the scale), then ``rest`` in order (cycled)."""
    n = -(-len(rest) // (tc - 1))
    x = np.empty((n, tc), np.float32)
    x[:, 0] = first
    x[:, 1:] = np.resize(rest.astype(np.float32), (n, tc - 1))
    return x


def both_signs(v: np.ndarray) -> np.ndarray:
    """The float32 values next to each float64 v >= 0 (below, nearest, above), and their negatives."""
    f = v.astype(np.float32)
    near = np.concatenate([np.nextafter(f, np.float32(0)), f, np.nextafter(f, np.float32(np.inf))])
    return np.concatenate([near, -near])


_E4M3 = FloatFormat(4, 3, special="fn")
INT4 = [BLOCK_PRESETS["nvint4"],
        BlockFormat(FixedFormat(4, 3), 16, _E4M3, scale_rule="amax", tensor_scale=True),  # codes * 2**-3
        BlockFormat(FixedFormat(4, -2), 32, FloatFormat(5, 2), scale_rule="amax")]  # codes * 4, e5m2 scales
INT4_IDS = [f.name for f in INT4]


def _with_element(el, tc=16, scale=_E4M3, **kw):
    return BlockFormat(el, tc, scale, scale_rule="amax", **{"tensor_scale": True, **kw})


TABLE_OR_NOT = [
    (BLOCK_PRESETS["nvint4"], "table"),
    (_with_element(FixedFormat(4, 0), tensor_scale=False), "table"),  # single level
    (INT4[1], "table"),
    (INT4[2], "table"),
    (_with_element(FixedFormat(4, 0), scale=FloatFormat(8, 23)), None),  # fp32 block scales: too many table rows
    (_with_element(FixedFormat(3, 0, signed=False)), None),  # codes 0..7: every x < 0 gives +0, no table
    (_with_element(FixedFormat(3, 0)), None),  # three positive values
    (_with_element(FixedFormat(5, 1)), None),  # fifteen
    (BLOCK_PRESETS["mxint4"], None),  # power-of-two scales: pow2_* takes float elements only
    (BLOCK_PRESETS["mxint8"], None),
]


@pytest.mark.parametrize("fmt,path", TABLE_OR_NOT, ids=[f.name for f, _ in TABLE_OR_NOT])
def test_table_path_takes_signed_int4_elements_under_amax_scales_alone(fmt, path):
    """``table_ok``: of the fixed elements, signed 4-bit ones (any frac_bits) under amax scales into a float scale
    format of at most 4096 table rows; their table is the 7 positive codes and the negative end -8, ties to the
    even code; ``element_table`` (the NVFP4 family's kernels' gate, kernels/nvfp4_cpu.py) stays float-only."""
    args = block_args(fmt, float(np.float32(0.0123)))
    assert block_cpu.fast_path_of(args) == path
    assert block_fast.element_table(args[:6]) is None
    if path == "table":
        mids, ups, vals = block_fast.table_of(args[:6])
        step = fmt.element.eps
        assert list(mids / step) == [0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5]
        assert list(ups) == [False, True] * 4 and list(vals / step) == [1, 2, 3, 4, 5, 6, 7, 8]


@pytest.mark.parametrize("t", [1.0, 0.375, float(np.float32(0.1)), float(np.float32(7e-40)), float(np.float32(1e30))])
@pytest.mark.parametrize("fmt", INT4, ids=INT4_IDS)
def test_int4_table_path_at_every_code_and_midpoint_of_every_scale(fmt, t):
    """For every scale S (and T): blocks led by amax 7 2**-f S T (its float32 rounding), which sets S, holding the
    float32 neighbours of each code and midpoint j/2 2**-f S T up to the amax (j = 0..14), both signs: every
    threshold's compare, ties up and down (the ends past 7: the next test)."""
    step = fmt.element.eps
    scales = np.unique(np.abs(fmt.scale.values()))
    scales = scales[np.isfinite(scales) & (scales >= fmt.scale.min_subnormal)]
    grid = np.arange(15) / 2 * step
    rows = []
    for s in scales:
        amax = np.float32(7 * step * s * t)
        rest = both_signs(grid * s * t)
        rows.append(blocks_led_by(amax, rest[np.abs(rest) <= amax], fmt.tile[1]))
    codes = assert_int4(np.concatenate(rows), fmt, t)
    assert (codes == -7).any() and (codes == 7).any()


@pytest.mark.parametrize("t", [1.0, 0.375, float(np.float32(0.3))])  # ties exact in float32 (1.0, 0.375) or not
@pytest.mark.parametrize("fmt", INT4, ids=INT4_IDS)
def test_int4_negatives_saturate_at_minus_8_where_the_scale_rounds_down(fmt, t):
    """x / (S T) <= -7.5 2**-f (the tie included: -8 is even) gives -8, >= 6.5 2**-f up to +inf gives 7, where S
    lies below amax / (7 2**-f T) by more than half a scale step: subnormal scales (amax / (7 2**-f T) among the
    scale format's subnormals), the scale clipped at its max (a T too small for the block) and an inf in the
    block (S = max); the blocks hold the float32 neighbours of 6.5..12 2**-f S T, both signs."""
    sc, tc, step = fmt.scale, fmt.tile[1], fmt.element.eps
    near = np.array([6.5, 7.0, 7.25, 7.5, 7.75, 8.0, 8.5, 9.0, 12.0]) * step
    rows = []
    for want in np.linspace(sc.min_subnormal * 0.5, 2.0**sc.emin, 41)[1:]:
        amax = float(np.float32(want * 7 * step * t))
        full = float(max(_round_float(Fraction(amax) / (7 * Fraction(step)) / Fraction(t), sc.man, sc.emin),
                         Fraction(sc.min_subnormal))) * t
        rest = both_signs(near * full)
        rows += [blocks_led_by(a, rest[np.abs(rest) <= amax], tc) for a in (amax, -amax)]
    full = float(sc.max) * t
    for first in (np.inf, -np.inf, 1e6 * full * step):  # an inf, or an amax past max * 7 2**-f * T: S = max
        rows.append(blocks_led_by(first, both_signs(near * full), tc))
    codes = assert_int4(np.concatenate(rows), fmt, t)
    assert (codes == -8).sum() > 100 and (codes == 7).sum() > 100


@pytest.mark.parametrize("cols", [64, 37, 16, 5])  # tiling the rows, and partial last blocks
@pytest.mark.parametrize("fmt", INT4, ids=INT4_IDS)
def test_int4_table_path_on_special_values(fmt, cols):
    """Signed zeros and negatives rounding to zero (+0), NaN blocks, +-inf (7 and -8), float32 subnormals and
    values near overflow (products past float32's max: inf), partial last blocks, several T."""
    x = special_rows(np.random.default_rng(cols), cols)
    for t in [0.0123, 2.0**-140, 1.0, 3.0e35]:
        assert_int4(x, fmt, float(np.float32(t)))
        got, _ = fast(x, fmt, float(np.float32(t)), False, "table")
        assert not np.signbit(got[5:7]).any()  # rows of +0 and of -0: +0


@pytest.mark.parametrize("seed", range(4))
def test_nvint4_quantize_float32_equals_float64_and_the_definition(seed):
    """``emunum.quantize(x, "nvint4")`` on float32 (the amax pass, then the table path) gives the float64 path's
    bits (the general loop) along both axes, and the definition's, T = float32(amax / (7 * 448)) included; the
    blocks' magnitudes spread over 2**-14..2**8 so that some scales are subnormal and give -8."""
    rng = np.random.default_rng(seed)
    x64 = rng.standard_normal((16, 160)) * np.repeat(2.0 ** rng.integers(-14, 8, (16, 10)), 16, axis=1)
    x64[rng.random(x64.shape) < 0.03] = 0.0
    x = torch.from_numpy(x64.astype(np.float32))
    for axis in (-1, 0):
        got = emunum.quantize(x, "nvint4", axis=axis)
        want = emunum.quantize(x.double(), "nvint4", axis=axis).float()
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), axis
    amax = Fraction(float(x.abs().max()))
    t = float(_f32(amax / (7 * 448), False))
    want, codes = int4_definition(x.numpy(), BLOCK_PRESETS["nvint4"], t)
    got = emunum.quantize(x, "nvint4").numpy()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert (codes == -8).any()


# ---- 2-D tiles (nvfp4_2d), round to nearest: the table path with a block of tr rows x tc columns ---------------

def tile_data(rng, shape, tile) -> np.ndarray:
    """(P, R, C) float32 whose tiles each have their own magnitude (2**-60..2**60) and one of: plain values, a NaN,
    an inf of either sign, zeros of both signs, float32 subnormals, 2**-149 alone, near-overflow values, a wide
    range 2**-126..2**127, +-float32 max (the tile's kind cycles; its amax anywhere in the tile, not only in its
    first row)."""
    P, R, C = shape
    tr, tc = tile
    x = rng.standard_normal(shape).astype(np.float32)
    kind = 0
    for p in range(P):
        for r0 in range(0, R, tr):
            for c0 in range(0, C, tc):
                v = x[p, r0:r0 + tr, c0:c0 + tc]
                n = v.shape
                k = kind % 10
                kind += 1 + (p + r0 // tr) % 3  # tiles of every kind land on every tile row and column
                if k == 0:
                    v *= np.float32(2.0 ** rng.integers(-60, 61))
                    v[rng.integers(n[0]), rng.integers(n[1])] *= 64  # the amax somewhere in the tile
                elif k == 1:
                    v[rng.integers(n[0]), rng.integers(n[1])] = np.nan
                elif k == 2:
                    v[rng.integers(n[0]), rng.integers(n[1])] = rng.choice([np.inf, -np.inf])
                elif k == 3:
                    v[...] = rng.choice([0.0, -0.0], n)
                elif k == 4:
                    v[...] = (rng.standard_normal(n) * 1e-42).astype(np.float32)
                elif k == 5:
                    v[...] = np.where(rng.random(n) < 0.3, np.float32(2.0**-149), np.float32(0.0))
                elif k == 6:
                    v[...] = rng.uniform(-3.4e38, 3.4e38, n).astype(np.float32)
                elif k == 7:
                    v[...] = (rng.choice([-1.0, 1.0], n) * 2.0 ** rng.uniform(-126, 127, n)).astype(np.float32)
                elif k == 8:
                    v[...] = np.float32(3.4028235e38) * rng.choice([-1, 1], n).astype(np.float32)
                else:
                    v[...] = -0.0  # a tile of -0 only
    return x


def tile_amaxes(x: np.ndarray, tile) -> np.ndarray:
    """Each tile's largest |v| (NaN where it holds one), as ``scanned`` takes them; float64 (P, nbr, nbc)."""
    P, R, C = x.shape
    tr, tc = tile
    nbr, nbc = -(-R // tr), -(-C // tc)
    a = np.zeros((P, nbr * tr, nbc * tc), np.float64)
    a[:, :R, :C] = np.abs(x)
    return a.reshape(P, nbr, tr, nbc, tc).max(axis=(2, 4))


TILE_FORMATS = {  # the table path's elements: e2m1 (nvfp4_2d), a signed int4 (NVINT4's), e2m1 without -0
    "nvfp4_2d": BLOCK_PRESETS["nvfp4_2d"],
    "int4_2d": BlockFormat(FixedFormat(4, 0), (16, 16), _E4M3, scale_rule="amax", tensor_scale=True),
    "e2m1fnuz_2d": BlockFormat(FloatFormat(2, 1, special="fnuz"), (16, 16), _E4M3, scale_rule="amax",
                               tensor_scale=True),
}
TILES = [(16, 16), (8, 4), (1, 16), (32, 32), (3, 5)]


@pytest.mark.parametrize("tile", TILES, ids=[f"{r}x{c}" for r, c in TILES])
@pytest.mark.parametrize("name", list(TILE_FORMATS))
def test_table_path_on_tiles_gives_the_general_loops_bits_and_scales(name, tile):
    """``quantize_blocks`` rounding float32 tiles to nearest (the table path, serial and parallel; and from the
    tiles' amaxes, ``scanned``) against ``block_serial``: tiles of every special kind (``tile_data``) on shapes with
    full and partial edge tiles and 1..3 planes, five tensor scales."""
    fmt = TILE_FORMATS[name]
    rng = np.random.default_rng(tile[0] * 100 + tile[1])
    for shape in [(1, 64, 64), (2, 40, 50), (3, 17, 9), (2, 33, 48)]:
        x = tile_data(rng, shape, tile)
        P, R, C = shape
        nb = (P, -(-R // tile[0]), -(-C // tile[1]))
        for t in [0.0123, 2.0**-140, 1.0, 3.0e35, 1 / 3]:
            args = block_args(fmt, float(np.float32(t)))
            assert block_cpu.fast_path_of(args) == "table"
            want, wsc = np.full_like(x, 7.0), np.full(nb, 7.0)
            block_cpu.block_serial(x, want, wsc, tile[0], tile[1], *args, NEAREST, np.uint64(0), 32)
            for parallel in (False, True):
                for scanned in (False, True):
                    got = np.full_like(x, 7.0)
                    sc = tile_amaxes(x, tile) if scanned else np.full(nb, 7.0)
                    assert block_cpu._fast_path(x, got, sc, tile, args, parallel, scanned)
                    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
                    assert bad.size == 0, (shape, t, parallel, scanned, x.flat[bad[:5]], got.flat[bad[:5]],
                                           want.flat[bad[:5]])
                    assert np.array_equal(sc.view(np.uint64), wsc.view(np.uint64)), (shape, t, parallel, scanned)


@pytest.mark.parametrize("name", ["nvfp4_2d", "int4_2d"])
def test_quantize_float32_tiles_nearest_equal_the_float64_loop(name):
    """emunum.quantize of float32 tiles (the table path, via ``quantize_blocks``) equals float64 input (the general
    loop), rounded to float32, on a (2, 3, 40, 50) tensor (batch dims, partial edge tiles) of tile magnitudes
    2**-40..2**40 with a NaN, an inf and a zero tile; the pow2 path stays 1-D (mxfp4 in 16x16 tiles: the loop)."""
    g = torch.Generator().manual_seed(9)
    e = torch.randint(-40, 41, (2, 3, 3, 4), generator=g).repeat_interleave(16, 2).repeat_interleave(16, 3)
    x = torch.randn(2, 3, 40, 50, generator=g) * 2.0 ** e[..., :40, :50]
    x[0, 1, 3, 7], x[1, 2, 20, 33], x[1, 0, :16, :16] = float("nan"), float("inf"), 0.0
    for fmt in (TILE_FORMATS[name], BLOCK_PRESETS["mxfp4_e2m1"].with_block_size((16, 16))):
        a = emunum.quantize(x, fmt)
        b = emunum.quantize(x.double(), fmt).float()
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), fmt
    assert not block_cpu._fast_path(x.numpy()[0], np.empty((3, 40, 50), np.float32), np.empty((3, 3, 4)), (16, 16),
                                    block_args(BLOCK_PRESETS["mxfp4_e2m1"], 1.0), False, False)


SR = int(RoundMode.STOCHASTIC)
SHARE_CASES = [  # enough blocks for several shares of the table path's chunks (256 blocks) and amax tasks (2048)
    ("mxfp8_e4m3", NEAREST, (1, 32), (2, 40, 2048)),  # pow2, blocks tiling the rows
    ("mxfp4_e2m1", NEAREST, (1, 32), (3, 7, 1000)),  # pow2, partial blocks
    ("nvfp4", NEAREST, (1, 16), (3, 50, 1024)),  # table: 38 chunks, 5 amax tasks
    ("nvfp4", NEAREST, (1, 16), (2, 33, 1000)),  # table, partial blocks
    ("nvfp4_2d", NEAREST, (16, 16), (2, 70, 1000)),  # table, tiles
    ("nvfp4", SR, (1, 16), (2, 33, 1000)),  # block_sr
    ("nvint4", SR, (16, 16), (1, 40, 600)),  # block_sr, tiles
    ("mxint8", NEAREST, (1, 32), (2, 9, 1000)),  # the float64 loops
]


@pytest.mark.parametrize("name,mode,tile,shape", SHARE_CASES)
def test_parallel_shares_give_the_serial_bits(name, mode, tile, shape, launch_shares):
    """``block_amaxes`` and ``quantize_blocks`` with the blocks cut into 2, 3 or 5 shares (``threads.launch``) give
    the serial loop's values, scales and finite amax, bit for bit."""
    rng = np.random.default_rng(len(name) + shape[2])
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-20, 20, shape[:2] + (1,)))).astype(np.float32)
    x.flat[rng.integers(0, x.size, 12)] = [np.inf, -np.inf, np.nan] * 4
    args = block_args(BLOCK_PRESETS[name], 1.0)
    sc_shape = (shape[0], -(-shape[1] // tile[0]), -(-shape[2] // tile[1]))
    out = {}
    for parallel in (False, True):
        for scanned in ((False, True) if tile[0] == 1 else (False,)):
            dst, sc = np.full_like(x, 7.0), np.full(sc_shape, 7.0)
            amax = block_cpu.block_amaxes(x, sc, tile[1], parallel=parallel) if scanned else None
            scanned_sc = sc.copy()
            block_cpu.quantize_blocks(x, dst, sc, tile, args, mode, 1234, 32, parallel=parallel, scanned=scanned)
            out[parallel, scanned] = (dst.view(np.uint32), sc.view(np.uint64), scanned_sc.view(np.uint64), amax)
    for (parallel, scanned), got in out.items():
        want = out[False, scanned]
        for g, w in zip(got, want):
            assert np.array_equal(g, w) if isinstance(g, np.ndarray) else g == w, (parallel, scanned)
