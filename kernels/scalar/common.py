"""Shared pieces of the scalar cores: mode and overflow codes, the counter-based random bits, and the
rounding decisions every number system's core makes.

Codes (mirrors of ``emunum.formats``; this layer does not import emunum):
  mode      0 nearest-even, 1 nearest-away, 2 toward zero, 3 up, 4 down, 5 odd, 6 stochastic
  overflow  0 -> inf, 1 -> NaN, 2 -> saturate to max
"""
import numpy as np
from numba import njit

U64 = np.uint64
ONE = np.uint64(1)
ZERO = np.uint64(0)

NEAREST, NEAREST_AWAY, TOWARD_ZERO, UP, DOWN, ODD, STOCHASTIC = 0, 1, 2, 3, 4, 5, 6
OVF_INF, OVF_NAN, OVF_SAT = 0, 1, 2

GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit
def mix64(z):
    """splitmix64's finaliser: a bijective 64-bit mix."""
    z = (z ^ (z >> U64(30))) * U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> U64(27))) * U64(0x94D049BB133111EB)
    return z ^ (z >> U64(31))


@njit(inline="always")
def random_bits(key, index, nbits):
    """``nbits`` (1..32) uniform bits for element ``index``: the splitmix64 output at counter ``index``.

    ``key`` is the uint64 seed key (``mix64(seed)``); the result depends only on (key, index, nbits).
    """
    z = mix64(U64(key) + (U64(index) + ONE) * GOLDEN)
    return z >> U64(64 - nbits)


@njit
def round_up_decision(rem, half, lsb, sign, mode):
    """Whether a magnitude with dropped part ``rem`` (half = 1/2 ulp) rounds away from zero.

    Non-stochastic modes; all arguments are uint64 (sign 0/1, lsb = last kept bit).
    """
    if mode == NEAREST:
        return rem > half or (rem == half and lsb == ONE)
    if mode == NEAREST_AWAY:
        return rem >= half
    if mode == UP:
        return rem != ZERO and sign == ZERO
    if mode == DOWN:
        return rem != ZERO and sign == ONE
    if mode == ODD:
        return rem != ZERO and lsb == ZERO
    return False  # toward zero


@njit
def stochastic_decision(rem, shift, rnd, nbits):
    """Round away iff rem/2**shift, rounded to ``nbits`` bits (ties to even), plus rnd/2**nbits >= 1.

    This is gfloat's ``RoundMode.Stochastic`` with ``srnumbits=nbits``: P(away) = frac to nbits bits.
    """
    if shift <= nbits:
        drnd = rem << U64(nbits - shift)
    else:
        d = shift - nbits
        if d >= 63:
            drnd = ZERO
        else:
            q = rem >> U64(d)
            r = rem & ((ONE << U64(d)) - ONE)
            h = ONE << U64(d - 1)
            drnd = q + U64(1 if (r > h or (r == h and (q & ONE) == ONE)) else 0)
    return drnd + U64(rnd) >= (ONE << U64(nbits))


@njit
def _msb(v):
    """Index of the highest set bit of v > 0."""
    n = 0
    while v > ONE:
        v >>= ONE
        n += 1
    return n


@njit
def _floor(x):
    """floor of a float64 as a float64, for CPU and CUDA alike (numba-cuda has no np.floor, and numba's
    math.floor returns an int64)."""
    if not abs(x) < 4503599627370496.0:  # 2**52 and beyond (inf, NaN too) are integers already
        return x
    t = float(np.int64(x))  # truncation toward zero
    return t - 1.0 if t > x else t


@njit
def _is_odd(k):
    return k - 2.0 * _floor(k * 0.5) == 1.0
