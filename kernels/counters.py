"""Numerics-trace counters for ``emunum.trace``: one fused, vectorised pass over (x, rounded x).

out (float64[6]) += (values, overflowed, underflowed to zero, NaN, signal power, noise power).
fastmath is limited to reassociation (and no-signed-zeros, contraction) so that the float64 sums
vectorise; NaN and inf tests keep their IEEE meaning.
"""
import numpy as np
from numba import njit, prange

from . import _cache, cpu as _cpu  # noqa: F401  (cpu sets numba's threading layer beside torch's)

_cache.guard(__file__, [])

fm = {"reassoc", "nsz", "contract"}


@njit(cache=True, nogil=True, fastmath=fm)
def counters_serial(x, q, lo, hi, sqnr, out):
    over = under = nan = 0
    sig = noise = 0.0
    for i in range(x.size):
        a, b = x[i], q[i]
        fa = abs(a) < np.inf
        over += fa & ((a > hi) | (a < lo))
        under += (b == 0) & (a != 0)
        nan += b != b
        if sqnr:
            ok = fa & (abs(b) < np.inf)
            da = np.float64(a) if ok else 0.0
            d = (np.float64(b) if ok else 0.0) - da
            sig += da * da
            noise += d * d
    out[0] += x.size
    out[1] += over
    out[2] += under
    out[3] += nan
    out[4] += sig
    out[5] += noise

@njit(cache=True, parallel=True, fastmath=fm)
def counters_parallel(x, q, lo, hi, sqnr, out):
    over = under = nan = 0
    sig = noise = 0.0
    for i in prange(x.size):
        a, b = x[i], q[i]
        fa = abs(a) < np.inf
        over += fa & ((a > hi) | (a < lo))
        under += (b == 0) & (a != 0)
        nan += b != b
        if sqnr:
            ok = fa & (abs(b) < np.inf)
            da = np.float64(a) if ok else 0.0
            d = (np.float64(b) if ok else 0.0) - da
            sig += da * da
            noise += d * d
    out[0] += x.size
    out[1] += over
    out[2] += under
    out[3] += nan
    out[4] += sig
    out[5] += noise
