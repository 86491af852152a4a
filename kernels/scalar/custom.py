"""Derived rounding modes of user-defined types (``CustomFormat``, nbits <= 16): the codebook search of
``table.round_table_value`` over the type's finite values, plus the type's infinities and negative zero.

ninf / pinf (0 or 1): -inf / +inf are values of the type; then ``up`` above the largest finite value gives
+inf, ``down`` below the smallest gives -inf, and an infinite x stays itself (every other case saturates, as
for codebooks). negzero (0 or 1): the type has -0.0; then a zero result carries x's sign. NaN stays NaN.
"""
import math

from numba import njit

from .common import DOWN, UP
from .table import round_table_value


@njit(inline="always")
def round_derived_value(x, tab, n, snap32, ninf, pinf, negzero, mode, rnd, nbits):
    """float64 x rounded in a derived mode (toward_zero, up, down, stochastic) to the type whose finite
    values are the table ``tab`` of ``n`` values (``TableFormat`` kernel layout); returns a float64."""
    if x != x:
        return x
    if pinf != 0 and (x == math.inf or (mode == UP and x > tab[n - 1])):
        return math.inf
    if ninf != 0 and (x == -math.inf or (mode == DOWN and x < tab[0])):
        return -math.inf
    q = round_table_value(x, tab, n, snap32, mode, rnd, nbits)
    if negzero != 0 and q == 0.0:
        return math.copysign(0.0, x)
    return q
