"""Scalar cores of the NVFP4-family block kernels (kernels/nvfp4_cpu.py, kernels/nvfp4_cuda.py): one block of a
(P, R, C) array, with a per-row-of-blocks outer scale, or with "four over six" (4/6) scale selection.

Arrays: src, dst (P, R, C); scales (P, nbr, nbc) float64; per-row arrays indexed by the flat row p * R + i:
``t`` (the plain path's outer scale T, float64) and, for 4/6, ``ges``, ``gds``, ``gamax`` (float32: the outer
encode scale, its reciprocal and the amax it came from) with ``denom`` = 6 * bound (float32).

4/6 (``fos_block``) computes as TransformerEngine's reference_nvfp4.py does, in float32 (every operation on
two float32 values rounds to nearest-even, as torch's float32 ops do):
- vmax = the block's largest |x|; base = (vmax / 6) * ges; S6 = scale(base), S4 = scale(base * 1.5), where
  scale() clamps to the scale format's max and rounds to nearest-even into it (a result of 0 is kept);
- per candidate S: enc = min(1 / (S * gds), FLT_MAX); each element q = e2m1(x * enc) (saturating, the
  caller's rounding mode, the same random bits for both candidates); val = ((q * S) * gamax) / denom;
  d = val - x; the block error is the sum of |d| (MAE) or d * d (MSE), added in element order along the row,
  or the max of |d| (absmax). A 16 x 16 tile adds its 16 row errors as a tree: (r_i + r_i+8), then +4, +2, +1
  (TransformerEngine's warp reduction, ``_sum_4over6_2d_error``); rows past the tensor's edge count 0.
- S4 is kept only if its error is strictly below S6's (a tie keeps S6). The result is q * S * gds (exact in
  float64, rounded once to the output's dtype).
"""
import math

import numpy as np
from numba import njit

from .scalar.block import block_scale, element_mbits, round_element, round_float_value_sat
from .scalar.common import NEAREST, STOCHASTIC, random_bits
from .scalar.float import round_nearest_value

F32 = np.float32
FLT_MAX = F32(3.4028234663852886e38)
FLT_MAX64 = 3.4028234663852886e38

# numba's CUDA simulator cannot hand its fake device arrays to compiled @njit cores: kernels/nvfp4_cuda.py then
# loads a second copy of this module with PLAIN_PYTHON set, whose cores stay Python functions.
_core = (lambda f: f) if globals().get("PLAIN_PYTHON") else njit(inline="always", error_model="numpy")
# The block-level cores and the element rounding are compiled once each, not copied into every caller by numba's
# IR inliner (that copying made the CPU loop's compile ~30 CPU-s), and inlined by LLVM (kernels/llvm_inline.py).
_called = (lambda f: f) if globals().get("PLAIN_PYTHON") else njit(error_model="numpy")
if globals().get("PLAIN_PYTHON"):
    def inline_in_llvm():
        pass
else:
    from .llvm_inline import inline_in_llvm


@_core
def _encode_scale(s, g):
    """min(float32(1 / float32(s * g)), FLT_MAX): the quotient through float64 rounds as float32's own division
    (53 >= 2 * 24 + 2 bits: double rounding of a quotient is harmless), without a division by zero."""
    sg = F32(s * g)
    if sg == 0:
        return FLT_MAX
    return F32(min(1.0 / np.float64(sg), FLT_MAX64))


@_core
def _scale_of(v, s_man, s_emin, s_sub, s_max):
    """float32 v clamped to s_max and rounded to nearest-even into the scale format (0 stays 0)."""
    w = min(np.float64(v), s_max)
    return F32(round_float_value_sat(w, s_man, s_emin, s_sub, s_max, 0, NEAREST, 0, 32))


@_called
def _round(v, kind, p0, p1, p2, max_e, negzero, mode, rnd, nbits):
    """``round_element``; round-to-nearest of a float element by Veltkamp's split (``round_nearest_value``, the
    same bits: kernels/block_cpu.py's nearest branch), about 4x faster."""
    inline_in_llvm()
    if kind == 0 and mode == NEAREST:
        split = math.ldexp(1.0, 52 - p0) + 1.0
        magic = 1.5 * math.ldexp(1.0, 52 + (p1 - p0 if p2 != 0 else p1))
        return round_nearest_value(v, split, magic, math.ldexp(1.0, p1), max_e, max_e, negzero)
    return round_element(v, kind, p0, p1, p2, max_e, negzero, mode, rnd, nbits)


@_called
def _row_error(src, p, i, c0, c1, R, C, S, gds, gamax, denom, metric, p0, p1, p2, max_e, negzero, mode, key,
               nbits):
    """The float32 error of row i's part [c0, c1) of a block under candidate scale S (see the module doc)."""
    inline_in_llvm()
    enc = _encode_scale(S, gds)
    err = F32(0.0)
    for j in range(c0, c1):
        x = F32(src[p, i, j])
        rnd = random_bits(key, (p * R + i) * C + j, nbits) if mode == STOCHASTIC else np.uint64(0)
        q = F32(_round(np.float64(F32(x * enc)), 0, p0, p1, p2, max_e, negzero, mode, rnd, nbits))
        val = F32(F32(F32(q * S) * gamax) / denom)
        d = F32(val - x)
        if metric == 0:
            err = F32(err + abs(d))
        elif metric == 1:
            err = F32(err + F32(d * d))
        else:
            err = max(err, abs(d))
    return err


@_core
def _join(a, b, metric):
    return max(a, b) if metric == 2 else F32(a + b)


