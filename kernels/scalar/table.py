"""Codebook rounding core (``TableFormat``): binary search over a sorted float64 table.

The table array (``TableFormat.to_kernel_args``) holds, for n values: values[0..n), then the high parts
[n, 2n-1) and the low parts [2n-1, 3n-2) of the midpoints (values[i] + values[i+1]) / 2 = high + low,
exactly. Comparing ``x - high`` with ``low`` decides nearest rounding exactly: where x and high are within
a factor 2 the subtraction is exact (Sterbenz), and elsewhere |x - high| >= |high|/2 > |low|.
"""
import math

import numpy as np
from numba import njit

from .common import DOWN, NEAREST, NEAREST_AWAY, ODD, TOWARD_ZERO, UP, _floor, _is_odd


@njit(inline="always")
def stochastic_up(p, rnd, nbits):
    """Round away with probability p in [0, 1]: p quantised to ``nbits`` bits (ties to even), plus
    rnd / 2**nbits, reaches 1 (the rule of the fixed-point core)."""
    d = p * math.ldexp(1.0, nbits)
    f = _floor(d)
    dd = d - f
    f = f + (1.0 if (dd > 0.5) | ((dd == 0.5) & _is_odd(f)) else 0.0)
    return f + float(rnd) >= math.ldexp(1.0, nbits)


@njit(inline="always")
def round_table_value(x, tab, n, snap32, mode, rnd, nbits):
    """Round a float64 x to the table of ``n`` values (layout in the module docstring); returns a float64.

    Saturates outside [values[0], values[n-1]]; NaN stays NaN; mode codes as in ``common``. snap32 != 0
    (float32 tensors): x equal to float32(value), the value a float32 tensor holds, is exact too."""
    if x != x:
        return x
    if x <= tab[0]:
        return tab[0]
    if x >= tab[n - 1]:
        return tab[n - 1]
    lo = 0  # branch-free binary search: the largest lo with tab[lo] <= x (tab[0] < x < tab[n-1] here)
    length = n
    while length > 1:
        half = length >> 1
        lo = lo + half if tab[lo + half] <= x else lo
        length -= half
    a = tab[lo]
    b = tab[lo + 1]
    if x == a or (snap32 != 0 and x == np.float64(np.float32(a))):
        return a
    if snap32 != 0 and x == np.float64(np.float32(b)):
        return b
    c = x - tab[n + lo]
    low = tab[2 * n - 1 + lo]
    if mode == NEAREST:
        up = (c > low) or ((c == low) and (lo & 1) == 1)
    elif mode == NEAREST_AWAY:
        up = (c > low) or ((c == low) and (abs(b) > abs(a) or (abs(b) == abs(a) and math.copysign(1.0, x) > 0.0)))
    elif mode == TOWARD_ZERO:
        up = x < 0.0
    elif mode == UP:
        up = True
    elif mode == DOWN:
        up = False
    elif mode == ODD:
        up = (lo & 1) == 0
    else:
        up = stochastic_up((x - a) / (b - a), rnd, nbits)
    return b if up else a
