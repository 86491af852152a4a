"""Operand check of ``emunum.mad.scaled_mm``: the first value of x that is not in a format's value set.

A binary search of each value in the format's sorted finite values (formats of <= 8 bits: at most 256), NaN
and +-inf accepted where the format has them. Serial, stops at the first miss."""
import math

import numpy as np
from numba import njit

from . import _cache

_cache.guard(__file__, [])


@njit(cache=True)
def first_off_grid(x, vals, nan_ok, inf_ok):
    """The flat index of the first x[i] (float64, 1-D) not in ``vals`` (sorted float64), or -1."""
    n = vals.shape[0]
    for i in range(x.shape[0]):
        v = x[i]
        if v != v:
            if nan_ok:
                continue
            return i
        if math.isinf(v):
            if inf_ok:
                continue
            return i
        j = np.searchsorted(vals, v)
        if j >= n or vals[j] != v:
            return i
    return -1
