"""Float32 fast path of the MX+ kernel (kernels/mxplus_cpu.py): float32 data, 1-D blocks along the last axis,
round to nearest, where ``fast_ok`` holds. The same bits as ``mxplus_scalar.mxplus_block``:

- amax and the block max: the largest |x| as the largest of the uint32 bits with the sign cleared (|x|'s bits
  order as |x|, NaN's above inf's), then the first position holding it, found by a second look at the block
  (in cache); the scale 2**clip(e_field - 127 - emax, lo, hi) off amax's exponent field for a normal amax,
  ``pow2_exponent`` otherwise (zero, subnormal, inf), exactly the OCP rule.
- the other elements in float32 arithmetic, 16 lanes: v = x * (1/S), Veltkamp's split, the subnormal magic,
  saturation on the bits, x's sign (dropped from a zero where the element has no -0), times S. These are the
  float64 loop's bits under ``fast_ok``'s conditions for the reasons kernels/block_fast.py's module docstring
  gives for its power-of-two path (the same conditions: S and 1/S float32 values, the element's half step
  above float32's normal range, Veltkamp's split exact for man + 1 <= 21 bits).
- the block max, one per block, in float64: v = x / S exact; Veltkamp's split with 2**(52 - p) + 1 rounds v to
  p + 1 significant bits, ties to even, which in v's binade [2**emax, 2**(emax+1)) is ``round_block_max``'s
  multiple of 2**(emax - p); a carry to 2**(emax+1) (or inf, whose split is NaN) clamps to the largest BM
  value and anything below 2**emax (a scale clipped at lo) to 2**emax, as ``round_block_max`` saturates.

Arrays are flat: ``src`` float32 and its uint32 view ``bits``, rows of C elements cut into blocks of tc (the
last of a row partial). dst may be src: the block max is read before the block is written.
"""
import math
import os

import numpy as np
from numba import njit, prange

from . import _cache, scalar
from .block_fast import pow2_block
from .scalar.block import FLOOR, pow2_exponent

_cache.guard(__file__, [*scalar.SOURCES, *(os.path.join(os.path.dirname(os.path.abspath(__file__)), f)
                                         for f in ("mxplus_scalar.py", "block_fast.py"))])

U32 = np.uint32
U64 = np.uint64
ABS = U32(0x7FFFFFFF)
SIGN = U32(0x80000000)
INF_BITS = U32(0x7F800000)
NAN32 = np.float32(np.nan)


@njit(inline="always")
def _blocks(src, bits, dst, scales, C, tc, tiled, split, magic, min_normal, max_bits, negzero, emax_e, max_e, lo,
            hi, pbits):
    nbc = scales.size // (src.size // C)
    bm_split = math.ldexp(1.0, 52 - pbits) + 1.0
    bm_low = math.ldexp(1.0, emax_e)
    bm_high = math.ldexp(2.0 - math.ldexp(1.0, -pbits), emax_e)
    for b in prange(scales.size):
        if tiled:
            start, size = b * tc, tc
        else:
            r = b // nbc
            c0 = (b - r * nbc) * tc
            start, size = r * C + c0, min(tc, C - c0)
        m = U32(0)
        for k in range(min(size, bits.size - start)):  # (= size) not a constant: the max vectorises
            m = max(m, U32(bits[U64(start + k)] & ABS))
        if m > INF_BITS:  # a NaN
            scales[U64(b)] = math.nan
            for k in range(size):
                dst[U64(start + k)] = NAN32
            continue
        bm = size  # the first position holding m: a branch-free min over the block (it vectorises)
        for k in range(size):
            bm = min(bm, k if U32(bits[U64(start + k)] & ABS) == m else size)
        e_field = np.int64(m >> U32(23))
        if 0 < e_field < 255:
            e = min(max(e_field - 127 - emax_e, lo), hi)
        else:
            e = pow2_exponent(np.float64(U32(m).view(np.float32)), FLOOR, emax_e, max_e, 0, lo, hi)
        s = np.int64((e + 1023) << 52).view(np.float64)
        scales[U64(b)] = s
        # round_block_max to nearest on |x_bm| = amax (from m, not from the block max's position: a shorter
        # dependency chain): Veltkamp's split to pbits + 1 bits (the BM's binade), clamped
        v = np.float64(U32(m).view(np.float32)) * (1.0 / s)
        c = v * bm_split
        y = c - (c - v)
        y = bm_high if not y <= bm_high else y  # a carry out of the binade, or inf (y NaN)
        y = bm_low if y < bm_low else y  # below the binade: only under a scale clipped at lo
        q_bm = np.float32(y * s).view(U32) | (bits[U64(start + bm)] & SIGN)  # x_bm's sign (dst may be src)
        pow2_block(src, bits, dst, start, size, s, split, magic, min_normal, max_bits, negzero)  # plain MX
        if m != 0:  # an all-zero block has no block max
            dst[U64(start + bm)] = U32(q_bm).view(np.float32)


@njit(inline="always")
def _rows(src, bits, dst, scales, C, tc, man, emin, sub, emax_e, max_e, negzero, lo, hi, pbits):
    f32 = np.float32
    split = f32(math.ldexp(1.0, 23 - man) + 1.0)
    magic = f32(1.5 * math.ldexp(1.0, 23 + (emin - man if sub != 0 else emin)))
    min_normal = f32(math.ldexp(1.0, emin))
    max_bits = f32(max_e).view(U32)
    if tc == 32 and C % 32 == 0:  # a constant trip count for the element loop: LLVM unrolls it
        _blocks(src, bits, dst, scales, C, 32, True, split, magic, min_normal, max_bits, negzero, emax_e, max_e, lo,
                hi, pbits)
    else:
        _blocks(src, bits, dst, scales, C, tc, False, split, magic, min_normal, max_bits, negzero, emax_e, max_e, lo,
                hi, pbits)


@njit(cache=True)
def fast_serial(src, bits, dst, scales, C, tc, man, emin, sub, emax_e, max_e, negzero, lo, hi, pbits):
    _rows(src, bits, dst, scales, C, tc, man, emin, sub, emax_e, max_e, negzero, lo, hi, pbits)


@njit(cache=True, parallel=True)
def fast_parallel(src, bits, dst, scales, C, tc, man, emin, sub, emax_e, max_e, negzero, lo, hi, pbits):
    _rows(src, bits, dst, scales, C, tc, man, emin, sub, emax_e, max_e, negzero, lo, hi, pbits)


def fast_ok(args: tuple) -> bool:
    """Whether the float32 path holds for ``mxplus_args`` (kernels/block_fast.py's ``pow2_ok`` conditions)."""
    man, emin, sub, emax_e, max_e, negzero, lo, hi = args[:8]
    return -127 <= lo and hi <= 127 and 1 <= man <= 20 and emin - man > -125 and emax_e + 25 - man < 127 and \
        float(np.float32(max_e)) == max_e
