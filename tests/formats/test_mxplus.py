"""MX+ block formats (``MXPlusFormat``) against the definition of Lee et al., "MX+" (MICRO 2025,
arXiv:2510.14557), written here in exact fractions from the OCP element encodings, independent of emunum's
kernels and element specs:

- X = 2**clip(floor(log2 amax) - emax, -127, 127) (OCP MX v1.0 section 6.3), emax = floor(log2 element max);
- the block max (BM) is the first element of largest |x|; its magnitude is rounded onto
  {2**emax * (1 + k / 2**p): k = 0 .. 2**p - 1}, p = ebits + mbits, saturating at both ends;
- every other element is rounded onto the element's values and saturated to +-max (plain MX);
- NaN blocks are NaN; zero blocks zero; infinities count as the largest magnitudes.

Zero tolerance: values are compared bit for bit (signed zeros included). The grids are swept exhaustively:
every element value, midpoint and the float32 neighbours of each midpoint, at the BM and at other positions,
under several scales (the smallest and largest E8M0 scales, clipped scales), in every deterministic mode.
"""
from __future__ import annotations

import bisect
import math
from fractions import Fraction as Fr

import numpy as np
import pytest
import torch

import emunum
from emunum.block_quantize import quantize_block_checked
from emunum.formats import MXPLUS_PRESETS, MXPlusFormat, RoundMode

# the OCP element encodings, written out: (exponent bits, mantissa bits, bias, special codes)
# special: "none" every code finite; "fn" only S.1111.111 is NaN (e4m3); "ieee" the top exponent is inf/NaN
ELEMENTS = {
    "mxfp4_e2m1": (2, 1, 1, "none"),
    "mxfp6_e2m3": (2, 3, 1, "none"),
    "mxfp6_e3m2": (3, 2, 3, "none"),
    "mxfp8_e4m3": (4, 3, 7, "fn"),
    "mxfp8_e5m2": (5, 2, 15, "ieee"),
}
MODES = ["nearest", "nearest_away", "toward_zero", "up", "down", "odd"]


def element_grid(e, m, bias, special):
    """The element's non-negative finite values in code order (index = code, so index parity = code parity)."""
    out = []
    for E in range(2 ** e):
        for M in range(2 ** m):
            if special == "ieee" and E == 2 ** e - 1:
                continue
            if special == "fn" and E == 2 ** e - 1 and M == 2 ** m - 1:
                continue
            out.append(Fr(2) ** (1 - bias) * Fr(M, 2 ** m) if E == 0 else Fr(2) ** (E - bias) * (1 + Fr(M, 2 ** m)))
    return out


def bm_grid(e, m, emax):
    p = e + m
    return [Fr(2) ** emax * (1 + Fr(k, 2 ** p)) for k in range(2 ** p)]


def floor_log2(a: Fr) -> int:
    k = a.numerator.bit_length() - a.denominator.bit_length()
    return k - 1 if Fr(2) ** k > a else k


def round_onto(a: Fr, grid, mode: str, neg: bool) -> Fr:
    """|x| = a rounded onto a sorted grid (index parity = the code's last bit), saturating at both ends."""
    if a >= grid[-1]:
        return grid[-1]
    if a <= grid[0]:
        return grid[0]
    i = bisect.bisect_right(grid, a) - 1
    lo, hi = grid[i], grid[i + 1]
    if a == lo:
        return lo
    d = (a - lo) - (hi - a)
    if mode == "nearest":
        return lo if d < 0 or (d == 0 and i % 2 == 0) else hi
    if mode == "nearest_away":
        return lo if d < 0 else hi
    if mode == "toward_zero":
        return lo
    if mode == "up":
        return lo if neg else hi
    if mode == "down":
        return hi if neg else lo
    assert mode == "odd"
    return lo if i % 2 == 1 else hi


