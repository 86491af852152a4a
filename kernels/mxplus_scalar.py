"""Scalar core of the MX+ block kernels (kernels/mxplus_cpu.py, kernels/mxplus_cuda.py): one block of a
(P, R, C) array quantised as ``emunum.formats.mxplus.MXPlusFormat`` states (float64 arithmetic).

Arguments: the float element (man, emin, sub, its largest exponent emax_e and largest value max_e, negzero),
the scale exponent range [lo, hi] (the OCP floor rule), and p = exp + man, the block max's mantissa bits.
Stochastic rounding draws element (p, i, j)'s bits from (key, (p * R + i) * C + j), as the plain block kernels.
"""
import math

import numpy as np
from numba import njit

from .nvfp4_scalar import block_at
from .scalar.block import FLOOR, pow2_exponent, round_float_value_sat
from .scalar.common import NEAREST, STOCHASTIC, random_bits
from .scalar.fixed import round_fixed_value
from .scalar.float import round_nearest_value

# numba's CUDA simulator cannot hand its fake device arrays to compiled @njit cores: kernels/mxplus_cuda.py then
# loads a second copy of this module with PLAIN_PYTHON set, whose cores stay Python functions.
_core = (lambda f: f) if globals().get("PLAIN_PYTHON") else njit(inline="always")


@_core
def round_block_max(v, emax_e, pbits, mode, rnd, nbits):
    """The block max's scaled value v (not NaN) on its grid: a multiple of 2**(emax_e - pbits), saturated to
    [2**emax_e, 2**emax_e * (2 - 2**-pbits)] in magnitude, v's sign."""
    cmax = (np.int64(1) << (pbits + 1)) - 1
    r = round_fixed_value(v, pbits - emax_e, -cmax, cmax, 1, mode, rnd, nbits)
    low = math.ldexp(1.0, emax_e)
    return math.copysign(low, v) if abs(r) < low else r


@_core
def mxplus_block(src, dst, scales, b, tr, tc, man, emin, sub, emax_e, max_e, negzero, lo, hi, pbits, split, magic,
                 min_normal, mode, key, nbits):
    P, R, C = src.shape
    p, bi, bj, r0, r1, c0, c1 = block_at(b, scales.shape[1], scales.shape[2], tr, tc, R, C)
    amax = 0.0
    has_nan = False
    bm_i = r0
    bm_j = c0
    for i in range(r0, r1):
        for j in range(c0, c1):
            a = abs(np.float64(src[p, i, j]))
            if a != a:
                has_nan = True
            elif a > amax:  # strictly: the first of equal maxima is the block max
                amax = a
                bm_i = i
                bm_j = j
    if has_nan:
        scales[p, bi, bj] = math.nan
        for i in range(r0, r1):
            for j in range(c0, c1):
                dst[p, i, j] = math.nan
        return
    full = math.ldexp(1.0, pow2_exponent(amax, FLOOR, emax_e, max_e, 0, lo, hi))
    scales[p, bi, bj] = full
    inv = 1.0 / full  # exact: a power of two
    x_bm = np.float64(src[p, bm_i, bm_j])  # read before dst is written: dst may be src
    for i in range(r0, r1):
        for j in range(c0, c1):
            v = np.float64(src[p, i, j]) * inv
            if mode == NEAREST:
                q = round_nearest_value(v, split, magic, min_normal, max_e, max_e, negzero)
            else:
                rnd = random_bits(key, (p * R + i) * C + j, nbits) if mode == STOCHASTIC else np.uint64(0)
                q = round_float_value_sat(v, man, emin, sub, max_e, negzero, mode, rnd, nbits)
            dst[p, i, j] = q * full
    if amax > 0.0:
        rnd = random_bits(key, (p * R + bm_i) * C + bm_j, nbits) if mode == STOCHASTIC else np.uint64(0)
        dst[p, bm_i, bm_j] = round_block_max(x_bm * inv, emax_e, pbits, mode, rnd, nbits) * full
