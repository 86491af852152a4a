"""The float32 fast paths of the block kernel (kernels/block_fast.py) give the bits of the general float64 loop
(``block_cpu.block_serial``: the bit-level rounding core, x / full scale in float64), scales included, zero
tolerance: element midpoints and their float32 neighbours at every scale, clipped scales, NaN/inf blocks,
partial blocks, serial and parallel loops, and through ``emunum.quantize`` (axes, dtypes, out=, views)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import emunum
from emunum.block_quantize import block_args
from emunum.formats import BLOCK_PRESETS, BlockFormat, FloatFormat, RoundMode
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
