"""4/6 selection rounded stochastically on the float32 fast paths (blocks of 16 columns: the lanes kernel of
kernels/nvfp4_fos_fast.py; other scale formats and the fallbacks: kernels/nvfp4_fos_sr.py) gives the bits and
scales of the scalar core (kernels/nvfp4_scalar.py's ``fos_block``, ``quantize_nvfp4(fast=False)``), with zero
tolerance, with the same random words (key, flat index): MAE, MSE and absmax, bounds 448 and 256, 1-D blocks and
16 x 16 tiles (partial in rows and columns), tensor, per-row (1-D) and no outer scales, several parallel chunks; over
near-tie blocks (quarter-integers under a tensor amax of 5, where the candidates' error sums tie), float32
subnormals and scales near or below e4m3's subnormals, zeros and -0, inf, NaN and values near FLT_MAX; nbits 32,
8 and 1 and several keys. ``sr_e2m1`` is the scalar core's stochastic e2m1 rounding for every float32 near the
grid and each side of every word's decision. ``quantize`` takes the path for the presets, with the scalar core's
bits."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from numba import njit

import emunum
from emunum.block_quantize import block_args
from emunum.formats import BLOCK_PRESETS, BlockFormat, FourOverSix, RoundMode
from emunum.kernels import nvfp4_cpu, nvfp4_fos_fast, nvfp4_fos_sr
from emunum.kernels.scalar.block import round_float_value_sat
from emunum.nvfp4_quantize import line_arrays

import tiers
from test_nvfp4_fos_fast import near_ties, specials, subnormals, tiny_amax  # noqa: E402 (tests/kernels
# is on sys.path)

SR = int(RoundMode.STOCHASTIC)
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered")

FORMATS = [
    BLOCK_PRESETS["nvfp4_4over6"],
    BLOCK_PRESETS["nvfp4_4over6_mse"],
    BLOCK_PRESETS["nvfp4_4over6_2d"],
    BlockFormat("fp4_e2m1", 16, "e4m3fn", scale_rule="amax", tensor_scale=True,
                four_over_six=FourOverSix("absmax", 448)),
    BlockFormat("fp4_e2m1", 16, "e4m3fn", scale_rule="amax", outer_scale="row",
                four_over_six=FourOverSix("mse", 448)),
    BlockFormat("fp4_e2m1", 16, "ue5m3", scale_rule="amax", four_over_six=FourOverSix("mae", 256)),
    BlockFormat("fp4_e2m1", (16, 16), "e4m3fn", scale_rule="amax", tensor_scale=True,
                four_over_six=FourOverSix("absmax", 256)),
    BlockFormat("fp4_e2m1", (16, 16), "e4m3fn", scale_rule="amax", four_over_six=FourOverSix("mse", 448)),
]
# (P, R, C): partial last blocks and tiles (R % 16, C % 16 != 0) over more than one parallel chunk of CHUNK
# blocks; whole tiles; many short rows
SHAPES = [(3, 37, 16 * 40 + 5), (1, 48, 16 * 24), (1, 700, 16)]
WORDS = [(32, 977), (8, 12345), (1, 3)]  # (nbits, key)


def huge(rng, shape):
    """Values near FLT_MAX in some rows (|x| * enc near overflow, inf for inf), ordinary ones elsewhere."""
    x = (rng.standard_normal(shape) * 100).astype(np.float32)
    x[:, ::3] = np.float32(3.4e38) * rng.uniform(-1, 1, (shape[0], len(range(0, shape[1], 3)), shape[2]))
    x[0, 1, 2] = np.float32(np.finfo(np.float32).max)
    x[0, 4, 1] = -np.inf
    return x.astype(np.float32)


MAKERS = [near_ties, subnormals, tiny_amax, specials, huge]


def tile_of(fmt):
    return fmt.tile if fmt.tile[0] else (1, fmt.tile[1])


def run(x, fmt, fast, parallel, nbits, key, lines=None, negzero=None):
    tile = tile_of(fmt)
    P, R, C = x.shape
    scales = np.full((P, -(-R // tile[0]), -(-C // tile[1])), 7.0)
    dst = np.full_like(x, 7.0)
    if lines is None:
        lines = tuple(v.numpy() if isinstance(v, torch.Tensor) else v for v in line_arrays(torch.from_numpy(x), fmt))
    args = block_args(fmt, 1.0)[:-1]
    if negzero is not None:  # the element's -0 flag (block_args' seventh)
        args = args[:6] + (negzero,) + args[7:]
    if fast:
        assert nvfp4_cpu.fos_sr_ok(x, dst, tile, args, SR, float(lines[3].max()))
    nvfp4_cpu.quantize_nvfp4(x, dst, scales, tile, lines, args, SR, key, nbits, parallel=parallel, fast=fast)
    return scales, dst


def assert_same(x, fmt, parallel, nbits, key, lines=None, negzero=None):
    want_s, want = run(x, fmt, False, False, nbits, key, lines, negzero)
    got_s, got = run(x, fmt, True, parallel, nbits, key, lines, negzero)
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, (bad[:5], x.flat[bad[:5]], got.flat[bad[:5]], want.flat[bad[:5]])
    assert np.array_equal(got_s.view(np.uint64), want_s.view(np.uint64))


# every format with every kind of data by default (shapes, words and thread modes in turn); the rest of the
# product: the exhaustive tier
@pytest.mark.parametrize("fmt,make,shape,words,parallel", tiers.grid(
    [FORMATS, MAKERS, SHAPES, WORDS, [False, True]], lead=2,
    ids=[lambda f: f.name, lambda f: f.__name__, lambda s: "x".join(map(str, s)), None, None]))
def test_sr_path_equals_scalar_core_bits_and_scales(fmt, make, shape, words, parallel):
    nbits, key = words
    assert_same(make(np.random.default_rng(len(fmt.name) + shape[2] + nbits), shape), fmt, parallel, nbits, key)


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_block_by_block_sr_kernel_equals_scalar_core(fmt, parallel, monkeypatch):
    """Blocks of 16 columns take the lanes kernel where the scale format passes ``scale32_ok`` (every format
    here); the block-by-block kernel (``nvfp4_fos_sr.fos_sr_range``) that the other scale formats take, forced."""
    monkeypatch.setattr(nvfp4_fos_fast, "scale32_ok", lambda *a: False)
    calls = []
    real = nvfp4_fos_sr.fos_sr_range
    monkeypatch.setattr(nvfp4_fos_sr, "fos_sr_range", lambda *a: calls.append(1) or real(*a))
    for make in MAKERS:
        assert_same(make(np.random.default_rng(3), SHAPES[0]), fmt, parallel, 8, 99)
    assert calls  # the block loop ran


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("fmt", FORMATS[:3], ids=lambda f: f.name)
def test_sr_path_without_negative_zero_clears_sign_of_zero_results_as_scalar_core(fmt, parallel):
    x = specials(np.random.default_rng(5), SHAPES[0])
    want_s, want = run(x, fmt, False, False, 32, 7, negzero=0)
    assert ((want == 0) & ~np.signbit(want) & np.signbit(x)).any()  # negative x whose result is +0
    assert_same(x, fmt, parallel, 32, 7, negzero=0)


@pytest.mark.parametrize("tile_rows", [1, 16])
def test_per_row_decode_scales_in_tiles_equal_scalar_core(tile_rows):
    # line arrays no preset makes: gds varying by row inside 16-row tiles (the kept candidate rounded again with
    # the row's own encode scale and the same words), some float32-subnormal (results in the subnormals)
    fmt = FORMATS[0] if tile_rows == 1 else FORMATS[2]
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((1, 48, 16 * 20 + 3)) * 100).astype(np.float32)
    x[0, 3, 40] = np.inf
    n = x.shape[1]
    gds = np.float32(2.0) ** rng.integers(-8, 9, n).astype(np.float32)
    gds = np.where(np.arange(n) % 3 == 2, rng.uniform(1e-41, 1e-38, n), gds).astype(np.float32)
    ges = np.minimum(1.0 / gds.astype(np.float64), np.finfo(np.float32).max).astype(np.float32)
    lines = (True, np.ones(n), ges, gds, np.full(n, np.float32(100.0)), np.float32(1536.0), 0)
    for parallel in (False, True):
        for nbits, key in WORDS:
            assert_same(x, fmt, parallel, nbits, key, lines)


def test_encode_scale_zero_leaves_the_sr_path():
    # S * gds past FLT_MAX (encode scale 0, |x| * 0 = NaN for inf): not the fast path's; quantize_nvfp4 runs the
    # scalar core there
    x = (np.random.default_rng(1).standard_normal((1, 16, 64)) * 100).astype(np.float32)
    x[0, 3, 5] = np.inf
    n = x.shape[1]
    gds = np.full(n, np.float32(1e38))
    lines = (True, np.ones(n), np.full(n, np.float32(1e-38)), gds, np.full(n, np.float32(100.0)), np.float32(1536.0),
             0)
    args = block_args(FORMATS[0], 1.0)[:-1]
    assert not nvfp4_cpu.fos_sr_ok(x, x, (1, 16), args, SR, 1e38)
    want_s, want = run(x, FORMATS[0], False, False, 32, 1, lines)
    scales, dst = np.empty((1, 16, 4)), np.empty_like(x)
    nvfp4_cpu.quantize_nvfp4(x, dst, scales, (1, 16), lines, args, SR, 1, 32)
    assert np.array_equal(dst.view(np.uint32), want.view(np.uint32))


def test_sr_ok_conditions():
    x = np.zeros((1, 16, 16), np.float32)
    args = block_args(FORMATS[0], 1.0)[:-1]
    assert nvfp4_cpu.fos_sr_ok(x, x, (1, 16), args, SR, 1.0)
    assert nvfp4_cpu.fos_sr_ok(x, x, (16, 16), args, SR, 1.0)
    assert not nvfp4_cpu.fos_sr_ok(x, x, (1, 16), args, int(RoundMode.NEAREST), 1.0)
    assert not nvfp4_cpu.fos_sr_ok(x.astype(np.float64), x.astype(np.float64), (1, 16), args, SR, 1.0)
    assert not nvfp4_cpu.fos_sr_ok(x, x, (2, 16), args, SR, 1.0)
    e3m2 = block_args(BlockFormat("fp6_e3m2", 16, "e4m3fn", scale_rule="amax", tensor_scale=True), 1.0)[:-1]
    assert not nvfp4_cpu.fos_sr_ok(x, x, (1, 16), e3m2, SR, 1.0)


@pytest.mark.parametrize("name", ["nvfp4_4over6", "nvfp4_4over6_mse", "nvfp4_4over6_2d"])
def test_quantize_takes_the_sr_path_with_the_scalar_core_bits(name, monkeypatch):
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-12, 13, (40, 16 * 67 + 5), generator=g).float() * 0.25
    x[0, 0] = 5.0
    x[1, 3:40] = x[1, 3:40] * 2.0 ** -133
    x[2, 7], x[3, 9], x[4, 11] = float("nan"), float("inf"), -0.0
    x[5:9] = torch.randn(4, x.shape[1], generator=g) * 1e30
    calls = []
    real = nvfp4_cpu._run_fos_sr
    monkeypatch.setattr(nvfp4_cpu, "_run_fos_sr", lambda *a, **k: calls.append(1) or real(*a, **k))
    for seed in (11, 12):
        got = emunum.quantize(x, name, "stochastic", seed=seed)
        assert calls
        with monkeypatch.context() as mp:
            mp.setattr(nvfp4_cpu, "fos_sr_ok", lambda *a, **k: False)
            want = emunum.quantize(x, name, "stochastic", seed=seed)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert not torch.equal(got, emunum.quantize(x, name, "stochastic", seed=11))  # the words follow the seed


# ---- stochastic e2m1 by integer steps -------------------------------------------------------------------------

@njit
def _sr(w, rnd, nbits):
    out = np.empty_like(w)
    mask = np.uint32((1 << nbits) - 1)
    for i in range(w.size):
        out[i] = nvfp4_fos_sr.sr_e2m1(w[i], np.uint32(rnd[i]), nbits, mask)
    return out


@njit
def _reference(w, rnd, nbits):
    out = np.empty_like(w)
    for i in range(w.size):
        out[i] = np.float32(round_float_value_sat(np.float64(w[i]), 1, 0, 1, 6.0, 1, SR, np.uint64(rnd[i]), nbits))
    return out


def words_around_decisions(w, nbits, rng):
    """(values, words, d): each value with the words either side of its rounding decision (word 2**nbits - d
    rounds up, 2**nbits - d - 1 down; d = RNE(r * 2**nbits), r the fraction of w over its quantum, by float64
    steps), then 0, 2**nbits - 1 and a random word; the words clipped to 0..2**nbits - 1."""
    w64 = w.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        h = np.where(w64 >= 1.0, 2.0 ** (np.floor(np.log2(np.clip(w64, 1.0, 2.0**127))) - 1), 0.5)
        y = np.where(np.isfinite(w64), w64 / h, 0.0)
    d = np.rint((y - np.floor(y)) * 2.0**nbits)  # exact; rint rounds half to even
    top = 2**nbits - 1
    cands = [2.0**nbits - d, 2.0**nbits - d - 1, np.zeros_like(d), np.full_like(d, top),
             rng.integers(0, top + 1, d.size, dtype=np.uint64).astype(np.float64)]
    words = np.concatenate([np.clip(c, 0, top) for c in cands]).astype(np.uint64)
    return np.tile(w, len(cands)), words, d


def sr_values(rng):
    """Every float32 within 300 ulps of each e2m1 value and midpoint (quantum boundaries, saturation at 6), random
    float32s below 8 and over every exponent, float32 subnormals and tiny normals, large ones and inf."""
    grid = np.float32([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0])
    near = (grid.view(np.int32)[:, None] + np.arange(-300, 301)[None, :]).reshape(-1)
    below8 = rng.integers(0, np.float32(8.0).view(np.int32), 20000)
    anyexp = rng.integers(0, 0x7F800000, 5000)
    sub = np.concatenate([np.arange(0, 300), rng.integers(0, 1 << 23, 300), [0x7FFFFF, 0x800000, 0x800001]])
    big = np.float32([17.0, 1e10, 3e38, np.finfo(np.float32).max, np.inf]).view(np.int32)
    bits = np.concatenate([near[near >= 0], below8, anyexp, sub, big]).astype(np.uint32)
    return bits.view(np.float32)


@pytest.mark.parametrize("nbits", [1, 2, 8, 21, 22, 23, 24, 25, 31, 32])
def test_sr_e2m1_equals_scalar_rounding_each_side_of_every_decision(nbits):
    rng = np.random.default_rng(nbits)
    w, words, d = words_around_decisions(sr_values(rng), nbits, rng)
    got = _sr(w, words, nbits)
    want = _reference(w, words, nbits)
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, (w[bad[:5]], words[bad[:5]], got[bad[:5]], want[bad[:5]])
    # the points tested are the decisions: where both words exist and w < 6, the first rounds up, the second down
    n = d.size
    both = (d >= 1) & (d < 2**nbits) & (w[:n] < 6)
    assert both.sum() > 100 and (got[:n][both] > got[n:2 * n][both]).all()
