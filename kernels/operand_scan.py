"""One pass over a GEMM operand for the planners of the MAD kernels (``gemm_cpu.fast_plan``).

``scan(x)`` returns (max |x|, smallest nonzero |x|, significant bits) of a float32 or float64 array whose values
are float32-representable, in one serial, vectorised read, where the numpy version made six passes and
temporaries (about 0.4 ms per operand of the default CNN's GEMMs). Same results as
``gemm_cpu._abs_range`` and ``gemm_cpu._significant_bits`` (tested):
- max |x| as float64, NaN if any element is NaN (numpy's max propagates NaN); 0.0 for an empty array;
- smallest nonzero |x| (a NaN is not counted: ``a[a != 0]`` keeps it, but min over values with a NaN is NaN in
  numpy, so NaN is returned there too); inf when no element is nonzero;
- significant bits: over the nonzero float32 bit patterns (infinities and NaNs included, as numpy's version),
  the most bits from the leading significand bit (implicit 1) to the last set bit: 24 - log2(lowest set bit of
  (fraction | 2**23)); 0 when no element is nonzero.
Serial on purpose: operands of the GEMMs it plans are small to mid-sized, and it runs inside the planner, outside
the parallel-section lock. The reductions are integer min/max/or over the float32 bit patterns (they vectorise).
"""
import numpy as np
from numba import njit

from . import _cache

_cache.guard(__file__, [])


@njit(cache=True)
def _scan_bits(u):
    """Integer reductions over float32 bit patterns u (uint32): (max |bits|, min nonzero |bits| (2**31 when
    there is none), the lowest set bit of the significand with its implicit bit, over nonzero patterns).
    Non-negative float bit patterns order as their values do (NaN patterns above inf), so these are value
    reductions. The lowest set bit of an OR is the lowest of its operands' lowest set bits, and a zero
    pattern adds only the implicit bit, so the third is the lowest set bit of the OR of every fraction with
    the implicit bit. Arithmetic in int64 (numba widens uint32 anyway; signed min/max vectorise, unsigned
    64-bit ones do not)."""
    hi = 0
    lo = 0x80000000
    bits = 0
    for i in range(u.size):
        a = np.int64(u[i]) & 0x7FFFFFFF
        hi = max(hi, a)
        lo = min(lo, a if a != 0 else 0x80000000)
        bits |= a
    sig = (bits & 0x7FFFFF) | 0x800000
    return hi, lo, sig & -sig


def scan(x: np.ndarray) -> tuple[float, float, int]:
    """(max |x|, smallest nonzero |x|, significant bits) of x; see the module docstring."""
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)  # float32-representable: exact
    if flat.size == 0:
        return 0.0, np.inf, 0
    hi, lo, low = _scan_bits(flat.view(np.uint32))
    if hi == 0:
        return 0.0, np.inf, 0
    bits = int(24 - np.log2(float(low)))
    if hi > 0x7F800000:  # a NaN: numpy's max and min propagate it
        return np.nan, np.nan, bits
    f = np.array([hi, lo], dtype=np.uint32).view(np.float32)
    return float(f[0]), float(f[1]), bits
