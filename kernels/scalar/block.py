"""Block-scaled format cores (``BlockFormat``): a block's scale from its largest magnitude, and the saturating
rounding of one scaled element. Scalars only, so that the CPU loops and the CUDA kernels share them.

Element kinds: 0 float (p0 = man, p1 = emin, p2 = subnormals), 1 fixed (p0 = frac_bits, p1 = code_min,
p2 = code_max). Scale rules (``ScaleRule.code``): 1 amax (rounded to nearest-even into a float scale format
with s_man, s_emin, s_sub, s_max; raised to s_min if smaller), and the powers of two 2**E, E clipped to
[lo, hi]: 0 floor (OCP), 2 ceil, 3 even, 4 rceil (emunum/formats/scale_rule.py states them).
"""
import math

import numpy as np
from numba import njit

from .common import NEAREST
from .fixed import round_fixed_value

FLOOR, AMAX, CEIL, EVEN, RCEIL = 0, 1, 2, 3, 4  # the rule codes (ScaleRule.code)


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
def element_mbits(kind, p0, p2):
    """The element's mantissa bits for the ``even`` rule: man (float), floor(log2 code_max) (fixed)."""
    if kind == 0:
        return p0
    return max(math.frexp(float(p2))[1] - 1, 0)


@njit(inline="always")
def pow2_exponent(amax, rule, emax_elem, max_elem, mbits, lo, hi):
    """E of a power-of-two rule (floor, ceil, even, rceil) for a NaN-free block maximum amax >= 0, clipped to
    [lo, hi]; amax = 0 gives lo, inf gives hi."""
    if amax == 0.0:
        return lo
    if amax == math.inf:
        return hi
    a = amax
    if rule == RCEIL:
        a = np.float64(np.float32(amax / max_elem))  # the float32 ratio, rounded to nearest-even
        if a == 0.0:
            return lo
        if a == math.inf:
            return hi
    m, e = math.frexp(a)  # a = m * 2**e, m in [0.5, 1)
    e = e - 1
    if rule == CEIL or rule == RCEIL:
        e += 1 if m != 0.5 else 0
    elif rule == EVEN:
        e += 1 if m >= 1.0 - math.ldexp(1.0, -(mbits + 2)) else 0  # amax rounded to mbits + 1 bits carries
    if rule != RCEIL:
        e -= emax_elem
    return min(max(e, lo), hi)


@njit(inline="always")
def block_scale(amax, has_nan, rule, emax_elem, max_elem, lo, hi, s_man, s_emin, s_sub, s_max, s_min, t, mbits):
    """The block scale (without the tensor scale t) for a block whose largest finite-or-inf magnitude is
    ``amax``; NaN if the block holds a NaN. mbits: ``element_mbits`` (the ``even`` rule's)."""
    if has_nan:
        return math.nan
    if rule != AMAX:
        return math.ldexp(1.0, pow2_exponent(amax, rule, emax_elem, max_elem, mbits, lo, hi))
    want = min(amax / max_elem / t, s_max)
    q = round_float_value_sat(want, s_man, s_emin, s_sub, s_max, 0, NEAREST, 0, 32)
    return max(q, s_min)
