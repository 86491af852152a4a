"""Operand check of ``emunum.mad.scaled_mm``: how many values are not in a format's value set.

``count_off_grid`` answers by arithmetic, in one parallel pass without branches, for formats whose
finite values are exactly {m * 2**(e - man): integers m, e >= emin} up to their largest value (the caller
checks that once per format): x is such a value iff |x| <= max and |x| * 2**(man - e) is an integer, e =
max(floor(log2|x|), emin); NaN and +-inf count as values where the format has them."""
import math

import numpy as np
from numba import njit, prange

from . import _cache

_cache.guard(__file__, [])


CHUNK = 4096


@njit(cache=True, parallel=True)
def count_off_grid(x, man, emin, vmax, nan_ok, inf_ok):
    """The number of x[i] (1-D, float32 or float64) that are not values of the format (module docstring)."""
    n = x.shape[0]
    nch = (n + CHUNK - 1) // CHUNK
    bad = np.zeros(nch, np.int64)
    for ch in prange(nch):
        cnt = 0
        for i in range(ch * CHUNK, min(n, ch * CHUNK + CHUNK)):
            v = abs(np.float64(x[i]))
            e = np.int64((np.float64(v).view(np.uint64) >> np.uint64(52)) & np.uint64(2047)) - 1023
            e = max(e, emin)
            y = v * np.uint64((man - e + 1023) << 52).view(np.float64)  # 2**(man - e): man - e >= -1023
            ok = (y == np.floor(y)) & (v <= vmax)
            ok |= (v != v) & nan_ok
            ok |= (v == math.inf) & inf_ok
            cnt += 0 if ok else 1
        bad[ch] = cnt
    return bad.sum()