@_called
def _tile_error(src, p, r0, r1, c0, c1, R, C, S, gds, gamax, denom, metric, p0, p1, p2, max_e, negzero, mode, key,
                nbits, tr):
    """A block's error: its one row's (1-D), or a tile's 16 row errors added as TransformerEngine's tree."""
    inline_in_llvm()
    if tr == 1:
        return _row_error(src, p, r0, c0, c1, R, C, S, gds[p * R + r0], gamax[p * R + r0], denom, metric, p0, p1,
                          p2, max_e, negzero, mode, key, nbits)
    g, a = gds[p * R + r0], gamax[p * R + r0]
    total = F32(0.0)
    for jj in range(2):
        cj = F32(0.0)
        for kk in range(2):
            k = jj + 2 * kk
            bk = F32(0.0)
            for mm in range(2):
                m = k + 4 * mm
                e0 = F32(0.0)
                e1 = F32(0.0)
                if r0 + m < r1:
                    e0 = _row_error(src, p, r0 + m, c0, c1, R, C, S, g, a, denom, metric, p0, p1, p2, max_e,
                                    negzero, mode, key, nbits)
                if r0 + m + 8 < r1:
                    e1 = _row_error(src, p, r0 + m + 8, c0, c1, R, C, S, g, a, denom, metric, p0, p1, p2, max_e,
                                    negzero, mode, key, nbits)
                bk = _join(bk, _join(e0, e1, metric), metric)
            cj = _join(cj, bk, metric)
        total = _join(total, cj, metric)
    return total


@_core
def block_at(b, nbr, nbc, tr, tc, R, C):
    """Block b of a (P, nbr, nbc) grid of tr x tc blocks over (P, R, C): (p, bi, bj, r0, r1, c0, c1), the
    block's rows r0..r1-1 and columns c0..c1-1 clipped to the tensor."""
    per = nbr * nbc
    p = b // per
    bi = (b % per) // nbc
    bj = b % nbc
    r0 = bi * tr
    c0 = bj * tc
    return p, bi, bj, r0, min(r0 + tr, R), c0, min(c0 + tc, C)


@_called
def fos_block(src, dst, scales, b, tr, tc, ges, gds, gamax, denom, metric, p0, p1, p2, max_e, negzero, s_man, s_emin,
              s_sub, s_max, mode, key, nbits):
    """Block b (flat index over scales) by 4/6 selection."""
    inline_in_llvm()
    P, R, C = src.shape
    p, bi, bj, r0, r1, c0, c1 = block_at(b, scales.shape[1], scales.shape[2], tr, tc, R, C)
    vmax = F32(0.0)
    has_nan = False
    for i in range(r0, r1):
        for j in range(c0, c1):
            v = F32(src[p, i, j])
            if v != v:
                has_nan = True
            else:
                vmax = max(vmax, abs(v))
    if has_nan:
        scales[p, bi, bj] = math.nan
        for i in range(r0, r1):
            for j in range(c0, c1):
                dst[p, i, j] = math.nan
        return
    line = p * R + r0
    base = F32(F32(vmax / F32(6.0)) * ges[line])
    s6 = _scale_of(base, s_man, s_emin, s_sub, s_max)
    s4 = _scale_of(F32(base * F32(1.5)), s_man, s_emin, s_sub, s_max)
    e6 = _tile_error(src, p, r0, r1, c0, c1, R, C, s6, gds, gamax, denom, metric, p0, p1, p2, max_e, negzero, mode,
                     key, nbits, tr)
    e4 = _tile_error(src, p, r0, r1, c0, c1, R, C, s4, gds, gamax, denom, metric, p0, p1, p2, max_e, negzero, mode,
                     key, nbits, tr)
    s = s4 if e4 < e6 else s6
    scales[p, bi, bj] = s
    for i in range(r0, r1):
        g = gds[p * R + i]
        enc = _encode_scale(s, g)
        full = np.float64(s) * np.float64(g)
        for j in range(c0, c1):
            x = F32(src[p, i, j])
            rnd = random_bits(key, (p * R + i) * C + j, nbits) if mode == STOCHASTIC else np.uint64(0)
            q = _round(np.float64(F32(x * enc)), 0, p0, p1, p2, max_e, negzero, mode, rnd, nbits)
            dst[p, i, j] = q * full


@_called
def row_block(src, dst, scales, b, tr, tc, t, kind, p0, p1, p2, emax_e, max_e, negzero, rule, lo, hi, s_man, s_emin,
              s_sub, s_max, s_min, mode, key, nbits):
    """Block b of 1-D blocks with the plain amax rule and the outer scale t[p * R + row] of its row
    (``BlockFormat``'s float64 semantics, T per row instead of per tensor)."""
    inline_in_llvm()
    P, R, C = src.shape
    p, bi, bj, i, _, c0, c1 = block_at(b, scales.shape[1], scales.shape[2], 1, tc, R, C)
    amax = 0.0
    has_nan = False
    for j in range(c0, c1):
        v = np.float64(src[p, i, j])
        if v != v:
            has_nan = True
        else:
            amax = max(amax, abs(v))
    tt = t[p * R + i]
    s = block_scale(amax, has_nan, rule, emax_e, max_e, lo, hi, s_man, s_emin, s_sub, s_max, s_min, tt,
                    element_mbits(kind, p0, p2))
    scales[p, bi, bj] = s
    full = s * tt
    for j in range(c0, c1):
        if has_nan:
            dst[p, i, j] = math.nan
        else:
            rnd = random_bits(key, (p * R + i) * C + j, nbits) if mode == STOCHASTIC else np.uint64(0)
            q = _round(np.float64(src[p, i, j]) / full, kind, p0, p1, p2, max_e, negzero, mode, rnd, nbits)
            dst[p, i, j] = q * full
