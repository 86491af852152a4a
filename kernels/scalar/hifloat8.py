"""HiFloat8 rounding cores (``emunum.formats.hifloat8``): the float cores with the exponent-dependent mantissa.

x in the binade e (2**e <= |x| < 2**(e+1)) rounds among the values of that binade and 2**(e+1): the grid of a
float with ``hif8_man(e)`` fraction bits, smallest normal exponent -22 and subnormals (below 2**-22 the
multiples of 2**-22), largest finite value 2**15. So ``round_float_bits`` / ``round_f32_fast`` with
man = hif8_man(e), emin = -22 round HiF8 exactly, the code parity of ``odd`` included (with man = 0 they take
the biased exponent's parity, e + 23, which is the denormal code's M). ``nearest`` is HiF8's ties-away rule.
``nearest_ta_f32`` and ``sr_f32`` are round to nearest (ties away) and stochastic rounding of float32 bits on
32-bit lanes (float32 and uint32 arithmetic), for the vectorised loops; each gives ``round_hif8_f32``'s bits.
"""
import numpy as np
from numba import njit

from .common import NEAREST, NEAREST_AWAY
from .float import round_f32_fast, round_float_bits

HIF8_EMIN = -22
MAX_BITS32 = 0x47000000  # 2**15 as float32
MAX_BITS64 = (1023 + 15) << 52  # 2**15 as float64
U32 = np.uint32


@njit(inline="always")
def hif8_man(e):
    """Fraction bits of the binade e: 3 for |e| <= 3, 2 for |e| <= 7, 1 for |e| <= 15, else 0."""
    a = abs(e)
    return np.int64(a <= 3) + np.int64(a <= 7) + np.int64(a <= 15)


@njit(inline="always")
def hif8_mode(mode):
    """HiF8's nearest is ties away (the paper's TA): both nearest codes take that rule."""
    return NEAREST_AWAY if mode == NEAREST else mode


@njit(inline="always")
def round_hif8_bits(u, sign_pos, in_man, in_bias, max_bits, overflow, mode, rnd, nbits):
    """Round the binary32 (31, 23, 127; max_bits ``MAX_BITS32``) or binary64 (63, 52, 1023; ``MAX_BITS64``)
    value with bits u to HiF8: the result's bits in the same encoding (``round_float_bits``'s conventions;
    overflow 0 inf / 2 saturate)."""
    e = np.int64((np.uint64(u) >> np.uint64(in_man)) & np.uint64((1 << (sign_pos - in_man)) - 1)) - in_bias
    return round_float_bits(u, sign_pos, in_man, in_bias, hif8_man(e), HIF8_EMIN, 1, max_bits, overflow, 0,
                            hif8_mode(mode), rnd, nbits)


@njit(inline="always")
def round_hif8_f32(u, overflow, mode, rnd, nbits):
    """``round_hif8_bits`` for binary32 bits, branch-free (``round_f32_fast``; int64 result)."""
    e = ((np.int64(u) >> 23) & 0xFF) - 127
    return round_f32_fast(u, hif8_man(e), HIF8_EMIN, 1, MAX_BITS32, overflow, 0, hif8_mode(mode), rnd, nbits)


@njit(inline="always")
def _classes(a):
    """(|e| <= 3, |e| <= 7, |e| <= 15) for the binade e of the float32 magnitude bits a (man = 3, 2, 1 or 0):
    lo <= a < hi as one unsigned compare of a - lo, 32-bit throughout (numba widens signed int32 arithmetic, and
    shifts, to 64 bits, which halves the vector lanes; callers select constants rather than shift by 23 - man)."""
    c3 = U32(a - U32(124 << 23)) < U32(7 << 23)  # biased exponents 124..130
    c7 = U32(a - U32(120 << 23)) < U32(15 << 23)  # 120..134
    c15 = U32(a - U32(112 << 23)) < U32(31 << 23)  # 112..142
    return c3, c7, c15


@njit(inline="always")
def _finish(u, a, r, big):
    """Overflow past 2**15 -> big, x's sign back on (not on a zero), an input NaN quietened."""
    r = big if r > U32(MAX_BITS32) else r
    out = U32(r | U32(u & U32(0x80000000))) if r != U32(0) else U32(0)
    return U32(u | U32(0x400000)) if a > U32(0x7F800000) else out