def reference(x: np.ndarray, name: str, block: int, mode: str) -> np.ndarray:
    """MX+ of a 1-D float array in blocks of ``block`` (the last partial), float64 results."""
    e, m, bias, special = ELEMENTS[name]
    grid = element_grid(e, m, bias, special)
    emax = floor_log2(grid[-1])
    bgrid = bm_grid(e, m, emax)
    out = np.empty(len(x))
    for b0 in range(0, len(x), block):
        xs = [float(v) for v in x[b0:b0 + block]]
        if any(math.isnan(v) for v in xs):
            out[b0:b0 + len(xs)] = np.nan
            continue
        mags = [math.inf if math.isinf(v) else Fr(abs(v)) for v in xs]
        inf = any(a == math.inf for a in mags)
        amax = math.inf if inf else max(mags)
        if amax == 0:
            out[b0:b0 + len(xs)] = [math.copysign(0.0, v) for v in xs]
            continue
        E = 127 if inf else min(max(floor_log2(amax) - emax, -127), 127)
        X = Fr(2) ** E
        bm = mags.index(amax)  # the first of equal maxima
        for i, (v, a) in enumerate(zip(xs, mags)):
            g = bgrid if i == bm else grid
            q = g[-1] if a == math.inf else round_onto(a / X, g, mode, v < 0)
            out[b0 + i] = math.copysign(float(q * X), v)
    return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and np.array_equal(np.isnan(a), np.isnan(b)) and \
        np.array_equal(np.where(np.isnan(a), 0, a).view(np.int64), np.where(np.isnan(b), 0, b).view(np.int64))


def plus(name: str, block: int = 32) -> MXPlusFormat:
    return MXPLUS_PRESETS[name + "_plus"].with_block_size(block)


def _f32_neighbours(v: Fr) -> list:
    f = np.float32(float(v))
    return [f, np.nextafter(f, np.float32(-np.inf)), np.nextafter(f, np.float32(np.inf))]


def _candidates(grid, top: Fr) -> list:
    """Each value of ``grid``, each midpoint, and their float32 neighbours, up to ``top`` (exclusive)."""
    ext = grid + [top]
    pts = []
    for lo, hi in zip(ext, ext[1:]):
        pts += _f32_neighbours(lo) + _f32_neighbours((lo + hi) / 2)
    return sorted({float(p) for p in pts if 0 <= p < top})


# scale exponents reachable with float32 data (the block max below 2**128 and candidates above 2**-149)
SCALES = [-127, -9, 0, 11]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("E", SCALES)
@pytest.mark.parametrize("name", ELEMENTS)
def test_every_non_bm_code_and_midpoint_rounds_as_plain_mx(name, E, mode):
    """Position 0 holds a block max just below 2**(emax+1) * X (it saturates); the other positions sweep every
    element value, midpoint and their float32 neighbours, both signs, up to the top of the binade."""
    e, m, bias, special = ELEMENTS[name]
    grid = element_grid(e, m, bias, special)
    emax = floor_log2(grid[-1])
    X = Fr(2) ** E
    cands = [float(np.float32(float(c * X))) for c in _candidates(grid, Fr(2) ** (emax + 1))]
    cands = [c for s in (1, -1) for c in cands if c != 0 or s == 1] + [-0.0]
    anchor = float(np.nextafter(np.float32(float(Fr(2) ** (emax + 1) * X)), np.float32(0)))
    rows = [cands[i:i + 31] for i in range(0, len(cands), 31)]
    x = np.array([v for r in rows for v in [anchor] + r], dtype=np.float32)
    got = emunum.quantize(torch.from_numpy(x), plus(name), mode).numpy()
    assert same_bits(got, reference(x, name, 32, mode).astype(np.float32))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("E", SCALES)
@pytest.mark.parametrize("name", ELEMENTS)
def test_every_bm_code_midpoint_and_carry_out(name, E, mode):
    """Blocks of 4 whose block max sweeps its grid 2**emax * (1 + k/2**p), every midpoint, the float32
    neighbours of each, and the carry region above the largest BM value; the BM moves through the block's
    positions; the others are small values of both signs."""
    e, m, bias, special = ELEMENTS[name]
    emax = floor_log2(element_grid(e, m, bias, special)[-1])
    X = Fr(2) ** E
    bms = [float(np.float32(float(c * X))) for c in _candidates(bm_grid(e, m, emax), Fr(2) ** (emax + 1))]
    bms = [b for b in bms if b >= float(Fr(2) ** emax * X)]
    x = []
    for i, b in enumerate(bms):
        blk = [float(np.float32(float(X * Fr(3, 2) * (j + 1) * (-1) ** j))) for j in range(3)]
        blk.insert(i % 4, b if i % 3 else -b)
        x += blk
    x = np.array(x, dtype=np.float32)
    got = emunum.quantize(torch.from_numpy(x), plus(name, 4), mode).numpy()
    want = reference(x, name, 4, mode).astype(np.float32)
    assert same_bits(got, want)
    base = emunum.quantize(torch.from_numpy(x), name, mode).numpy()
    assert not np.array_equal(got, base)  # the block max's extra bits show


