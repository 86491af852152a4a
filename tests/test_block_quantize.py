"""emunum.quantize on block-scaled formats, bit for bit against gfloat's block implementation
(``gfloat.quantize_block`` with ``compute_scale_amax`` and the MX ``BlockFormatInfo``s), zero tolerance.

NVFP4 against gfloat's ``quantize_block`` too, with the scale built from gfloat's e4m3 rounding (NVFP4 is not in
gfloat); MSFP12/16 against exact integer arithmetic; every preset against the numpy reference (encode/decode).
"""
from __future__ import annotations

import functools
import math

import gfloat
import gfloat.formats as gff
import numpy as np
import pytest
import torch

import emunum
from emunum.block_quantize import quantize_block_checked
from emunum.formats import BLOCK_PRESETS, BlockFormat, FloatFormat, RoundMode
from emunum.rng import seed_key

MX = {
    "mxfp8_e4m3": gff.format_info_mxfp8_e4m3, "mxfp8_e5m2": gff.format_info_mxfp8_e5m2,
    "mxfp6_e3m2": gff.format_info_mxfp6_e3m2, "mxfp6_e2m3": gff.format_info_mxfp6_e2m3,
    "mxfp4_e2m1": gff.format_info_mxfp4_e2m1, "mxint8": gff.format_info_mxint8,
}
GF_MODES = {"nearest": gfloat.RoundMode.TiesToEven, "nearest_away": gfloat.RoundMode.TiesToAway,
            "toward_zero": gfloat.RoundMode.TowardZero, "up": gfloat.RoundMode.TowardPositive,
            "down": gfloat.RoundMode.TowardNegative}


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal as float64 values, NaN where NaN, and zeros of the same sign."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or not np.array_equal(np.isnan(a), np.isnan(b)):
        return False
    m = ~np.isnan(a)
    return np.array_equal(a[m], b[m]) and np.array_equal(np.signbit(a[m]), np.signbit(b[m]))


def gfloat_block(fi, vals: np.ndarray, mode: str, compute_scale=gfloat.compute_scale_amax) -> np.ndarray:
    if np.isnan(vals).any() and fi.etype.num_nans == 0:
        # gfloat's scale is NaN here too, but it raises encoding the NaN element into a format without NaN;
        # the NaN scale decodes the whole block to NaN (OCP MX v1.0 section 6.3), as it does with a NaN code
        return np.full(len(vals), np.nan)
    with np.errstate(all="ignore"):
        return gfloat.quantize_block(fi, np.asarray(vals, np.float64), compute_scale, GF_MODES[mode])


def oracle_1d(fi, x: np.ndarray, axis: int, size: int, mode: str, **kw) -> np.ndarray:
    """gfloat on every run of ``size`` consecutive elements along ``axis`` (a partial last run: its own block)."""
    w = np.moveaxis(np.asarray(x, np.float64), axis, -1).copy()
    flat = w.reshape(-1, w.shape[-1])
    for row in flat:
        for s in range(0, row.size, size):
            row[s:s + size] = gfloat_block(fi, row[s:s + size], mode, **kw)
    return np.moveaxis(flat.reshape(w.shape), -1, axis)


def oracle_tiles(fi, x: np.ndarray, tile, mode: str) -> np.ndarray:
    w = np.asarray(x, np.float64).copy()
    m = w.reshape(-1, *w.shape[-2:])
    for mat in m:
        for i in range(0, mat.shape[0], tile[0]):
            for j in range(0, mat.shape[1], tile[1]):
                t = mat[i:i + tile[0], j:j + tile[1]]
                t[...] = gfloat_block(fi, t.ravel(), mode).reshape(t.shape)
    return m.reshape(w.shape)


