"""4/6 selection with the error sums vectorised across blocks (kernels/nvfp4_fos_fast.py) gives the bits and
scales of the scalar core (kernels/nvfp4_scalar.py, ``quantize_nvfp4(fast=False)``), with zero tolerance, on
tensors wide enough for several units of LANES blocks per row of blocks (and a unit of fewer), partial last
blocks and 16-row tiles, several parallel tasks; over near-tie blocks (quarter-integers under a tensor amax of
5, where the candidates' float32 error sums tie or differ by an ulp, so that any other summation order or tie
rule picks differently somewhere), float32 subnormals and blocks whose scales are subnormal or 0, zeros and -0,
inf and NaN, and line arrays whose S * gds overflows (encode scale 0). Every other rounding mode (stochastic:
tests/kernels/test_nvfp4_fos_sr.py), and float64 data, leave the fast paths to the scalar cores: ``quantize`` gives
their bits in every mode."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from numba import njit

import emunum
from emunum.block_quantize import block_args
from emunum.formats import BLOCK_PRESETS, BlockFormat, FourOverSix, RoundMode
from emunum.kernels import nvfp4_cpu, nvfp4_fos_fast
from emunum.kernels.nvfp4_scalar import _scale_of
from emunum.nvfp4_quantize import line_arrays

NEAREST = int(RoundMode.NEAREST)
KEY = 977

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
                four_over_six=FourOverSix("mse", 448)),
]
# (P, R, C): two units per row of blocks (LANES = 64 blocks), the second short; a partial last block and
# partial tiles; many short rows (several parallel tasks of whole rows, one block each)
SHAPES = [(1, 48, 16 * (nvfp4_fos_fast.LANES + 9)), (2, 37, 16 * (nvfp4_fos_fast.LANES + 3) + 5), (1, 2100, 16)]


def near_ties(rng, shape):
    x = rng.integers(-12, 13, shape) * 0.25
    x.reshape(-1)[0] = 5.0
    return x.astype(np.float32)


def subnormals(rng, shape):
    """Near ties scaled into float32's subnormals by row (tiny blocks under a large amax: e4m3-subnormal and
    zero scales), with whole rows of float32 subnormals."""
    x = near_ties(rng, shape) * np.float32(2.0) ** rng.integers(-140, 1, shape[:2] + (1,))
    x[0, 1] = np.float32(1e-45) * rng.integers(-3, 4, shape[2])
    x[0, 2] = np.float32(2.0 ** -126) * rng.uniform(-1, 1, shape[2]).astype(np.float32)
    return x.astype(np.float32)


def tiny_amax(rng, shape):
    """Near ties under a tensor amax of 1e-35 (rows scaled down by up to 2**-7, the first kept): the outer decode
    scale is a float32 subnormal, dequantised values and results fall in float32's subnormals (not w_m * 2**k
    there: the block loop for those units, the element loop for those blocks' stores)."""
    x = near_ties(rng, shape) * np.float32(2e-36) * np.float32(2.0) ** -rng.integers(0, 8, shape[:2] + (1,))
    x.reshape(-1)[0] = np.float32(1e-35)
    return x.astype(np.float32)