@pytest.mark.parametrize("name", ELEMENTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_clipped_scales_tiny_and_huge_blocks(name, dtype):
    """Blocks whose scale clips at 2**-127 (the BM below 2**emax is raised to it) or, in float64, at 2**127
    (everything saturates), next to blocks at exactly 2**-127 and subnormal float32 values."""
    e, m, bias, special = ELEMENTS[name]
    emax = floor_log2(element_grid(e, m, bias, special)[-1])
    rng = np.random.default_rng(3)
    exps = [emax - 127 - 1, emax - 127 - 3, emax - 127, -149 + 4]
    if dtype == np.float64:
        exps += [emax + 128, emax + 135, -1000]
    x = np.concatenate([(rng.standard_normal(8) * 2.0 ** k).astype(dtype) for k in exps])
    x = x[np.isfinite(x)]
    for mode in ("nearest", "toward_zero", "up"):
        got = emunum.quantize(torch.from_numpy(x), plus(name, 8), mode).numpy()
        assert same_bits(got, reference(x, name, 8, mode).astype(dtype))


@pytest.mark.parametrize("name", ELEMENTS)
def test_ties_among_maxima_give_the_first_the_extra_bits(name):
    """Equal |maxima| of either sign: only the first (lowest index) is the block max."""
    e, m, bias, special = ELEMENTS[name]
    grid = element_grid(e, m, bias, special)
    emax = floor_log2(grid[-1])
    top = bm_grid(e, m, emax)
    a = float((top[1] + top[2]) / 2 * 4)  # rounds differently on the two grids; X = 4
    blocks = [[a, -a, a, 1.0], [-a, a, 0.5, -a], [0.25, a, a, a], [0.0, 0.0, -a, a]]
    x = np.array(blocks, dtype=np.float32).ravel()
    for mode in MODES:
        got = emunum.quantize(torch.from_numpy(x), plus(name, 4), mode).numpy()
        assert same_bits(got, reference(x, name, 4, mode).astype(np.float32))
        g = got.reshape(4, 4)
        assert abs(g[0, 0]) != abs(g[0, 1]) and abs(g[2, 1]) != abs(g[2, 2])


@pytest.mark.parametrize("name", ELEMENTS)
def test_zero_nan_and_infinite_blocks(name):
    x = np.array([0.0, -0.0, 0.0, -0.0,  # a zero block keeps its signed zeros
                  1.0, np.nan, 2.0, -3.0,  # NaN anywhere: the whole block NaN
                  np.inf, 1.0, -np.inf, -2.0,  # infinities: scale 2**127, the first the BM
                  -np.inf, np.inf, 5.0, 0.0], dtype=np.float64)
    got = emunum.quantize(torch.from_numpy(x), plus(name, 4)).numpy()
    assert same_bits(got, reference(x, name, 4, "nearest"))
    got32 = emunum.quantize(torch.from_numpy(x.astype(np.float32)), plus(name, 4)).numpy()
    with np.errstate(over="ignore"):  # the largest values times 2**127 are inf in float32, as in plain MX
        assert same_bits(got32, reference(x, name, 4, "nearest").astype(np.float32))
    assert np.signbit(got[:4]).tolist() == [False, True, False, True] and np.isnan(got[4:8]).all()


@pytest.mark.parametrize("name", ELEMENTS)
def test_presets_on_wide_data_along_either_axis_with_partial_blocks(name):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((6, 70)) * 2.0 ** rng.integers(-20, 20, (6, 1))).astype(np.float32)
    for axis in (-1, 0):
        got = emunum.quantize(torch.from_numpy(x), MXPLUS_PRESETS[name + "_plus"], axis=axis).numpy()
        w = np.moveaxis(x, axis, -1)
        want = np.stack([reference(r, name, 32, "nearest") for r in w]).astype(np.float32)
        assert same_bits(got, np.moveaxis(want, -1, axis))


