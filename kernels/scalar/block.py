"""Block-scaled format cores (``BlockFormat``): a block's scale from its largest magnitude, and the saturating
rounding of one scaled element. Scalars only, so that the CPU loops and the CUDA kernels share them.

Element kinds: 0 float (p0 = man, p1 = emin, p2 = subnormals), 1 fixed (p0 = frac_bits, p1 = code_min,
p2 = code_max). Scale rules: 0 OCP (a power of two, exponent clipped to [lo, hi]), 1 amax (rounded to
nearest-even into a float scale format with s_man, s_emin, s_sub, s_max; raised to s_min if smaller).
"""
import math

import numpy as np
from numba import njit

from .common import NEAREST
from .fixed import round_fixed_value


@njit(inline="always")
def round_float_value_sat(v, man, emin, sub, max_value, negzero, mode, rnd, nbits):
    """Round a float64 ``v`` to a float format (man >= 1), saturating to +-max_value (infinities too); NaN
    stays NaN; a zero result keeps v's sign when ``negzero``. Same decisions as ``round_float_bits``."""
    if v != v:
        return v
    a = abs(v)
    if a == math.inf:
        return math.copysign(max_value, v)
    if a == 0.0:
        return math.copysign(0.0, v) if negzero != 0 else 0.0
    e = math.frexp(a)[1] - 1
    if e >= emin:
        qe = e - man
    elif sub != 0:
        qe = emin - man
    else:
        qe = emin
    big = np.int64(1) << (man + 3)
    r = round_fixed_value(v, -qe, -big, big, 1, mode, rnd, nbits)
    if abs(r) > max_value:
        r = math.copysign(max_value, v)
    if r == 0.0:
        r = math.copysign(0.0, v) if negzero != 0 else 0.0
    return r


@njit(inline="always")
def round_element(v, kind, p0, p1, p2, max_value, negzero, mode, rnd, nbits):
    """One scaled element, saturated to the element format's range."""
    if kind == 0:
        return round_float_value_sat(v, p0, p1, p2, max_value, negzero, mode, rnd, nbits)
    return round_fixed_value(v, p0, p1, p2, 1, mode, rnd, nbits)


@njit(inline="always")
def block_scale(amax, has_nan, rule, emax_elem, max_elem, lo, hi, s_man, s_emin, s_sub, s_max, s_min, t):
    """The block scale (without the tensor scale t) for a block whose largest finite-or-inf magnitude is
    ``amax``; NaN if the block holds a NaN."""
    if has_nan:
        return math.nan
    if rule == 0:
        if amax == 0.0:
            e = lo
        elif amax == math.inf:
            e = hi
        else:
            e = math.frexp(amax)[1] - 1 - emax_elem
            e = min(max(e, lo), hi)
        return math.ldexp(1.0, e)
    want = min(amax / max_elem / t, s_max)
    q = round_float_value_sat(want, s_man, s_emin, s_sub, s_max, 0, NEAREST, 0, 32)
    return max(q, s_min)