def cases(name: str, rng) -> dict[str, np.ndarray]:
    """Named (4, 64) float64 inputs (float32 values), each row two blocks of 32."""
    fmt = BLOCK_PRESETS[name]
    el = np.unique(np.abs(fmt.element.values()))
    out = {
        "random": rng.standard_normal((4, 64)) * 10.0 ** rng.uniform(-3, 3, (4, 1)),
        "wide_range": rng.choice([-1, 1], (4, 64)) * 2.0 ** rng.uniform(-40, 40, (4, 64)),
        "all_zero": np.zeros((4, 64)),
        "tiny_scale_clips": rng.standard_normal((4, 64)) * 1e-39,  # floor(log2 amax) - emax < -127
        "huge": rng.standard_normal((4, 64)) * 1e37,
    }
    # ties: midpoints between neighbouring element values, the block's amax fixing the scale at 2**k
    mids = (el[:-1] + el[1:]) / 2
    t = np.resize(mids, (4, 64)) * rng.choice([-1, 1], (4, 64))
    t[:, 0], t[:, 32] = fmt.element.max, fmt.element.max
    out["ties"] = t * 2.0 ** rng.integers(-20, 20, (4, 1))
    nan_inf = rng.standard_normal((4, 64))
    nan_inf[0, 3], nan_inf[1, 40], nan_inf[2, 5], nan_inf[3, 63] = np.nan, np.inf, -np.inf, np.nan
    out["nan_inf"] = nan_inf
    return {k: v.astype(np.float32).astype(np.float64) for k, v in out.items()}


CASES = ["random", "wide_range", "all_zero", "tiny_scale_clips", "huge", "ties", "nan_inf"]


@pytest.mark.parametrize("mode", list(GF_MODES))
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", list(MX))
def test_mx_matches_gfloat_quantize_block(name, case, mode):
    x = cases(name, np.random.default_rng(abs(hash((name, case))) % 2**32))[case]
    want = oracle_1d(MX[name], x, -1, 32, mode)
    got = emunum.quantize(torch.from_numpy(x), name, mode).numpy()
    assert same_bits(got, want), (name, case, mode)
    # float32 holds every result except max * 2**127 (an infinity in the block), which overflows to inf
    got32 = emunum.quantize(torch.from_numpy(x).float(), name, mode).numpy()
    with np.errstate(over="ignore"):
        assert same_bits(got32, want.astype(np.float32)), (name, case, mode)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("name", list(MX))
def test_mx_blocks_run_along_any_axis_with_partial_last_block(name, axis, dtype):
    x = np.random.default_rng(axis + 7).standard_normal((37, 5, 40)) * 3.0
    x = torch.from_numpy(x).to(dtype)
    got = emunum.quantize(x, name, axis=axis)
    assert got.dtype == dtype and got.shape == x.shape
    want = oracle_1d(MX[name], x.double().numpy(), axis, 32, "nearest")
    assert same_bits(got.numpy(), want.astype(got.numpy().dtype))


@pytest.mark.parametrize("tile", [(16, 16), (4, 8), (3, 5)])
@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp4_e2m1", "mxint8"])
def test_2d_tiles_match_gfloat_on_each_tile(name, tile):
    fmt = BLOCK_PRESETS[name].with_block_size(tile)
    x = torch.randn(2, 20, 35, generator=torch.Generator().manual_seed(3)) * 5
    got = emunum.quantize(x, fmt, "nearest").double().numpy()
    assert same_bits(got, oracle_tiles(MX[name], x.double().numpy(), tile, "nearest"))


def test_2d_tiles_quantise_w_and_its_transpose_alike():
    fmt = BLOCK_PRESETS["mxfp8_e4m3"].with_block_size((16, 16))
    w = torch.randn(48, 32)
    assert torch.equal(emunum.quantize(w, fmt).t(), emunum.quantize(w.t().contiguous(), fmt))


def nvfp4_oracle(x: np.ndarray, mode: str) -> np.ndarray:
    """NVFP4 from gfloat parts: T = fp32(amax/(6*448)), at least 2**-149; S = e4m3(amax_b/6/T) (gfloat round,
    nearest, sat), at least 2**-9; elements by gfloat.quantize_block with the full scale S*T (a binary64 scale
    type)."""
    fin = np.abs(x[np.isfinite(x)])
    t = max(float(np.float32(fin.max() / (6 * 448))), 2.0**-149) if fin.size and fin.max() > 0 else 1.0
    e4m3 = gff.format_info_ocp_e4m3

    def scale(emax, vals):
        amax = np.max(np.abs(vals))
        if np.isnan(amax):
            return np.nan
        s = gfloat.round_float(e4m3, min(amax / 6.0 / t, 448.0), gfloat.RoundMode.TiesToEven, True)
        return max(s, 2.0**-9) * t

    fi = gfloat.block.BlockFormatInfo("nvfp4", gff.format_info_ocp_e2m1, 16, gff.format_info_binary64)
    return oracle_1d(fi, x, -1, 16, mode, compute_scale=scale)