def specials(rng, shape):
    x = (rng.standard_normal(shape) * 2.0 ** rng.integers(-30, 31, shape[:2] + (1,))).astype(np.float32)
    x[0, 3] = 0.0
    x[0, 4, : shape[2] // 2] = -0.0
    x[0, 5, 7] = np.nan
    x[0, 6, 3] = np.inf
    x[0, 7, 17 % shape[2]] = -np.inf
    x[0, 8] = np.float32(3e38) * rng.uniform(-1, 1, shape[2]).astype(np.float32)
    x[-1, -1, -1] = np.nan  # in the partial last block or tile where there is one
    return x


def run(x, fmt, fast, parallel, lines=None, mode=NEAREST, negzero=None):
    tile = fmt.tile if fmt.tile[0] else (1, fmt.tile[1])
    P, R, C = x.shape
    scales = np.full((P, -(-R // tile[0]), -(-C // tile[1])), 7.0)
    dst = np.full_like(x, 7.0)
    if lines is None:
        lines = tuple(v.numpy() if isinstance(v, torch.Tensor) else v for v in line_arrays(torch.from_numpy(x), fmt))
    args = block_args(fmt, 1.0)[:-1]
    if negzero is not None:  # the element's -0 flag (block_args' seventh)
        args = args[:6] + (negzero,) + args[7:]
    nvfp4_cpu.quantize_nvfp4(x, dst, scales, tile, lines, args, mode, KEY, 32, parallel=parallel, fast=fast)
    return scales, dst


def assert_same(x, fmt, parallel, lines=None):
    tile = fmt.tile if fmt.tile[0] else (1, fmt.tile[1])
    assert nvfp4_cpu.fast_ok(x, x, tile, True, block_args(fmt, 1.0)[:-1], NEAREST) and tile[1] == 16
    want_s, want = run(x, fmt, False, False, lines)
    got_s, got = run(x, fmt, True, parallel, lines)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(got_s.view(np.uint64), want_s.view(np.uint64))


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("make", [near_ties, subnormals, tiny_amax, specials], ids=lambda f: f.__name__)
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_lanes_path_equals_scalar_core_bits_and_scales(fmt, make, shape, parallel):
    assert_same(make(np.random.default_rng(len(fmt.name) + shape[2]), shape), fmt, parallel)


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("fmt", FORMATS[:3], ids=lambda f: f.name)
def test_lanes_path_without_negative_zero_clears_sign_of_zero_results_as_scalar_core(fmt, parallel):
    # 4/6 needs fp4_e2m1 (which has -0), but the kernels take the element's -0 flag: with it off, the stores give
    # +0 where q is 0 and keep x's sign elsewhere, as the scalar core does
    x = specials(np.random.default_rng(5), SHAPES[0])
    assert np.signbit(x[x == 0]).any() and (x < 0).any()
    want_s, want = run(x, fmt, False, False, negzero=0)
    got_s, got = run(x, fmt, True, parallel, negzero=0)
    assert ((want == 0) & ~np.signbit(want) & np.signbit(x)).any()  # negative x whose result is +0
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(got_s.view(np.uint64), want_s.view(np.uint64))


@pytest.mark.parametrize("tile_rows", [1, 16])
def test_encode_scale_zero_and_per_row_decode_scales_equal_scalar_core(tile_rows):
    # line arrays no preset makes: gds huge, so S * gds overflows float32 in a block holding inf (encode scale
    # 0, |x| * 0 = NaN there: the block loop), and gds varying by row inside 16-row tiles (the stores' encode
    # scales and products made per row)
    fmt = FORMATS[0] if tile_rows == 1 else FORMATS[2]
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((1, 48, 16 * 66)) * 100).astype(np.float32)
    x[0, 3, 40] = np.inf
    x[0, 20, 1000] = -np.inf
    n = x.shape[1]
    gds = np.where(np.arange(n) % 3 == 0, np.float32(1e38), np.float32(2.0) ** rng.integers(-8, 9, n)).astype(
        np.float32)
    # and rows whose decode scale is a float32 subnormal: results q * S * gds in the subnormals (the stores'
    # element loop, ``out_values``)
    gds = np.where(np.arange(n) % 3 == 2, rng.uniform(1e-41, 1e-38, n), gds).astype(np.float32)
    ges = np.minimum(1.0 / gds.astype(np.float64), np.finfo(np.float32).max).astype(np.float32)
    gamax = np.full(n, np.float32(100.0))
    lines = (True, np.ones(n), ges, gds, gamax, np.float32(1536.0), 0)
    for parallel in (False, True):
        assert_same(x, fmt, parallel, lines)


MODES = [m for m in RoundMode]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name.lower())
@pytest.mark.parametrize("name", ["nvfp4_4over6", "nvfp4_4over6_2d", "nvfp4_row"])
def test_quantize_equals_the_scalar_core_in_every_mode(name, mode, monkeypatch):
    # the fast paths hold for float32 rounded to nearest (and stochastically: kernels/nvfp4_fos_sr.py, off here
    # as well); in every other mode (and for float64 data) the scalar core runs, with the same stochastic bits
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-12, 13, (40, 16 * 67 + 5), generator=g).float() * 0.25
    x[0, 0] = 5.0
    x[1, 3:40] = x[1, 3:40] * 2.0 ** -133
    x[2, 7], x[3, 9], x[4, 11] = float("nan"), float("inf"), -0.0
    for data in (x, x.double()):
        got = emunum.quantize(data, name, mode, seed=11)
        with monkeypatch.context() as mp:
            mp.setattr(nvfp4_cpu, "fast_ok", lambda *a, **k: False)
            mp.setattr(nvfp4_cpu, "fos_sr_ok", lambda *a, **k: False)
            want = emunum.quantize(data, name, mode, seed=11)
        itype = torch.int64 if data.dtype == torch.float64 else torch.int32
        assert torch.equal(got.view(itype), want.view(itype))


# ---- e2m1 rounding by float32 arithmetic and the dequantised values as w_m * 2**k -----------------------------

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)


