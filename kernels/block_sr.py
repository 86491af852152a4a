"""Float32 fast path of the block kernel (kernels/block_cpu.py) for stochastic rounding: float32 data, 1-D blocks
along the last axis, a float or fixed-point element, amax scales (NVFP4's and NVINT4's gradients). The same bits
as ``block_cpu._one_block``'s stochastic branch, which rounds x / F (F = S * T, in float64) by
``round_element`` (``round_float_value_sat``, or ``round_fixed_value`` saturating) with the bits
``random_bits(key, flat index, nbits)`` and stores float32(q * F); tests/kernels/test_block_sr.py compares
the two bit for bit.

A fixed element (kind 1: codes code_min..code_max times 2**-f, e.g. NVINT4's int4) runs
``round_fixed_value``'s own steps for saturation and STOCHASTIC (``sr_fixed_element``), with its powers of two
2**f and 2**-f computed once per call instead of per element: the same float64 operations on the same values,
so the same bits for any f and code range, and written with selects, so they vectorise as they are. Which core
a block runs is a per-block branch on ``kind`` (a runtime argument: one compiled variant for both).

The float element loop is that core with its two calls that do not vectorise replaced by equal expressions,
so that LLVM runs it in vector lanes:
- the exponent of |v| (``frexp``) is read off the float64 bits. That is frexp's exponent minus one for a normal
  v, and v is normal or zero or infinite: |x| lies in [2**-149, 2**128] for a nonzero finite float32 x, and
  F in [2**-900, 2**900] (``sr_ok``), so 0 < |x / F| < 2**1029 is normal unless x / F overflows (to inf, as
  the reference's quotient does);
- the powers of two 2**-qe and 2**qe (``ldexp``) are built from their bits: |qe| <= 1030 - man stays inside
  float64's normal exponents for every normal v (for inf and 0 the value is replaced by a select).
The block scale is computed as the nearest-rounding amax path (``block_fast._table_blocks``) computes it, from
each block's largest |x| (``block_amaxes``'s, when ``scanned``).
"""
import math

import numpy as np
from numba import njit, prange

from . import _cache, block_fast, scalar
from .block_fast import NAN32, U32, U64, _amax_bits, _row_range
from .scalar.common import _floor, _is_odd, random_bits
from .scalar.float import round_nearest_value

_cache.guard(__file__, [*scalar.SOURCES, block_fast.__file__])

I64 = np.int64


@njit(inline="always")
def _pow2(e):
    """2.0**e for an int64 e in [-1022, 1023], from its bits."""
    return I64((e + 1023) << 52).view(np.float64)


@njit(inline="always")
def sr_element(x, full, rnd, man, emin, sub, max_e, negzero, two_n):
    """float32(round_float_value_sat(x / full, ..., STOCHASTIC, rnd, nbits) * full) for a float32 x that is not
    NaN (two_n = 2.0**nbits), by the reference's steps (module doc)."""
    v = np.float64(x) / full
    a = abs(v)
    e = I64((np.float64(a).view(U64) >> U64(52)) & U64(0x7FF)) - 1023
    qe = e - man if e >= emin else (emin - man if sub != 0 else emin)
    qe = min(max(qe, -1022), 1022)  # only for v = 0 or inf, whose result is a select below
    y = a * _pow2(-qe)  # exact: a power of two times a normal v, the result normal
    k = _floor(y)
    r = y - k
    d = r * two_n
    f = _floor(d)
    dd = d - f
    f = f + (1.0 if (dd > 0.5) | ((dd == 0.5) & _is_odd(f)) else 0.0)
    k = k + (1.0 if f + rnd >= two_n else 0.0)
    big = float(I64(1) << (man + 3))
    q = min(min(k, big) * _pow2(qe), max_e)
    q = max_e if a == math.inf else q
    q = math.copysign(q, v)
    zero = math.copysign(0.0, v) if negzero != 0 else 0.0
    q = zero if q == 0.0 else q
    return np.float32(q * full)


@njit(inline="always")
def sr_fixed_element(x, full, rnd, up, down, lo, hi, two_n):
    """float32(round_fixed_value(x / full, f, code_min, code_max, 1, STOCHASTIC, rnd, nbits) * full) for a float32
    x that is not NaN (up = 2.0**f, down = 2.0**-f, lo = code_min, hi = code_max, two_n = 2.0**nbits): its steps."""
    v = np.float64(x) / full
    y = v * up
    neg = v < 0.0
    a = abs(y)
    k = _floor(a)
    r = a - k
    r = 5e-324 if (a == 0.0) & (v != 0.0) else r  # a remainder lost to underflow (f < 0) is not 0
    d = r * two_n
    f = _floor(d)
    dd = d - f
    f = f + (1.0 if (dd > 0.5) | ((dd == 0.5) & _is_odd(f)) else 0.0)
    k = k + (1.0 if f + rnd >= two_n else 0.0)
    q = (0.0 - k if neg else k) + 0.0
    q = min(max(q, lo), hi)
    q = (hi if y > 0.0 else lo) if a == math.inf else q
    return np.float32(q * down * full)


