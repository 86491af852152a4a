"""Float32 fast path of the block kernel (kernels/block_cpu.py) for stochastic rounding: float32 data, 1-D blocks
along the last axis or 2-D tiles (nvfp4_2d), a float or fixed-point element, amax scales (NVFP4's and NVINT4's
gradients) or power-of-two ones (every OCP MX rule: MXFP8/6/4 and MXINT8/4 gradients; MX+, below). The same bits
as ``block_cpu._one_block``'s stochastic branch, which rounds x / F (F = S * T, in float64) by
``round_float_value_sat`` (float) or ``round_fixed_value`` (fixed, saturating) with the bits
``random_bits(key, flat index, nbits)`` and stores float32(q * F); tests/kernels/test_block_sr.py compares the two
bit for bit.

The element loop is that core with the steps that do not vectorise (on AVX2) replaced by equal expressions, so
that LLVM runs it in vector lanes:
- ``_floor`` (a truncation through int64, which AVX2 cannot convert in vector lanes) is np.floor: the two differ
  only in floor(-0.0)'s sign, and every value floored here is >= +0 (|v| scaled, its remainder, their halves), inf,
  or NaN past an inf, where both agree; the random bits become a float64 through the bits of 2**52 + z
  (``_as_float``) instead of a uint64 conversion;
- the exponent of |v| (``frexp``) is read off the float64 bits. That is frexp's exponent minus one for a normal
  v: |x| lies in [2**-149, 2**128] for a nonzero finite float32 x, and F in [2**-900, 2**900] (``sr_ok``), so
  2**-1049 <= |x / F| < 2**1029, normal unless x / F overflows (to inf, as the reference's quotient does) or
  falls below 2**-1022, far below every element's emin, where the exponent read is not used (the subnormal
  quantum exponent is);
- the powers of two 2**-qe and 2**qe (``ldexp``) are built from their bits: |qe| <= 1030 - man stays inside
  float64's normal exponents for every normal v (0 gives a zero, replaced by a select; inf overflows
  big 2**qe, qe = min(1024 - man, 1022), or inf 2**qe to inf, clamped to the limit of its sign).
A fixed element (codes code_min..code_max times 2**-f, |f| <= 1022: NVINT4's int4 -8..7, f = 0) runs the same
core, with arguments (``element_of``) that make it ``round_fixed_value``'s steps: the quantum exponent qe = -f
for every v (emin = FIXED_E above any exponent of v, subnormal branch on, man = FIXED_E + f), no carry bound
(big = inf), and the result clamped to [-neg_max, max_e] = [code_min, code_max] 2**-f (neg_max = 0 for an
unsigned element: a zero, +0 as negzero is 0; a float element's neg_max is max_e). ``round_fixed_value`` computes
y = v 2**f, the integer k and remainder r of |y|, the same stochastic carry, then clamps +-k to [code_min,
code_max] and multiplies by 2**-f; here |y| is |v| 2**f, the same float64 (a product by a power of two rounds |.|
alike; an overflow to inf saturates in both), and clamping k, or k 2**-f after the exact power of two, is the
same value. Its only other step, a remainder set to 2**-1074 where y underflows to 0, never carries (r 2**nbits
<= 2**-1042 rounds to F = 0, and F + rnd < 2**nbits). So one compiled loop serves both kinds, at the cost of one
max per element (the lower limit).

The block scale is computed as the nearest-rounding amax path (``block_fast._table_blocks``) computes it, from
each block's largest |x| (``block_amaxes``'s, when ``scanned``); a power-of-two rule's as the nearest-rounding
power-of-two path does (``block_fast._pow2_scale``, ``block_scale``'s exponent read off the float32 bits of amax),
and then F = S * T as for amax scales (T = 1 for MX). A block is a (tr, tc) tile of the (P, R, C) array,
tr = 1 for 1-D blocks: its amax is the max over its rows' bits, its elements the same loop row by row, each with
its flat index, as ``_one_block`` visits a tile.

**MX+** (``pbits`` >= 0; the plain MX format's arguments, ``mxplus_block_args``): ``mxplus_scalar.mxplus_block``
rounds every element as the plain MX block's stochastic branch does (v = x * (1/S) there: the same value as x / S,
S a power of two), then the block max (the first element of largest |x|, found here on the bits before any
element is written: |x|'s bits order as |x| in a NaN-free block) again by ``round_block_max`` with that element's
own random bits, where amax > 0. This loop does the same. ``round_block_max`` is ``round_fixed_value`` (f = p -
emax fraction bits, codes +-(2**(p+1) - 1), saturating) followed by a clamp up to 2**emax in magnitude, so the
block max takes the element core with a fixed element's arguments (``element_of``'s reasoning) and that clamp.

**Round to nearest** (``nearest_range``, for the fixed elements no other float32 path takes: MXINT8/4). The same
core with ``round_fixed_value``'s NEAREST decision in place of the stochastic one: k + 1 where the remainder r
of |y| is above 1/2, or exactly 1/2 with k odd (ties to the even code); every other step is as above.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from . import _cache, block_fast, scalar, threads
from .block_fast import ABS, NAN32, U32, U64, _amax_bits, _pow2_scale, tile_range
from .llvm_inline import inline_in_llvm
from .scalar import block as scalar_block
from .scalar.block import AMAX, CEIL, EVEN, FLOOR, RCEIL
from .scalar.common import random_bits
from .scalar.float import round_nearest_value

_cache.guard(__file__, [*scalar.SOURCES, block_fast.__file__])

I64 = np.int64


@njit(inline="always")
def _pow2(e):
    """2.0**e for an int64 e in [-1022, 1023], from its bits."""
    return I64((e + 1023) << 52).view(np.float64)


@njit(inline="always")
def _as_float(z):
    """float64(z) for a uint64 z < 2**52, from the bits of 2**52 + z: exact, and it vectorises (AVX2 has no
    vector uint64 -> float64 conversion, so np.float64(z) runs one element at a time)."""
    return U64(U64(0x4330000000000000) | z).view(np.float64) - 4503599627370496.0


@njit(inline="always")
def _is_odd(k):
    """Whether the integral float64 k >= 0 is odd, in float arithmetic (it vectorises; ``scalar.common._is_odd``
    truncates through int64)."""
    return k - 2.0 * np.floor(k * 0.5) == 1.0


@njit(inline="always")
def sr_element(x, full, rnd, man, emin, sub, max_e, neg_max, big, negzero, two_n, near):
    """float32(round_float_value_sat(x / full, ..., STOCHASTIC, rnd, nbits) * full) for a float32 x that is not
    NaN (two_n = 2.0**nbits, big = 2.0**(man + 3), neg_max = max_e), by the reference's steps; with a fixed
    element's ``element_of`` arguments, round_fixed_value's (module doc); near (a constant): the NEAREST branch
    instead (rnd unused)."""
    return np.float32(sr_value(np.float64(x) / full, rnd, man, emin, sub, max_e, neg_max, big, negzero, two_n,
                               near) * full)


@njit(inline="always")
def sr_value(v, rnd, man, emin, sub, max_e, neg_max, big, negzero, two_n, near):
    """``sr_element``'s rounded value of v = x / full (float64, not NaN), before the product with full; near (a
    constant): rounded to nearest, ties to even, instead (rnd, two_n unused)."""
    a = abs(v)
    e = I64((np.float64(a).view(U64) >> U64(52)) & U64(0x7FF)) - 1023
    qe = e - man if e >= emin else (emin - man if sub != 0 else emin)
    qe = min(max(qe, -1022), 1022)  # only for v = 0 or inf (module doc)
    y = a * _pow2(-qe)  # a float element: exact (a normal v times a power of two, normal); fixed: v 2**f as ever
    k = np.floor(y)  # y, d, f >= +0 (or inf, NaN past an inf): np.floor is _floor there, and vectorises
    r = y - k
    d = r * two_n
    f = np.floor(d)
    dd = d - f
    f = f + (1.0 if (dd > 0.5) | ((dd == 0.5) & _is_odd(f)) else 0.0)
    up = (r > 0.5) | ((r == 0.5) & _is_odd(k)) if near else f + rnd >= two_n
    k = k + (1.0 if up else 0.0)
    q = math.copysign(min(k, big) * _pow2(qe), v)  # v = +-inf: +-big 2**qe or +-inf 2**qe, +-inf
    q = max(min(q, max_e), -neg_max)
    zero = math.copysign(0.0, v) if negzero != 0 else 0.0
    return zero if q == 0.0 else q


@njit(nogil=True)
def _sr_blocks(b0, b1, src, bits, dst, dbits, scales, scanned, R, C, tr, tc, full, man, emin, sub, max_e, neg_max, big,
               negzero, s_max, s_min, t, s_split, s_magic, s_min_normal, pw, key, nbits, near):
    """Blocks b0..b1-1 (``sr_range``); near: rounding to nearest (``nearest_range``). ``_sr_rows``' three calls
    pass tc (16 at the first), full and near as plain (not literal) values: numba types this once, with every
    branch, and LLVM inlines it (``llvm_inline``) into each entry point, where they are constants (tc's trip
    count included), and folds the branches away (one compile per literal combination took 21 CPU-s in the
    tests; the speed is the same, ``benchmarks/block_sr.py``)."""
    inline_in_llvm()
    rule, emax_e, lo, hi, mbits, s_man, s_emin, s_sub, pbits = pw
    bm_f = pbits - emax_e  # MX+'s block max: a fixed-point value with bm_f fraction bits (round_block_max)
    bm_max = math.ldexp(float((1 << (pbits + 1)) - 1), -bm_f) if pbits >= 0 else 0.0
    bm_low = math.ldexp(1.0, emax_e)
    nbr = -(-R // tr)
    nbc = -(-C // tc)
    two_n = math.ldexp(1.0, nbits)
    for b in range(b0, b1):
        start, row0, rows, size = tile_range(b, nbr, nbc, R, C, tr, tc, full)
        if scanned:
            amax = scales[U64(b)]
        else:
            m = U32(0)
            for r in range(rows):
                row = start + r * C
                m = max(m, _amax_bits(bits, row, min(size, bits.size - row)))  # (= size) not a constant: it vectorises
            amax = np.float64(U32(m).view(np.float32))
        tt = t[U64(row0) if t.size > 1 else U64(0)]  # per-row T_r: 1-D blocks only (quantize_sr)
        if rule == AMAX:
            want = min(amax / max_e / tt, s_max)
            s = max(round_nearest_value(want, s_split, s_magic, s_min_normal, s_max, s_max, 0), s_min)
        else:  # a power of two; amax is a float32 value (NaN: the block's NaN, caught below)
            s = _pow2_scale(np.float32(amax).view(U32), rule, emax_e, max_e, mbits, lo, hi, s_man, s_emin, s_sub,
                            s_max, s_min)
        if amax != amax:
            scales[U64(b)] = math.nan
            for r in range(rows):
                for k in range(size):
                    dbits[U64(start + r * C + k)] = NAN32
            continue
        scales[U64(b)] = s
        full_scale = s * tt
        if pbits >= 0:  # MX+: the block max (the first largest |x|), read before dst (which may be src) is written
            bm, top = U64(start), U32(0)
            for r in range(rows):
                for k in range(size):
                    a = bits[U64(start + r * C + k)] & ABS
                    if a > top:
                        bm, top = U64(start + r * C + k), a
            x_bm = np.float64(src[bm])
        for r in range(rows):
            row = start + r * C
            for k in range(size):
                i = U64(row + k)
                rnd = 0.0 if near else _as_float(random_bits(key, i, nbits))
                dst[i] = sr_element(src[i], full_scale, rnd, man, emin, sub, max_e, neg_max, big, negzero, two_n,
                                    near)
        if pbits >= 0 and amax > 0.0:  # round_block_max: codes +-cmax times 2**-f, at least 2**emax_e in magnitude
            q = sr_value(x_bm / full_scale, _as_float(random_bits(key, bm, nbits)), FIXED_E + bm_f, FIXED_E, 1,
                         bm_max, bm_max, math.inf, 1, two_n, near)
            dst[bm] = np.float32((math.copysign(bm_low, q) if abs(q) < bm_low else q) * full_scale)


@njit(inline="always")
def _sr_rows(b0, b1, src, bits, dst, dbits, scales, scanned, R, C, tr, tc, man, emin, sub, max_e, neg_max, big, negzero,
             s_man, s_emin, s_sub, s_max, s_min, t, pw, key, nbits, near):
    s_split = math.ldexp(1.0, 52 - s_man) + 1.0
    s_magic = 1.5 * math.ldexp(1.0, 52 + (s_emin - s_man if s_sub != 0 else s_emin))
    s_min_normal = math.ldexp(1.0, s_emin)
    full = R % tr == 0 and C % tc == 0
    if tc == 16 and full:  # a constant trip count for the element loop
        _sr_blocks(b0, b1, src, bits, dst, dbits, scales, scanned, R, C, tr, I64(16), np.bool_(True), man, emin, sub,
                   max_e, neg_max, big, negzero, s_max, s_min, t, s_split, s_magic, s_min_normal, pw, key, nbits,
                   np.bool_(near))
    elif full:
        _sr_blocks(b0, b1, src, bits, dst, dbits, scales, scanned, R, C, tr, tc, np.bool_(True), man, emin, sub,
                   max_e, neg_max, big, negzero, s_max, s_min, t, s_split, s_magic, s_min_normal, pw, key, nbits,
                   np.bool_(near))
    else:
        _sr_blocks(b0, b1, src, bits, dst, dbits, scales, scanned, R, C, tr, tc, np.bool_(False), man, emin, sub,
                   max_e, neg_max, big, negzero, s_max, s_min, t, s_split, s_magic, s_min_normal, pw, key, nbits,
                   np.bool_(near))


@njit(cache=True, nogil=True)
def sr_range(b0, b1, src, bits, dst, dbits, scales, scanned, R, C, tr, tc, man, emin, sub, max_e, neg_max, big, negzero,
             s_man, s_emin, s_sub, s_max, s_min, t, pw, key, nbits):
    """Stochastic rounding of float32 (P, R, C) data, flat, in (tr, tc) tiles (1-D blocks along the rows: tr = 1)
    with amax or power-of-two scales (module doc), blocks b0..b1-1; src, dst flat float32 with uint32 views bits,
    dbits; scales float64, one per block in (P, nbr, nbc) order (the amaxes already, if ``scanned``); man .. big:
    ``element_of``'s; t: float64, the tensor scale T (one value) or, with tr = 1, each (p, r) row's T_r (one per
    row); pw: ``pow2_of``'s (the scale rule and what a power-of-two rule reads; a tuple, as calls of more than 30
    arguments compile to ``*args`` calls, which numba cannot inline)."""
    _sr_rows(b0, b1, src, bits, dst, dbits, scales, scanned, R, C, tr, tc, man, emin, sub, max_e, neg_max, big,
             negzero, s_man, s_emin, s_sub, s_max, s_min, t, pw, key, nbits, False)


@njit(cache=True, nogil=True)
def nearest_range(b0, b1, src, bits, dst, dbits, scales, scanned, R, C, tr, tc, man, emin, sub, max_e, neg_max, big,
                  negzero, s_man, s_emin, s_sub, s_max, s_min, t, pw, key, nbits):
    """``sr_range`` rounding to nearest, ties to even (the reference's NEAREST branch of ``round_fixed_value`` for
    a fixed element, module doc), for the fixed elements under power-of-two scales that no other float32 path
    takes (MXINT8, MXINT4); key and nbits are not read."""
    _sr_rows(b0, b1, src, bits, dst, dbits, scales, scanned, R, C, tr, tc, man, emin, sub, max_e, neg_max, big,
             negzero, s_man, s_emin, s_sub, s_max, s_min, t, pw, key, nbits, True)


FIXED_E = 2048  # above every exponent of a float64 (<= 1024, inf's field included): a fixed element's emin


def element_of(args: tuple) -> tuple:
    """``sr_element``'s (man, emin, sub, max_e, neg_max, big) for ``block_args``: a float element's own (neg_max =
    max_e, big = 2**(man + 3)), or for a fixed one (f, code_min, code_max) those that make the core
    ``round_fixed_value`` (module doc): (FIXED_E + f, FIXED_E, 1, code_max 2**-f, -code_min 2**-f, inf)."""
    kind, man, emin, sub, emax_e, max_e = args[:6]
    if kind == 0:
        return man, emin, sub, max_e, max_e, math.ldexp(1.0, man + 3)
    return FIXED_E + man, FIXED_E, 1, max_e, math.ldexp(-emin, -man), math.inf


def element_mbits(args: tuple) -> int:
    """``scalar.block.element_mbits`` of ``block_args`` (its Python body, on the host): the element's mantissa bits
    (float), floor(log2 code_max) (fixed), which the ``even`` rule rounds amax to."""
    kind, p0, _, p2 = args[:4]
    return int(scalar_block.element_mbits.py_func(kind, p0, p2))


def pow2_of(args: tuple, pbits: int = -1) -> tuple:
    """``sr_range``'s pw for ``block_args``: (rule, emax_e, lo, hi, ``element_mbits``, s_man, s_emin, s_sub,
    pbits), ints; pbits: MX+'s block-max mantissa bits (``mxplus_args``), -1 for a plain block format."""
    kind, man, emin, sub, emax_e, max_e, negzero, rule, lo, hi, s_man, s_emin, s_sub = args[:13]
    return tuple(int(v) for v in (rule, emax_e, lo, hi, element_mbits(args), s_man, s_emin, s_sub, pbits))