@njit
def _rounded(v):
    out = np.empty_like(v)
    for i in range(v.size):
        out[i] = nvfp4_fos_fast.e2m1_round(v[i])
    return out


@njit
def _dequantised(q, w1, w15):
    out = np.empty_like(q)
    for i in range(q.size):
        out[i] = nvfp4_fos_fast._dequant(q[i], w1, w15)
    return out


def sweep_values():
    """Every float32 within 300 ulps of each e2m1 value and midpoint, every 97th float32 up to 16, large ones,
    FLT_MAX and inf."""
    points = np.concatenate([E2M1, (E2M1[1:] + E2M1[:-1]) / 2]).astype(np.float32).view(np.int32)
    near = (points[:, None] + np.arange(-300, 301)[None, :]).reshape(-1)
    near = near[near >= 0].astype(np.uint32)
    dense = np.arange(0, np.float32(16.0).view(np.uint32), 97, dtype=np.uint32)
    big = np.float32([17.0, 1e10, 3e38, np.finfo(np.float32).max, np.inf]).view(np.uint32)
    return np.concatenate([near, dense, big]).view(np.float32)


def test_e2m1_round_is_ml_dtypes_saturating_e2m1_cast():
    # ml_dtypes rounds to nearest-even and saturates at 6 (inf included), as the scalar core rounds e2m1
    v = sweep_values()
    assert np.array_equal(_rounded(v).view(np.uint32), v.astype(ml_dtypes.float4_e2m1fn).astype(np.float32).view(
        np.uint32))


def _chain(q, S, a0, denom):
    """The scalar core's dequantised value float32(float32(float32(q * S) * gamax) / denom)."""
    with np.errstate(over="ignore", under="ignore"):
        return np.float32(np.float32(np.float32(q * np.float32(S)) * np.float32(a0)) / np.float32(denom))


E4M3 = np.unique(np.arange(0, 127, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32))
GAMAX = np.float32([0.0, 1e-45, 1e-40, 2.0**-126, 1e-35, 1e-30, 3e-5, 1.0, 5.0, 448.0, 1e20, 1e30, 1e34, 3e38])


@pytest.mark.parametrize("denom", [1536.0, 2688.0])
def test_lane_values_hold_every_dequantised_value_where_they_say_so(denom):
    # w_m * 2**k (``_dequant``) is the chain's value of each e2m1 value wherever ``lane_values`` says ok; ok
    # everywhere in the ordinary range (e4m3 scales under an amax from 3e-5 to 1e20), so that the fast path runs
    oks = 0
    for S in E4M3:
        for a0 in GAMAX:
            w1, w15, ok = nvfp4_fos_fast.lane_values(S, a0, np.float32(denom))
            if not ok:
                assert not 3e-5 <= a0 <= 1e20 or S < 2.0**-9
                continue
            oks += 1
            want = np.float32([_chain(q, S, a0, denom) for q in E2M1])
            assert np.array_equal(_dequantised(E2M1, w1, w15).view(np.uint32), want.view(np.uint32)), (S, a0)
    assert oks >= E4M3.size * 5


def test_out_values_hold_every_product_where_they_say_so():
    # float32(q * full) (the stores' value) is o_m * 2**k wherever ``out_values`` says ok, across float32's range
    rng = np.random.default_rng(2)
    fulls = np.concatenate([[0.0, 2.0**-149, 2.0**-127, 2.0**-125, 3.4e38, 1e38, 5e37, 6e37],
                            2.0 ** rng.uniform(-160, 130, 3000) * rng.integers(1, 16, 3000)])
    oks = 0
    for full in fulls:
        o1, o15, ok = nvfp4_fos_fast.out_values(full)
        if not ok:
            assert not 2.0**-125 <= full <= 5e37
            continue
        oks += 1
        with np.errstate(over="ignore"):
            want = np.float32(E2M1.astype(np.float64) * full)
        assert np.array_equal(_dequantised(E2M1, o1, o15).view(np.uint32), want.view(np.uint32)), full
    assert oks >= 2000