def test_a_tile_s_block_max_is_its_first_in_row_major_order():
    fmt = MXPlusFormat("fp4_e2m1", (2, 4))
    x = np.array([[1.0, 2.0, 4.5, 0.5, 3.0, 1.0, 1.0, 1.0],
                  [-4.5, 1.0, 0.0, 0.0, 1.0, 3.0, 1.0, -3.0]], dtype=np.float32)
    got = emunum.quantize(torch.from_numpy(x), fmt).numpy()
    for bj in range(2):  # the reference on each tile flattened row-major
        tile = x[:, 4 * bj:4 * bj + 4].ravel()
        assert same_bits(got[:, 4 * bj:4 * bj + 4].ravel(), reference(tile, "mxfp4_e2m1", 8, "nearest"))
    assert got[0, 2] == 4.5 and got[1, 0] == -4.0 and got[1, 7] == -3.0


def _first_argmax_mask(x: torch.Tensor, block: int) -> torch.Tensor:
    a = x.abs().reshape(x.shape[0], -1, block)
    idx = (a == a.amax(-1, keepdim=True)).int().argmax(-1)  # the first maximum
    mask = torch.zeros_like(a, dtype=torch.bool)
    mask.scatter_(-1, idx[..., None], True)
    return mask.reshape(x.shape)


@pytest.mark.parametrize("name", ELEMENTS)
def test_without_its_block_max_a_block_is_plain_mx(name):
    """Every element but each block's first maximum equals emunum's plain MX preset, bit for bit, scales
    too; the block maxima differ where the finer grid matters."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 256, generator=g) * torch.logspace(-6, 6, 64)[:, None]
    x[::7, 32:64] = x[::7, 32:64].round()  # equal maxima inside a block
    q, s = quantize_block_checked(x, emunum.get_format(name + "_plus"), RoundMode.NEAREST, 0, 32, return_scales=True)
    q0, s0 = quantize_block_checked(x, emunum.get_format(name), RoundMode.NEAREST, 0, 32, return_scales=True)
    bm = _first_argmax_mask(x, 32)
    assert torch.equal(s, s0)
    assert torch.equal(q[~bm].view(torch.int32), q0[~bm].view(torch.int32))
    assert (q[bm] != q0[bm]).float().mean() > 0.3


TORCHAO = [("mxfp8_e4m3", torch.float8_e4m3fn), ("mxfp8_e5m2", torch.float8_e5m2), ("mxfp6_e3m2", "fp6_e3m2"),
           ("mxfp6_e2m3", "fp6_e2m3"), ("mxfp4_e2m1", torch.float4_e2m1fn_x2)]


@pytest.mark.parametrize("name,dtype", TORCHAO)
def test_non_bm_elements_equal_torchao_to_mx(name, dtype):
    """torchao 0.18's to_mx (FLOOR) is the second oracle for the non-BM elements (blocks of scale code 0 left
    out: tests/test_block_torchao.py documents torchao's halving there)."""
    mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    g = torch.Generator().manual_seed(2)
    x = torch.randn(64, 256, generator=g) * torch.logspace(-30, 30, 64)[:, None]
    scale, data = mx.to_mx(x, dtype, 32)
    theirs = mx.to_dtype(data, scale, dtype, 32, torch.float32)
    keep = ~_first_argmax_mask(x, 32) & (scale.view(torch.uint8) != 0).repeat_interleave(32, dim=-1)
    assert torch.equal(emunum.quantize(x, name + "_plus")[keep], theirs[keep])


@pytest.mark.parametrize("name", ELEMENTS)
def test_stochastic_rounding_lands_on_a_neighbour_and_is_reproducible(name):
    x = torch.tensor([4.3, 0.7, -1.1, 2.0] * 64)
    fmt = plus(name, 4)
    a = emunum.quantize(x, fmt, "stochastic", seed=3)
    assert torch.equal(a, emunum.quantize(x, fmt, "stochastic", seed=3))
    lo = emunum.quantize(x, fmt, "down").numpy()
    hi = emunum.quantize(x, fmt, "up").numpy()
    got = a.numpy()
    assert ((got == lo) | (got == hi)).all()
    for col in range(4):  # column 0 holds each block's maximum: its extended grid rounds stochastically too
        assert (got[col::4] == lo[col::4]).any() and (got[col::4] == hi[col::4]).any()


