"""HiFloat8 rounding cores (``emunum.formats.hifloat8``): the float cores with the exponent-dependent mantissa.

x in the binade e (2**e <= |x| < 2**(e+1)) rounds among the values of that binade and 2**(e+1): the grid of a
float with ``hif8_man(e)`` fraction bits, smallest normal exponent -22 and subnormals (below 2**-22 the
multiples of 2**-22), largest finite value 2**15. So ``round_float_bits`` / ``round_f32_fast`` with
man = hif8_man(e), emin = -22 round HiF8 exactly, the code parity of ``odd`` included (with man = 0 they take
the biased exponent's parity, e + 23, which is the denormal code's M). ``nearest`` is HiF8's ties-away rule.
``nearest_ta_f32`` and ``sr_f32`` are round to nearest (ties away) and stochastic rounding on float32 bits in
uint32 lanes, for the vectorised loops; each gives ``round_hif8_f32``'s bits.
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
    an overflow becomes (inf, or max when saturating; an infinite input too). Adding half the quantum
    (2**(22 - man) units of u's last place) and clearing below the quantum is ties-away rounding; a carry is the
    next binade's encoding. Below 2**-22 the result is 2**-22 from 2**-23 on (ties away), else +0; from 40960
    (the midpoint of max and 1.5 * 2**15) on it is ``big``. NaN comes back quietened."""
    a = U32(u & U32(0x7FFFFFFF))
    sign = U32(u & U32(0x80000000))
    c3, c7, c15 = _classes(a)
    half = U32(0x80000) if c3 else (U32(0x100000) if c7 else (U32(0x200000) if c15 else U32(0x400000)))
    r = U32(U32(U32(a + half) & U32(U32(0) - U32(half + half))) | sign)  # -(2 half) = ~(quantum - 1)
    r = (U32(0x34800000 | sign) if a >= U32(0x34000000) else U32(0)) if a < U32(0x34800000) else r
    return (U32(u | U32(0x400000)) if a > U32(0x7F800000) else U32(big | sign)) if a >= U32(0x47200000) else r


@njit(inline="always")
def sr_f32(u, rnd, pw, pn, two_n, big):
    """Stochastic rounding of the float32 bits u (uint32) with the random word rnd (< 2**nbits, uint32), for
    23 <= nbits <= 32 (pw = 2**(32 - nbits) as uint32, pn = 2**nbits as float32, two_n = 2**nbits mod 2**32):
    ``round_float_bits``'s rule, up iff rem / 2**s, to nbits bits, plus rnd / 2**nbits reaches 1, s = 23 - man.
    From 2**-22 on rem / 2**s has s <= nbits bits, so up iff rem + (rnd >> (nbits - s)) >= 2**s: adding that
    (as (rnd * pw) >> (32 - s)) and clearing below 2**s is the rounding. Below 2**-22 the quantum is 2**-22:
    t = |x| * 2**22 < 1 and t * 2**nbits are exact float32 products, rounded to an integer d (ties to even; exact
    from 2**23 on), and up iff rnd >= 2**nbits - d (d > 0) gives 2**-22. ``big``, NaN and signs as
    ``nearest_ta_f32``."""
    a = U32(u & U32(0x7FFFFFFF))
    c3, c7, c15 = _classes(a)
    w = U32(rnd * pw)
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