@njit
def _encodes(s, g, f):
    out = np.empty_like(s)
    for i in range(s.size):
        out[i] = f(s[i], g[i])
    return out


def test_encode_scale32_is_the_scalar_cores_encode_scale():
    # one float32 division against the scalar core's float64 one, over products s * g from 0 and float32's
    # subnormals (quotients past FLT_MAX) to FLT_MAX, and random ones
    from emunum.kernels.nvfp4_scalar import _encode_scale
    rng = np.random.default_rng(4)
    g = np.concatenate([np.float32([1.0] * 12), (2.0 ** rng.uniform(-140, 120, 20000)).astype(np.float32)])
    s = np.concatenate([np.float32([0.0, 1e-45, 2e-45, 1e-40, 2.0**-126, 2.0**-128, 2.9e-39, 2.93873e-39, 1.0,
                                    448.0, 3e38, np.finfo(np.float32).max]),
                        rng.uniform(0, 448, 20000).astype(np.float32)])
    got = _encodes(s, g, nvfp4_fos_fast.encode_scale32)
    assert np.array_equal(got.view(np.uint32), _encodes(s, g, _encode_scale).view(np.uint32))


@njit
def _scales32(v, f_split, f_magic, f_min_normal, f_max):
    out = np.empty_like(v)
    for i in range(v.size):
        out[i] = nvfp4_fos_fast._scale32(v[i], f_split, f_magic, f_min_normal, f_max)
    return out


@njit
def _scales_core(v, s_man, s_emin, s_sub, s_max):
    out = np.empty_like(v)
    for i in range(v.size):
        out[i] = _scale_of(v[i], s_man, s_emin, s_sub, s_max)
    return out


@pytest.mark.parametrize("scale", ["e4m3fn", "ue5m3", "e5m2", "fp6_e3m2", "fp16"])
def test_scale32_is_the_scalar_cores_scale_rounding(scale):
    # the lanes path's float32 scale rounding against the scalar core's float64 one (its constants as
    # fos_lanes_range makes them), over every format value, midpoint and their float32 neighbours, dense float32
    # patterns from 0 (float32 subnormals, the format's subnormals) to far past the format's largest value, and inf
    fmt = BlockFormat("fp4_e2m1", 16, scale, scale_rule="amax", tensor_scale=True, four_over_six=FourOverSix("mae"))
    s_man, s_emin, s_sub, s_max = block_args(fmt, 1.0)[10:14]
    assert nvfp4_fos_fast.scale32_ok(s_man, s_emin, s_sub, s_max)
    split, magic, min_normal = nvfp4_fos_fast._split_constants(s_man, s_emin, s_sub)
    consts = (np.float32((split - 1.0) * 2.0**-29 + 1.0), np.float32(magic * 2.0**-29), np.float32(min_normal),
              np.float32(s_max))
    top = int(np.float32(4 * s_max).view(np.uint32))
    dense = np.arange(0, top, max(61, top // 2_000_000 | 1), dtype=np.uint32).view(np.float32)
    values = np.unique(_scales_core(dense, s_man, s_emin, s_sub, s_max))
    points = np.concatenate([values, (values[1:] + values[:-1]) / 2]).astype(np.float32).view(np.int32)
    near = (points[:, None] + np.arange(-3, 4)[None, :]).reshape(-1)
    v = np.concatenate([dense, near[near >= 0].astype(np.uint32).view(np.float32), np.float32([np.inf, 3e38])])
    got = _scales32(v, *consts)
    assert np.array_equal(got.view(np.uint32), _scales_core(v, s_man, s_emin, s_sub, s_max).view(np.uint32))


def test_scale32_ok_refuses_scale_formats_past_its_float32_range():
    # a scale format outside _scale32's range leaves 4/6 to the block path (nvfp4_fast.fos_*), the same bits
    assert not nvfp4_fos_fast.scale32_ok(3, -6, 1, 2.0**120)
    assert not nvfp4_fos_fast.scale32_ok(23, -6, 1, 448.0)
    assert not nvfp4_fos_fast.scale32_ok(3, -126, 1, 448.0)