def sr_ok(args: tuple) -> bool:
    """Whether ``sr_*`` holds for ``block_args``: a float element (man >= 1) or a fixed one (kind 1) with
    |f| <= 1022 and code_max 2**-f > 0, a float32 tensor scale t > 0, and either amax scales into a float scale
    format with s_man >= 1 or a power-of-two rule (floor, ceil, even, rceil) with a float32 element max and at
    most 22 element bits for ``even`` (``block_fast._pow2_scale``'s exponent reading); every full scale S * T in
    [2**-900, 2**900]."""
    kind, man, emin, sub, emax_e, max_e, negzero, rule, lo, hi, s_man, s_emin, s_sub, s_max, s_min, t = args
    element = (kind == 0 and man >= 1) or (kind == 1 and -1022 <= man <= 1022 and 0.0 < max_e < math.inf)
    if not (element and 0.0 < t < math.inf and float(np.float32(t)) == t):
        return False
    if rule == AMAX:
        return s_man >= 1 and 0.0 < s_min <= s_max < math.inf and 2.0**-900 <= s_min * t and s_max * t <= 2.0**900
    return (rule in (FLOOR, CEIL, EVEN, RCEIL) and float(np.float32(max_e)) == max_e
            and (rule != EVEN or element_mbits(args) <= 22)
            and -900 <= lo <= hi <= 900 and 2.0**-900 <= math.ldexp(t, lo) and math.ldexp(t, hi) <= 2.0**900)


