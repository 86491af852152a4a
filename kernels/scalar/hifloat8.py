"""HiFloat8 rounding cores (``emunum.formats.hifloat8``): the float cores with the exponent-dependent mantissa.

x in the binade e (2**e <= |x| < 2**(e+1)) rounds among the values of that binade and 2**(e+1): the grid of a
float with ``hif8_man(e)`` fraction bits, smallest normal exponent -22 and subnormals (below 2**-22 the
multiples of 2**-22), largest finite value 2**15. So ``round_float_bits`` / ``round_f32_fast`` with
man = hif8_man(e), emin = -22 round HiF8 exactly, the code parity of ``odd`` included (with man = 0 they take
the biased exponent's parity, e + 23, which is the denormal code's M). ``nearest`` is HiF8's ties-away rule.
``nearest_ta_f32`` is round to nearest, ties away, on float32 bits in uint32 lanes, for the vectorised loops.
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
def nearest_ta_f32(u, big):
    """Round to nearest, ties away, of the float32 bits u (uint32) to HiF8: the result's bits. ``big``: the bits
    an overflow becomes (inf, or max when saturating; an infinite input too). Adding half of the quantum
    2**(23 - man) units and clearing below it is ties-away rounding; a carry is the next binade's encoding.
    Below 2**-22 the result is 2**-22 from 2**-23 on (ties away), else +0. NaN comes back quietened."""
    a = U32(u & U32(0x7FFFFFFF))
    e = np.int32(a >> U32(23)) - np.int32(127)
    ae = abs(e)
    s = U32(23) - U32(U32(ae <= 3) + U32(ae <= 7) + U32(ae <= 15))
    half = U32(1) << (s - U32(1))
    r = U32(U32(a + half) & ~U32(U32(half << U32(1)) - U32(1)))
    tiny = U32(0x34800000) if a >= U32(0x34000000) else U32(0)
    r = tiny if a < U32(0x34800000) else r
    r = big if r > U32(MAX_BITS32) else r
    out = U32(r | U32(u & U32(0x80000000))) if r != U32(0) else U32(0)
    return U32(u | U32(0x400000)) if a > U32(0x7F800000) else out
