"""Logarithmic-number rounding core (``LogFormat``): float64 x -> the float64 value of its rounded code.

The table array (``LogFormat.to_kernel_args``, F = 2**frac_bits): entries [0, 2F) hold RD(2**(j/2F)) (entry
0 is 1.0), entries [2F, 3F) RN(2**(m/F)). For x = s * 2**e with s in [1, 2), the half-step count
H = floor(2F * log2 x) = 2F*e + max{j : s >= 2**(j/2F)} is exact: 2**(j/2F) is irrational for 0 < j < 2F,
so s >= 2**(j/2F) exactly when s > RD(2**(j/2F)). Then floor(F * log2 x) = H >> 1, and x lies above the
log-domain midpoint of its two neighbours exactly when H is odd.
"""
import math

import numpy as np
from numba import njit

from .common import DOWN, NEAREST, NEAREST_AWAY, ODD, TOWARD_ZERO, UP
from .table import stochastic_up


@njit(inline="always")
def round_log_value(x, tab, frac_bits, kmin, kmax, signed, snap32, mode, rnd, nbits):
    """Round a float64 x to a LogFormat (semantics in ``LogFormat``'s docstring); returns a float64.

    snap32 != 0 (float32 tensors): x equal to float32(V(k)), the value a float32 tensor holds for code k, is
    exact too, so that rounding a float32 tensor twice changes nothing."""
    if x != x:
        return x
    neg = x < 0.0
    if (neg and signed == 0) or x == 0.0:
        return 0.0
    a = abs(x)
    F = 1 << frac_bits
    F2 = 2 * F
    if a == math.inf:
        kr = kmax
    else:
        fm, e2 = math.frexp(a)
        s = fm * 2.0
        lo = 0  # branch-free binary search: the largest lo with lo == 0 or s > tab[lo], lo < 2F
        length = F2
        while length > 1:
            half = length >> 1
            lo = lo + half if s > tab[lo + half] else lo
            length -= half
        H = F2 * (e2 - 1) + lo
        kf = H >> 1
        half = H & 1
        exact = s == 1.0
        if kf < kmin - 1:  # below zero's code point: nearest and down give zero, up gives min
            kf = kmin - 1
            half = 0
            exact = False
        # a code's value V(k) is the float64 nearest 2**(k/F); no other double lies between the two, so x is
        # one of the format's values exactly when it equals V(kf) or V(kf+1)
        if kmin <= kf + 1 and kf + 1 <= kmax:
            v1 = math.ldexp(tab[F2 + ((kf + 1) & (F - 1))], int((kf + 1) >> frac_bits))
            if a == v1 or (snap32 != 0 and a == np.float64(np.float32(v1))):
                kf = kf + 1
                exact = True
        if kmin <= kf and kf <= kmax and not exact:
            v0 = math.ldexp(tab[F2 + (kf & (F - 1))], int(kf >> frac_bits))
            exact = a == v0 or (snap32 != 0 and a == np.float64(np.float32(v0)))
        if exact:
            kr = kf
        elif mode == NEAREST or mode == NEAREST_AWAY:
            kr = kf + half
        elif mode == TOWARD_ZERO:
            kr = kf
        elif mode == UP:
            kr = kf if neg else kf + 1
        elif mode == DOWN:
            kr = kf + 1 if neg else kf
        elif mode == ODD:
            kr = kf if (kf & 1) == 1 else kf + 1
        else:
            if kf >= kmin:  # the log-distance above code kf
                p = math.log2(s) * F - (lo >> 1)
                p = min(max(p, 0.0), 1.0)
            else:  # between zero and min: by value
                p = a / math.ldexp(tab[F2 + (kmin & (F - 1))], int(kmin >> frac_bits))
            kr = kf + 1 if stochastic_up(p, rnd, nbits) else kf
        if kr > kmax:
            kr = kmax
    if kr < kmin:
        return 0.0
    v = math.ldexp(tab[F2 + (kr & (F - 1))], int(kr >> frac_bits))
    return -v if neg else v