@njit(inline="always")
def nearest_ta_f32(u, big):
    """Round to nearest, ties away, of the float32 bits u (uint32) to HiF8: the result's bits. ``big``: the bits
    an overflow becomes (inf, or max when saturating; an infinite input too). Float32 arithmetic with a magic
    number: for x in the binade e (|x| >= 2**-22) with quantum q = 2**(e - man), man = ``hif8_man(e)``, and
    M = 1.5 * 2**(e + 23 - man), x + M lies in M's binade (|x| < 2**(e + 1) < M / 2**19), whose step is q, so
    (x + M) - M is x rounded to a multiple of q, ties to even, signs symmetric, a carry into 2**(e + 1) included;
    below 2**-22, M = 3 = 1.5 * 2**(-22 + 23) gives the multiples of 2**-22 (0 or 2**-22), a zero as +0. Ties go
    away instead because x's last bit is set first: a tie has at least 19 zero bits below q / 2, so the bit puts
    it just above the midpoint, and it moves no other x across one (a midpoint minus one unit already has that
    bit). M's exponent field is max(e_field, 105) + 20 + (3 - man), with 3 - man = clamp(floor(log2 |e|) - 1, 0,
    3) read off float32(clamp(|e|, 2, 16))'s exponent field; |e| comes off the larger of a and 0x7F7FFFFF - a,
    which maps the binade e onto -e. From 40960 (the midpoint of max and 1.5 * 2**15) on the result is ``big``,
    x's sign on; NaN comes back quietened. Subnormal inputs give +0 and no step makes a subnormal, so flushing
    them (FTZ/DAZ) changes nothing. Each step stays on 32-bit lanes (``_classes``)."""
    a = U32(u & U32(0x7FFFFFFF))
    d = max(a, U32(U32(0x7F7FFFFF) - a))  # exponent field 127 + |e| (a < inf; other lanes are overridden)
    v = U32(min(max(U32(d >> U32(23)), U32(129)), U32(143)) - U32(127))  # clamp(|e|, 2, 16)
    n = U32(np.float32(np.int32(v)).view(U32) & U32(0x7F800000))  # (127 + floor(log2 v)) << 23 = (128 + 3 - man) << 23
    m = U32(U32(max(a, U32(0x34800000)) & U32(0x7F800000)) + U32(n - U32((108 << 23) - 0x400000)))
    mf = m.view(np.float32)
    r = np.float32(np.float32(U32(u | U32(1)).view(np.float32) + mf) - mf).view(U32)
    r = U32(big | U32(u & U32(0x80000000))) if a >= U32(0x47200000) else r
    return U32(u | U32(0x400000)) if a > U32(0x7F800000) else r


@njit(inline="always")
def sr_f32(u, rnd, w, pn, two_n, big):
    """Stochastic rounding of the float32 bits u (uint32) with the random word rnd (< 2**nbits, uint32), for
    23 <= nbits <= 32 (w = rnd * 2**(32 - nbits), rnd in the top bits of a uint32; pn = 2**nbits as float32,
    two_n = 2**nbits mod 2**32): ``round_float_bits``'s rule, up iff rem / 2**s, to nbits bits, plus
    rnd / 2**nbits reaches 1, s = 23 - man. From 2**-22 on rem / 2**s has s <= nbits bits, so up iff
    rem + (rnd >> (nbits - s)) >= 2**s: adding that (as w >> (32 - s)) and clearing below 2**s is the rounding.
    Below 2**-22 the quantum is 2**-22: t = |x| * 2**22 < 1 and t * 2**nbits are exact float32 products, rounded
    to an integer d (ties to even; exact from 2**23 on), and up iff rnd >= 2**nbits - d (d > 0) gives 2**-22.
    ``big``, NaN and signs as ``nearest_ta_f32``."""
    a = U32(u & U32(0x7FFFFFFF))
    c3, c7, c15 = _classes(a)
    add = U32(w >> 12) if c3 else (U32(w >> 11) if c7 else (U32(w >> 10) if c15 else U32(w >> 9)))
    keep = U32(0xFFF00000) if c3 else (U32(0xFFE00000) if c7 else (U32(0xFFC00000) if c15 else U32(0xFF800000)))
    r = U32(U32(a + add) & keep)
    tiny = U32(min(a, U32(0x34800000)))  # the lanes that use f; others kept finite (no float -> int overflow)
    f = (tiny.view(np.float32) * np.float32(4194304.0)) * pn
    big_f = np.float32(8388608.0)
    d = U32(f if f >= big_f else np.float32((f + big_f) - big_f))
    up = (d != U32(0)) & (rnd >= U32(two_n - d))
    lo = U32(0x34800000) if up else U32(0)
    return _finish(u, a, lo if a < U32(0x34800000) else r, big)
