"""Derived rounding modes of user-defined types (``CustomFormat``, nbits <= 16): the codebook search of
``table.round_table_value`` over the type's finite values (done by the caller), finished here with the
type's infinities and negative zero. Scalars only, so that the CUDA simulator can call it too.

ninf / pinf (0 or 1): -inf / +inf are values of the type; then ``up`` above the largest finite value gives
+inf, ``down`` below the smallest gives -inf, and an infinite x stays itself (every other case saturates, as
for codebooks). negzero (0 or 1): the type has -0.0; then a zero result carries x's sign. NaN stays NaN.
"""
import math

from numba import njit

from .common import DOWN, UP


@njit(inline="always")
def finish_derived(x, q, lo, hi, ninf, pinf, negzero, mode):
    """The derived-mode result for float64 x, given q = x rounded (``round_table_value``, same mode) to the
    finite values lo = values[0] .. hi = values[n-1]; returns a float64."""
    if x != x:
        return x
    if pinf != 0 and (x == math.inf or (mode == UP and x > hi)):
        return math.inf
    if ninf != 0 and (x == -math.inf or (mode == DOWN and x < lo)):
        return -math.inf
    if negzero != 0 and q == 0.0:
        return math.copysign(0.0, x)
    return q
