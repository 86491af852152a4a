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
the parallel-section lock.
"""
import numpy as np
from numba import njit

from . import _cache

_cache.guard(__file__, [])


@njit(cache=True)
def _scan(flat):
    amax = 0.0
    amin = np.inf
    nan = False
    low = np.uint32(0x800000)  # the smallest lowest-set-bit seen (2**23 when none is lower)
    seen = False
    for i in range(flat.size):
        v = np.float64(flat[i])
        a = abs(v)
        nan |= v != v
        amax = max(amax, a)
        amin = min(amin, a) if a != 0.0 else amin
        u = np.float32(v).view(np.uint32) & np.uint32(0x7FFFFFFF)
        sig = (u & np.uint32(0x7FFFFF)) | np.uint32(0x800000)
        lo = sig & (~sig + np.uint32(1))
        nz = u != np.uint32(0)
        seen |= nz
        low = min(low, lo) if nz else low
    return amax, amin, nan, low, seen


def scan(x: np.ndarray) -> tuple[float, float, int]:
    """(max |x|, smallest nonzero |x|, significant bits) of x; see the module docstring."""
    flat = np.ascontiguousarray(x).reshape(-1)
    if flat.size == 0:
        return 0.0, np.inf, 0
    amax, amin, nan, low, seen = _scan(flat)
    if nan:
        return np.nan, np.nan, int(24 - np.log2(float(low))) if seen else 0
    bits = int(24 - np.log2(float(low))) if seen else 0
    return float(amax), float(amin), bits