@pytest.mark.parametrize("name", ["mxfp4_e2m1", "mxfp8_e4m3"])
def test_a_patched_linear_multiplies_the_reference_quantised_operands(name):
    """emunum.patch(model, fmt=<MX+ preset>): the Linear's forward is F.linear of its input and weight, each
    quantised by the reference above in blocks of 32 along in_features."""
    from torch import nn

    torch.manual_seed(0)
    m, x = nn.Sequential(nn.Linear(64, 8, bias=False)), torch.randn(5, 64) * 3
    ref = lambda t: torch.from_numpy(np.stack([reference(r, name, 32, "nearest") for r in t.detach().double().numpy()]))
    want = nn.functional.linear(ref(x).float(), ref(m[0].weight).float())
    emunum.patch(m, fmt=name + "_plus")
    assert torch.equal(m(x).detach(), want)


def test_names_bits_and_largest_values():
    f = emunum.get_format("mxfp4_plus")
    assert f is MXPLUS_PRESETS["mxfp4_e2m1_plus"] and f.name == "mxfp4_e2m1_plus" and f.bits == 4.5
    assert f.bm_max == 7.5 and MXPLUS_PRESETS["mxfp8_e4m3_plus"].bm_max == 510.0
    assert emunum.get_format("mxfp8_plus").bm_max == 2 ** 8 * (2 - 2 ** -7)
    assert MXPlusFormat("fp6_e2m3", 16).name == "block[e2m3none,16,e8m0,mx+]"
    assert MXPlusFormat("fp4_e2m1") == MXPLUS_PRESETS["mxfp4_e2m1_plus"]
    assert MXPlusFormat("fp4_e2m1") != emunum.get_format("mxfp4")


@pytest.mark.parametrize("kwargs,words", [
    (dict(element="int8"), "MXPlusFormat.element=fixed8_0: .* allowed: a FloatFormat"),
    (dict(element="fp4_e2m1", scale_rule="rceil"), "MXPlusFormat.scale_rule='rceil'.*allowed: 'floor'"),
    (dict(element="fp4_e2m1", scale="e4m3fn", scale_rule="amax", tensor_scale=True), "allowed: 'floor'"),
    (dict(element="fp4_e2m1", block_size=0), "block_size=0 is out of range"),
])
def test_bad_specs_raise_naming_the_field(kwargs, words):
    with pytest.raises(ValueError, match=words):
        MXPlusFormat(**kwargs)


def test_encode_and_block_scaled_instructions_refuse_mx_plus_by_name():
    with pytest.raises(ValueError, match="mxfp4_e2m1_plus.encode: an MX\\+ block max has no element code"):
        MXPLUS_PRESETS["mxfp4_e2m1_plus"].encode(np.ones(32))
    from emunum.mad.block_mma import block_scaled_mm
    A, B = torch.randn(4, 64), torch.randn(64, 4)
    with pytest.raises(ValueError, match="fmt_a=mxfp4_e2m1_plus: .*no MX\\+ block max"):
        block_scaled_mm(A, B, "mxfp4_plus", "mxfp4_plus", "b200_mxf4nvf4_ue8m0")
    with pytest.raises(ValueError, match="rounding=3.5 is not a rounding mode; allowed"):
        emunum.quantize(torch.ones(4), "mxfp4_plus", 3.5)


def test_rounding_codes_match_the_modes_the_reference_names():
    assert [RoundMode.parse(m) for m in MODES] == [RoundMode.NEAREST, RoundMode.NEAREST_AWAY, RoundMode.TOWARD_ZERO,
                                                     RoundMode.UP, RoundMode.DOWN, RoundMode.ODD]


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 64)])
def test_empty_and_meta_tensors_keep_their_shape(shape):
    x = torch.empty(shape)
    assert emunum.quantize(x, "mxfp4_plus").shape == x.shape
    m = torch.empty((4, 64), device="meta")
    assert emunum.quantize(m, "mxfp8_plus").shape == (4, 64) and emunum.quantize(m, "mxfp8_plus").is_meta


def test_out_is_written_in_place_with_the_reference_bits():
    x = torch.tensor([5.5, -1.0, 0.25, 3.0] * 8)
    want = torch.from_numpy(reference(x.numpy(), "mxfp4_e2m1", 32, "nearest").astype(np.float32))
    y = x.clone()
    emunum.quantize(y, "mxfp4_plus", out=y)
    assert torch.equal(y, want) and y[0] == 5.5