@njit(inline="always")
def _sr_blocks(src, bits, dst, dbits, scales, scanned, C, tc, tiled, kind, man, emin, sub, max_e, negzero, up, down,
               lo, hi, s_max, s_min, t, s_split, s_magic, s_min_normal, key, nbits):
    nb = scales.size
    nbc = nb // (bits.size // C)
    two_n = math.ldexp(1.0, nbits)
    for b in prange(nb):
        start, size = _row_range(b, nbc, tc, C, tiled)
        if scanned:
            amax = scales[U64(b)]
        else:
            amax = np.float64(U32(_amax_bits(bits, start, min(size, bits.size - start))).view(np.float32))
        want = min(amax / max_e / t, s_max)
        s = max(round_nearest_value(want, s_split, s_magic, s_min_normal, s_max, s_max, 0), s_min)
        if amax != amax:
            scales[U64(b)] = math.nan
            for k in range(size):
                dbits[U64(start + k)] = NAN32
            continue
        scales[U64(b)] = s
        full = s * t
        if kind == 0:
            for k in range(size):
                i = U64(start + k)
                rnd = np.float64(random_bits(key, i, nbits))
                dst[i] = sr_element(src[i], full, rnd, man, emin, sub, max_e, negzero, two_n)
        else:
            for k in range(size):
                i = U64(start + k)
                rnd = np.float64(random_bits(key, i, nbits))
                dst[i] = sr_fixed_element(src[i], full, rnd, up, down, lo, hi, two_n)


@njit(inline="always")
def _sr_rows(src, bits, dst, dbits, scales, scanned, C, tc, kind, man, emin, sub, max_e, negzero, s_man, s_emin, s_sub,
             s_max, s_min, t, key, nbits):
    s_split = math.ldexp(1.0, 52 - s_man) + 1.0
    s_magic = 1.5 * math.ldexp(1.0, 52 + (s_emin - s_man if s_sub != 0 else s_emin))
    s_min_normal = math.ldexp(1.0, s_emin)
    up, down = math.ldexp(1.0, man), math.ldexp(1.0, -man)  # a fixed element's 2**f and 2**-f (man = f)
    lo, hi = float(emin), float(sub)  # and its code_min, code_max
    if tc == 16 and C % 16 == 0:  # a constant trip count for the element loop
        _sr_blocks(src, bits, dst, dbits, scales, scanned, C, 16, True, kind, man, emin, sub, max_e, negzero, up,
                   down, lo, hi, s_max, s_min, t, s_split, s_magic, s_min_normal, key, nbits)
    elif C % tc == 0:
        _sr_blocks(src, bits, dst, dbits, scales, scanned, C, tc, True, kind, man, emin, sub, max_e, negzero, up,
                   down, lo, hi, s_max, s_min, t, s_split, s_magic, s_min_normal, key, nbits)
    else:
        _sr_blocks(src, bits, dst, dbits, scales, scanned, C, tc, False, kind, man, emin, sub, max_e, negzero, up,
                   down, lo, hi, s_max, s_min, t, s_split, s_magic, s_min_normal, key, nbits)


@njit(cache=True)
def sr_serial(src, bits, dst, dbits, scales, scanned, C, tc, kind, man, emin, sub, max_e, negzero, s_man, s_emin,
              s_sub, s_max, s_min, t, key, nbits):
    """Stochastic rounding of float32 rows of C in 1-D blocks of tc with amax scales (module doc); src, dst flat
    float32 with uint32 views bits, dbits; scales float64, one per block (the amaxes already, if ``scanned``);
    kind, man, emin, sub: ``block_args``'s element (a fixed one's f, code_min, code_max for kind 1)."""
    _sr_rows(src, bits, dst, dbits, scales, scanned, C, tc, kind, man, emin, sub, max_e, negzero, s_man, s_emin,
             s_sub, s_max, s_min, t, key, nbits)


@njit(cache=True, parallel=True)
def sr_parallel(src, bits, dst, dbits, scales, scanned, C, tc, kind, man, emin, sub, max_e, negzero, s_man, s_emin,
                s_sub, s_max, s_min, t, key, nbits):
    """``sr_serial``, parallel over blocks."""
    _sr_rows(src, bits, dst, dbits, scales, scanned, C, tc, kind, man, emin, sub, max_e, negzero, s_man, s_emin,
             s_sub, s_max, s_min, t, key, nbits)


def sr_ok(args: tuple) -> bool:
    """Whether ``sr_*`` holds for ``block_args``: a float element (man >= 1) or a fixed one with code_max >= 1,
    amax scales into a float scale format with s_man >= 1, a float32 tensor scale t > 0, and every full scale
    S * T in [2**-900, 2**900]."""
    kind, man, emin, sub, emax_e, max_e, negzero, rule, lo, hi, s_man, s_emin, s_sub, s_max, s_min, t = args
    element = (kind == 0 and man >= 1) or (kind == 1 and sub >= 1 and 0.0 < max_e < math.inf)
    return (element and rule == 1 and s_man >= 1 and 0.0 < t < math.inf
            and float(np.float32(t)) == t and 0.0 < s_min <= s_max < math.inf
            and 2.0**-900 <= s_min * t and s_max * t <= 2.0**900)


def quantize_sr(src: np.ndarray, dst: np.ndarray, scales: np.ndarray, tc: int, args: tuple, key: int, nbits: int,
                par: bool, scanned: bool) -> None:
    """Run ``sr_*`` on (P, R, C) C-contiguous float32 src/dst (``sr_ok(args)`` must hold)."""
    kind, man, emin, sub, emax_e, max_e, negzero, rule, lo, hi, s_man, s_emin, s_sub, s_max, s_min, t = args
    flat, out = src.reshape(-1), dst.reshape(-1)
    run = sr_parallel if par else sr_serial
    run(flat, flat.view(np.uint32), out, out.view(np.uint32), scales.reshape(-1), scanned, src.shape[2], tc, kind,
        man, emin, sub, max_e, negzero, s_man, s_emin, s_sub, s_max, s_min, t, np.uint64(key), nbits)
