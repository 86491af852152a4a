"""Posit rounding core (``PositFormat``): float64 value -> the value of the rounded posit, on integer patterns.

The value's posit pattern (regime, ``es`` exponent bits, the float64's 52 fraction bits) is built as an int64
and cut to ``nbits - 1`` magnitude bits; the dropped bits decide the rounding as for floats (nearest rounds
the pattern, ties to even: the Posit Standard 2022). Semantics (modes, 0 and max, NaR) are those of
``emunum.formats.posit``; ``PositFormat.encode`` is an independent Python-int implementation of the same.
"""
import math

import numpy as np
from numba import njit

from .common import DOWN, NEAREST, NEAREST_AWAY, ODD, STOCHASTIC, TOWARD_ZERO, UP, _floor, _is_odd

I64 = np.int64


@njit(inline="always")
def _msb32(v):
    """Index of the highest set bit of 0 < v < 2**32 (int64), by binary search."""
    n = 0
    if v >= 65536:
        v >>= 16
        n += 16
    if v >= 256:
        v >>= 8
        n += 8
    if v >= 16:
        v >>= 4
        n += 4
    if v >= 4:
        v >>= 2
        n += 2
    if v >= 2:
        n += 1
    return n


@njit(inline="always")
def posit_pattern_value(p, nbits, es):
    """The value (float64, exact) of the positive posit pattern p, 1 <= p < 2**(nbits-1)."""
    n1 = nbits - 1
    top = (p >> (n1 - 1)) & 1
    if top == 1:  # r = the run of ones from bit n1-1 down: the zeros of ~p there
        inv = ~p & ((I64(1) << n1) - 1)
        r = n1 if inv == 0 else n1 - 1 - _msb32(inv)
    else:
        r = n1 - 1 - _msb32(p)
    k = r - 1 if top == 1 else -r
    rest_len = n1 - r - 1
    if rest_len < 0:
        rest_len = 0
    rest = p & ((I64(1) << rest_len) - 1)
    if rest_len >= es:
        fb = rest_len - es
        e = rest >> fb
        frac = rest & ((I64(1) << fb) - 1)
    else:
        fb = 0
        e = rest << (es - rest_len)
        frac = I64(0)
    return math.ldexp(float((I64(1) << fb) + frac), np.int32(k * (1 << es) + e - fb))


@njit(inline="always")
def _stochastic_up(ratio, rnd, nbits):
    """Up iff ratio (in [0, 1)) rounded to ``nbits`` bits (ties to even) plus rnd/2**nbits >= 1."""
    d = ratio * math.ldexp(1.0, nbits)
    f = _floor(d)
    dd = d - f
    f = f + (1.0 if (dd > 0.5) | ((dd == 0.5) & _is_odd(f)) else 0.0)
    return f + float(rnd) >= math.ldexp(1.0, nbits)


@njit(inline="always")
def round_posit_pattern(a, neg, nbits, es, mode, rnd, srbits):
    """The magnitude pattern (int64, 0 .. 2**(nbits-1)-1) of the finite magnitude a > 0, rounded."""
    maxp = (I64(1) << (nbits - 1)) - 1
    max_exp = (I64(1) << es) * (nbits - 2)
    f, e = math.frexp(a)
    big_e = I64(e) - 1
    if big_e >= max_exp:
        return maxp
    if big_e < -max_exp:  # between 0 and minpos: neighbours 0 and pattern 1
        if mode == TOWARD_ZERO:
            up = False
        elif mode == UP:
            up = not neg
        elif mode == DOWN:
            up = neg
        elif mode == STOCHASTIC:
            up = _stochastic_up(a / math.ldexp(1.0, np.int32(-max_exp)), rnd, srbits)
        else:
            up = True  # nearest, nearest_away (never to zero), odd
        return I64(1) if up else I64(0)
    sig = I64(f * 9007199254740992.0) - (I64(1) << 52)  # the 52 fraction bits
    k = big_e >> es
    e_field = big_e - (k << es)
    if k >= 0:
        regime = ((I64(1) << (k + 1)) - 1) << 1
        rlen = k + 2
    else:
        regime = I64(1)
        rlen = 1 - k
    keep_tail = nbits - 1 - rlen  # tail bits kept after the regime (>= 0)
    drop = es + 52 - keep_tail  # tail bits dropped (>= 23)
    tail = (e_field << 52) | sig
    kept = (regime << keep_tail) | (tail >> drop)
    rem = tail & ((I64(1) << drop) - 1)
    if rem == 0:
        return kept
    half = I64(1) << (drop - 1)
    odd = (kept & 1) == 1
    if mode == NEAREST:
        up = (rem > half) | ((rem == half) & odd)
    elif mode == NEAREST_AWAY:
        up = rem >= half
    elif mode == UP:
        up = not neg
    elif mode == DOWN:
        up = neg
    elif mode == ODD:
        up = not odd
    elif mode == STOCHASTIC:
        if keep_tail >= es:  # the cut is in the fraction: hi - lo is 2**drop units of a's last bit (drop <= 52)
            ratio = float(rem) / float(I64(1) << drop)
        else:  # the cut is in the exponent or regime: hi/lo is a power of two > 2
            lo = posit_pattern_value(kept, nbits, es)
            hi = posit_pattern_value(kept + 1, nbits, es)
            ratio = (a - lo) / (hi - lo)  # both differences are exact
        up = _stochastic_up(ratio, rnd, srbits)
    else:
        up = False
    return kept + (1 if up else 0)


@njit(inline="always")
def round_posit_value(x, nbits, es, mode, rnd, srbits):
    """Round one float64 to the posit format (nbits, es); returns the posit's value as a float64.

    NaN comes back as x itself (payload kept); ±inf gives NaN (NaR); zero is +0.
    """
    if x != x:
        return x
    if x == 0.0:
        return 0.0
    a = abs(x)
    if a == math.inf:
        return math.nan
    neg = x < 0.0
    p = round_posit_pattern(a, neg, nbits, es, mode, rnd, srbits)
    if p == 0:
        return 0.0
    v = posit_pattern_value(p, nbits, es)
    return -v if neg else v