def rows_ok(args: tuple, t: np.ndarray) -> bool:
    """``sr_ok`` for ``block_args`` without its tensor scale and per-row outer scales t (float64, nonempty, each
    a float32 value, as ``nvfp4_fast.row_scales_range`` makes them): its conditions hold for every T_r, which the
    smallest and largest decide."""
    return sr_ok((*args, float(t.min()))) and sr_ok((*args, float(t.max())))


def quantize_sr(src: np.ndarray, dst: np.ndarray, scales: np.ndarray, tc: int, args: tuple, key: int, nbits: int,
                par: bool, scanned: bool, t_rows: np.ndarray | None = None, tr: int = 1, pbits: int = -1,
                nearest: bool = False) -> None:
    """Run ``sr_*`` on (P, R, C) C-contiguous float32 src/dst in (tr, tc) tiles (``sr_ok(args)`` must hold);
    t_rows: None (the tensor scale of ``args``), or, for 1-D blocks (tr = 1), each (p, r) row's T_r (float64,
    P * R; ``rows_ok``), the last of args then not read; par: blocks spread over threads (``threads.launch``);
    pbits >= 0: MX+ (``mxplus_scalar.mxplus_block``: args a floor-rule format's, ``mxplus_block_args``), each
    block's max then rounded stochastically to its pbits mantissa bits as that core does; nearest: round to
    nearest, ties to even (``nearest_range``)."""
    if t_rows is not None and tr != 1:
        raise ValueError(f"tr={tr}: per-row outer scales (t_rows) need 1-D blocks, tr=1")
    kind, man, emin, sub, emax_e, max_e, negzero, rule, lo, hi, s_man, s_emin, s_sub, s_max, s_min = args[:15]
    t = np.full(1, args[15], np.float64) if t_rows is None else t_rows
    flat, out = src.reshape(-1), dst.reshape(-1)
    sc = scales.reshape(-1)
    threads.launch(nearest_range if nearest else sr_range, sc.size, flat, flat.view(np.uint32), out,
                   out.view(np.uint32), sc, scanned, src.shape[1], src.shape[2], tr, tc, *element_of(args), negzero,
                   s_man, s_emin, s_sub, s_max, s_min, t, pow2_of(args, pbits), np.uint64(key), nbits, parallel=par)


def mxplus_block_args(args: tuple) -> tuple:
    """``block_args`` of the plain MX format under an MX+ one (``mxplus_args``: its float element, the floor rule
    into 2**lo..2**hi, no tensor scale), for ``sr_ok`` and ``quantize_sr(pbits=...)``; the scale format's own
    fields are not read by a power-of-two rule."""
    man, emin, sub, emax_e, max_e, negzero, lo, hi = args[:8]
    return (0, man, emin, sub, emax_e, max_e, negzero, FLOOR, lo, hi, 0, lo, 0, math.ldexp(1.0, hi),
            math.ldexp(1.0, lo), 1.0)