@pytest.mark.parametrize("mode", list(GF_MODES))
@pytest.mark.parametrize("case", CASES)
def test_nvfp4_matches_gfloat_built_oracle(case, mode):
    x = cases("nvfp4", np.random.default_rng(11))[case]
    got = emunum.quantize(torch.from_numpy(x), "nvfp4", mode).numpy()
    assert same_bits(got, nvfp4_oracle(x, mode))


@pytest.mark.parametrize("mode", list(GF_MODES))
@pytest.mark.parametrize("case", CASES)
def test_nvfp4_float32_matches_gfloat_built_oracle(case, mode):
    # float32 data takes the CPU fast path (nearest) and the numba tensor amax; every value here fits float32
    x = cases("nvfp4", np.random.default_rng(12))[case]
    got = emunum.quantize(torch.from_numpy(x).float(), "nvfp4", mode).numpy()
    assert same_bits(got, nvfp4_oracle(x, mode).astype(np.float32))


def large_specials(rng, rows: int, cols: int) -> np.ndarray:
    """A (rows, cols) float32-valued array over 2**18 elements (the CPU kernels' parallel loops), scales
    varying by row and block, with NaN, +-inf, all-zero, float32-subnormal and near-overflow blocks; -inf in the
    last column and in column 4095 (the last whole block of a 4096-column slice), the largest magnitude at [7, 0]."""
    x = rng.standard_normal((rows, cols)) * 2.0 ** rng.integers(-60, 60, (rows, 1))
    x *= 2.0 ** rng.integers(-8, 8, (rows, cols // 16 + 1)).repeat(16, axis=1)[:, :cols]
    x[1, 5], x[2, 70], x[3, -1], x[4, 33] = np.nan, np.inf, -np.inf, np.nan
    x[3, min(cols, 4096) - 1] = -np.inf
    x[5, 64:96] = 0.0
    x[6, :] *= 2.0 ** -90  # float32 subnormals and below
    x[7, :] = rng.uniform(-3.4e38, 3.4e38, cols)
    x[7, 0] = 3.4e38
    return x.astype(np.float32).astype(np.float64)


@functools.lru_cache(maxsize=None)
def _large_case(name: str):
    """large_specials over 4100 columns and gfloat's result (computed once per format: its per-block loop is the
    slow part). The first 4096 columns are whole blocks of the same rows, so their result is the slice; NVFP4's
    tensor scale too, since the largest magnitude is at [7, 0] in both."""
    x = large_specials(np.random.default_rng(5), 64, 4100)
    want = nvfp4_oracle(x, "nearest") if name == "nvfp4" else oracle_1d(MX[name], x, -1, 32, "nearest")
    x.setflags(write=False)
    want.setflags(write=False)
    return x, want


@pytest.mark.parametrize("cols", [4096, 4100])  # blocks that tile the rows; 4100 = 128 * 32 + 4: a partial one
@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp4_e2m1", "nvfp4"])
def test_large_float32_nearest_matches_gfloat_in_parallel(name, cols):
    x, want = _large_case(name)
    x, want = x[:, :cols].copy(), want[:, :cols]
    fin = np.abs(x[np.isfinite(x)])
    assert fin.max() == abs(x[7, 0]) and np.isneginf(x[3, -1])  # the slice keeps the scale and the -inf
    got = emunum.quantize(torch.from_numpy(x).float(), name).numpy()
    with np.errstate(over="ignore"):
        assert same_bits(got, want.astype(np.float32)), name


@pytest.mark.parametrize("name,k", [("msfp12", 3), ("msfp16", 7)])
def test_msfp_is_a_shared_exponent_over_sign_magnitude_integers(name, k):
    """MSFP: step = 2**(floor(log2 amax) - (k-1)), mantissa = round-half-even(x / step) clipped to +-(2**k - 1)."""
    x = np.random.default_rng(k).standard_normal((8, 48)) * 2.0 ** np.random.default_rng(k).integers(-9, 9, (8, 1))
    x = x.astype(np.float32).astype(np.float64)
    want = np.empty_like(x)
    for r in range(8):
        for s in range(0, 48, 16):
            b = x[r, s:s + 16]
            step = 2.0 ** (math.frexp(np.abs(b).max())[1] - 1 - (k - 1))
            want[r, s:s + 16] = np.clip(np.rint(b / step), -(2**k - 1), 2**k - 1) * step
    got = emunum.quantize(torch.from_numpy(x), name).numpy()
    assert same_bits(got, want + 0.0 * np.sign(x))
    got32 = emunum.quantize(torch.from_numpy(x).float(), name).numpy()  # the float32 fast path, blocks of 16
    assert same_bits(got32, (want + 0.0 * np.sign(x)).astype(np.float32))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("mode", ["nearest", "stochastic", "toward_zero"])
@pytest.mark.parametrize("amax", [2.0**-149, 2.0**-147, 2.0**-139, 2.0**-137], ids=lambda a: f"2**{int(np.log2(a))}")
def test_a_tensor_scale_that_would_round_to_zero_is_the_smallest_float32(amax, mode, dtype):
    """amax / 2688 below 2**-150 rounds to 0 in float32, and dividing by T = 0 crashed (or gave inf)."""
    x = (np.random.default_rng(3).integers(-4, 5, (4, 48)) * (amax / 4)).astype(dtype)
    x[0, 0] = amax
    fmt = BLOCK_PRESETS["nvfp4"]
    assert fmt.tensor_scale_of(x.astype(np.float64)) == max(float(np.float32(amax / 2688)), 2.0**-149)
    got = emunum.quantize(torch.from_numpy(x), "nvfp4", mode, seed=7).numpy()
    assert np.isfinite(got).all()
    if mode != "stochastic":
        assert same_bits(got, nvfp4_oracle(x.astype(np.float64), mode).astype(dtype))
    for name in ("nvfp4_b32", "nvint4", "nvfp4_row"):  # the other outer-scaled presets: finite, no error
        assert np.isfinite(emunum.quantize(torch.from_numpy(x), name, mode, seed=7).numpy()).all()


# Every preset against BlockFormat.encode/decode, the per-row and 4/6 presets too (their numpy reference:
# emunum/formats/nvfp4_encode.py; tests/test_nvfp4_*.py check them against TransformerEngine's reference).
ENCODABLE = list(BLOCK_PRESETS)


@pytest.mark.parametrize("mode", ["nearest", "nearest_away", "toward_zero", "up", "down", "odd"])
@pytest.mark.parametrize("name", ENCODABLE)
def test_kernel_matches_numpy_reference_encode_decode(name, mode):
    fmt = BLOCK_PRESETS[name]
    x = np.random.default_rng(5).standard_normal((6, 50)) * 2.0 ** np.random.default_rng(6).integers(-30, 30, (6, 1))
    x[2, 7], x[4, 1] = np.nan, np.inf
    got = emunum.quantize(torch.from_numpy(x), fmt, mode).numpy()
    codes, scales, t = fmt.encode(x, rounding=mode)
    assert same_bits(got, fmt.decode(codes, scales, tensor_scale=t))


@pytest.mark.parametrize("name", ENCODABLE)
def test_encode_decode_round_trip_reproduces_quantized_values(name):
    fmt = BLOCK_PRESETS[name]
    x = torch.randn(5, 3, 40, dtype=torch.float64) * 4
    q = emunum.quantize(x, fmt, axis=1).numpy()
    codes, scales, t = fmt.encode(x.numpy(), axis=1)
    assert codes.shape == q.shape and scales.shape == ((5, 1, 40) if fmt.tile[0] == 0 else (5, 1, 3))
    assert same_bits(fmt.decode(codes, scales, axis=1, tensor_scale=t), q)
    # re-encoding is idempotent except where quantising moves the amax: T (tensor_scale, per row) depends on it, and
    # MXINT8's -2.0 * X (from a negative amax just below 2X) doubles the next scale
    if not fmt.tensor_scale and not fmt.nvfp4_path and isinstance(fmt.element, FloatFormat):
        c2, s2, _ = fmt.encode(q, axis=1)
        assert np.array_equal(c2, codes) and np.array_equal(s2, scales)


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp4_e2m1", "mxint8", "nvfp4"])
def test_stochastic_rounding_of_elements_is_unbiased_within_5_sigma(name):
    """Every row is the same block (the element max fixes the scale), so each column is n draws of one
    Bernoulli choice between its two neighbours: the mean error is within 5 sigma <= 5 * gap / (2 sqrt n)."""
    fmt = BLOCK_PRESETS[name]
    n = 4000
    base = torch.tensor([fmt.element.max] + [0.37, -1.13, 0.051, 2.0 / 3.0] * 8, dtype=torch.float64)
    x = base[:fmt.block_elements].repeat(n, 1)
    q = emunum.quantize(x, fmt, "stochastic", seed=123)
    down, up = emunum.quantize(x, fmt, "down"), emunum.quantize(x, fmt, "up")
    assert torch.all((q == down) | (q == up))
    err = (q - x).mean(0)
    sigma = (up - down)[0] / (2 * math.sqrt(n))
    assert torch.all(err.abs() <= 5 * sigma), (err, sigma)
    assert torch.all((q != down).any(0) == (up != down)[0])  # every inexact column rounds both ways


def test_stochastic_is_reproducible_by_seed_and_varies_across_seeds():
    x = torch.randn(64, 32)
    a = emunum.quantize(x, "mxfp4", "stochastic", seed=1)
    assert torch.equal(a, emunum.quantize(x, "mxfp4", "stochastic", seed=1))
    assert not torch.equal(a, emunum.quantize(x, "mxfp4", "stochastic", seed=2))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_dtypes_round_through_float32(dtype):
    x = (torch.randn(4, 64) * 100).to(dtype)
    got = emunum.quantize(x, "mxfp4")
    assert got.dtype == dtype
    assert torch.equal(got, emunum.quantize(x.float(), "mxfp4").to(dtype))


def test_out_and_no_modify_guarantees():
    x = torch.randn(3, 64)
    keep = x.clone()
    out = torch.empty_like(x)
    r = emunum.quantize(x, "mxfp8_e4m3", out=out)
    assert r is out and torch.equal(x, keep)
    assert torch.equal(out, emunum.quantize(x, "mxfp8_e4m3"))
    y = emunum.quantize(x, "mxfp8_e4m3", out=x)
    assert y is x and torch.equal(x, out)


@pytest.mark.parametrize("mode", ["nearest", "stochastic"])
@pytest.mark.parametrize("name", ["nvfp4", "nvfp4_2d", "nvfp4_4over6", "nvfp4_row", "mxfp8_e4m3", "mxfp4_e2m1",
                                  "mxint8", "mxfp8_e4m3_plus", "nf4_b64"])
def test_in_place_gives_the_bits_and_scales_of_a_fresh_output(name, mode):
    """quantize(x, out=x) (the CPU kernels then write a fresh buffer, copied into x) equals quantize into a new
    tensor: values, scales and x itself; along the last axis (x is the kernels' working layout) and axis 0."""
    x = torch.randn(32, 128, generator=torch.Generator().manual_seed(7)) * 3
    x[3, 5], x[7, 17] = float("nan"), float("inf")
    fmt, m = emunum.get_format(name), RoundMode.parse(mode)
    for axis in (-1, 0):
        if fmt.tile[0] != 0 and axis == 0:
            continue  # 2-D tiles take no axis
        want, want_s = quantize_block_checked(x, fmt, m, seed_key(11), 32, axis, return_scales=True)
        y = x.clone()
        got, got_s = quantize_block_checked(y, fmt, m, seed_key(11), 32, axis, out=y, return_scales=True)
        assert got is y
        assert torch.equal(y.view(torch.int32), want.view(torch.int32))
        assert torch.equal(got_s.view(torch.int64), want_s.view(torch.int64))


def test_non_contiguous_input_and_empty_and_scalar():
    x = torch.randn(64, 6).t()
    assert torch.equal(emunum.quantize(x, "mxfp4"), emunum.quantize(x.contiguous(), "mxfp4"))
    assert emunum.quantize(torch.empty(0, 32), "mxfp4").shape == (0, 32)
    assert emunum.quantize(torch.tensor(3.3), "mxfp4").item() == 3.0


@pytest.mark.parametrize("kw,exc,words", [
    (dict(axis=2), ValueError, "axis=2"),
    (dict(axis=-3), ValueError, "axis=-3"),
    (dict(axis=1.0), TypeError, "axis"),
])
def test_bad_axis_is_named(kw, exc, words):
    with pytest.raises(exc, match=words):
        emunum.quantize(torch.randn(4, 4), "mxfp4", **kw)


def test_tiles_on_a_1d_tensor_are_rejected():
    with pytest.raises(ValueError, match="2-D tiles"):
        emunum.quantize(torch.randn(64), BlockFormat("e4m3fn", (16, 16)))
