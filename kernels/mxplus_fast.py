"""Float32 fast path of the MX+ kernel (kernels/mxplus_cpu.py): float32 data, 1-D blocks along the last axis,
round to nearest, where ``fast_ok`` holds. The same bits as ``mxplus_scalar.mxplus_block``
(tests/kernels/test_mxplus_fast.py compares the two with zero tolerance):

- the block max, its position and sign in one vectorised max over 64-bit keys ``|x| bits << (P + 1) |
  (2**P - 1 - k) << 1 | sign`` (k the position in the block, tc <= 2**P): |x|'s bits order as |x| (NaN's above
  inf's), so the largest key holds amax, then the first position holding it, then that element's sign (the
  position is unique, so the sign never decides). The scale is 2**clip(e_field - 127 - emax, lo, hi) off amax's
  exponent field for a normal amax, ``pow2_exponent`` otherwise (zero, subnormal, inf), exactly the OCP rule.
- the other elements: kernels/block_fast.py's ``pow2_block`` (plain MX in float32 arithmetic, vectorised), which
  gives the float64 loop's bits under ``fast_ok``'s conditions (``block_fast.pow2_ok``'s: S and 1/S float32
  values, the element's half step above float32's normal range, Veltkamp's split exact for man + 1 <= 21 bits).
- the block max, one per block: for a normal amax whose exponent is not clipped, |x_bm| / S lies in the BM's
  binade [2**emax, 2**(emax+1)) and has amax's significand, so ``round_block_max`` (to a multiple of
  2**(emax - p), ties to even) times S is amax's float32 bits rounded to p fraction bits, ties to even, clamped
  to the binade's largest p-bit value (a carry saturates: the exponent is implied). Otherwise (a clipped scale,
  a subnormal or infinite amax) in float64: v = x / S exact; Veltkamp's split with 2**(52 - p) + 1 rounds v to
  p + 1 significant bits, ties to even; a carry to 2**(emax+1) (or inf, whose split is NaN) clamps to the
  largest BM value and anything below 2**emax (a scale clipped at lo) to 2**emax, as ``round_block_max``
  saturates.

Each block's work is a chain (the key's reduction, the scale, the elements, the block max's store); run one after
the other, the chains left the out-of-order core idle (half of plain MX's speed, measured). So the key of block
b + AHEAD is taken in block b's step: the chains of a step are independent, and the reads run ahead of the writes
as in plain MX's single pass. Tasks of CHUNK blocks (shares of them run on threads: ``threads.launch``) each
start their own look-ahead.

Arrays are flat: ``src`` float32 and its uint32 view ``bits``, rows of C elements cut into blocks of tc (the
last of a row partial). dst may be src: a block's key is taken before the block is written.
"""
import math
import os

import numpy as np
from numba import njit

from . import _cache, scalar
from .block_fast import _row_range, pow2_block
from .scalar.block import FLOOR, pow2_exponent
from .wide import prefer_wide_vectors

_cache.guard(__file__, [*scalar.SOURCES, *(os.path.join(os.path.dirname(os.path.abspath(__file__)), f)
                                         for f in ("mxplus_scalar.py", "block_fast.py"))])

U32 = np.uint32
U64 = np.uint64
ABS = U32(0x7FFFFFFF)
SIGN = U32(0x80000000)
INF_BITS = U32(0x7F800000)
NAN32 = np.float32(np.nan)
CHUNK = 128  # blocks per task of the parallel loop
AHEAD = 8  # blocks between a key and its use (a power of two)


@njit(inline="always")
def _bm_slow(m, e, emax_e, pbits):
    """The float32 bits of |block max| rounded (``round_block_max``, to nearest) times S = 2**e, in float64, for
    any non-NaN amax with bits m (e: the clipped scale exponent)."""
    s = np.int64((e + 1023) << 52).view(np.float64)
    v = np.float64(U32(m).view(np.float32)) * np.int64((1023 - e) << 52).view(np.float64)  # x / S, exact
    c = v * (math.ldexp(1.0, 52 - pbits) + 1.0)
    y = c - (c - v)
    bm_high = math.ldexp(2.0 - math.ldexp(1.0, -pbits), emax_e)
    y = bm_high if not y <= bm_high else y  # a carry out of the binade, or inf (y NaN)
    bm_low = math.ldexp(1.0, emax_e)
    y = bm_low if y < bm_low else y  # below the binade: only under a scale clipped at lo
    return np.int64(np.float32(y * s).view(U32))


@njit(inline="always")
def _key(bits, b, nbc, tc, C, tiled, P, top_k):
    """Block b's largest key (module doc): amax bits, first position holding it, its sign."""
    start, size = _row_range(b, nbc, tc, C, tiled)
    key = U64(0)
    for k in range(size):
        u = bits[U64(start + k)]
        key = max(key, U64(U64(u & ABS) << U64(P + 1)) | U64((top_k - U64(k)) << U64(1)) | U64(u >> U32(31)))
    return key


@njit(inline="always")
def _blocks(c0, c1, src, bits, dst, scales, C, tc, tiled, P, split, magic, min_normal, max_bits, negzero, emax_e, max_e,
            lo, hi, pbits):
    nb = scales.size
    nbc = nb // (src.size // C)
    top_k = U64((1 << P) - 1)
    sh = max(23 - pbits, 0)  # the block max's rounding on amax's bits: p fraction bits, ties to even
    bm_lsb = np.int64(1 << sh) if sh > 0 else np.int64(0)
    bm_hm1 = np.int64((1 << (sh - 1)) - 1) if sh > 0 else np.int64(0)
    bm_mask = np.int64(~((1 << sh) - 1))
    keys = np.empty(AHEAD, np.uint64)
    for ch in range(c0, c1):
        b0 = ch * CHUNK
        b1 = min(b0 + CHUNK, nb)
        for b in range(b0, min(b0 + AHEAD, b1)):
            keys[U64(b - b0)] = _key(bits, b, nbc, tc, C, tiled, P, top_k)
        for b in range(b0, b1):
            j = U64((b - b0) & (AHEAD - 1))
            key = keys[j]
            if b + AHEAD < b1:
                keys[j] = _key(bits, b + AHEAD, nbc, tc, C, tiled, P, top_k)
            start, size = _row_range(b, nbc, tc, C, tiled)
            m = np.int64(key >> U64(P + 1))
            if m > np.int64(INF_BITS):  # a NaN
                scales[U64(b)] = math.nan
                for k in range(size):
                    dst[U64(start + k)] = NAN32
                continue
            bm = np.int64(top_k - ((key >> U64(1)) & top_k))
            e_field = m >> 23
            e = e_field - 127 - emax_e
            if 0 < e_field < 255 and lo <= e <= hi:
                r_bm = min((m + bm_hm1 + np.int64((m & bm_lsb) != 0)) & bm_mask, (m | 0x7FFFFF) & bm_mask)
            else:
                if 0 < e_field < 255:
                    e = min(max(e, lo), hi)
                else:
                    e = pow2_exponent(np.float64(U32(m).view(np.float32)), FLOOR, emax_e, max_e, 0, lo, hi)
                r_bm = _bm_slow(m, e, emax_e, pbits)
            s = np.int64((e + 1023) << 52).view(np.float64)
            scales[U64(b)] = s
            pow2_block(src, bits, dst, start, size, s, split, magic, min_normal, max_bits, negzero)  # plain MX
            if m != 0:  # an all-zero block has no block max
                dst[U64(start + bm)] = U32(U32(r_bm) | (SIGN if key & U64(1) else U32(0))).view(np.float32)


@njit(inline="always")
def _rows(c0, c1, src, bits, dst, scales, C, tc, man, emin, sub, emax_e, max_e, negzero, lo, hi, pbits):
    f32 = np.float32
    split = f32(math.ldexp(1.0, 23 - man) + 1.0)
    magic = f32(1.5 * math.ldexp(1.0, 23 + (emin - man if sub != 0 else emin)))
    min_normal = f32(math.ldexp(1.0, emin))
    max_bits = f32(max_e).view(U32)
    if tc == 32 and C % 32 == 0:  # constant trip counts and key layout: LLVM unrolls the element loops
        _blocks(c0, c1, src, bits, dst, scales, C, 32, True, 5, split, magic, min_normal, max_bits, negzero, emax_e,
                max_e, lo, hi, pbits)
    else:
        P = 1
        while (1 << P) < tc:
            P += 1
        _blocks(c0, c1, src, bits, dst, scales, C, tc, C % tc == 0, P, split, magic, min_normal, max_bits, negzero,
                emax_e, max_e, lo, hi, pbits)


@njit(cache=True, nogil=True)
def fast_range(c0, c1, src, bits, dst, scales, C, tc, man, emin, sub, emax_e, max_e, negzero, lo, hi, pbits):
    """Tasks c0..c1-1 of CHUNK blocks (``chunks``)."""
    prefer_wide_vectors()
    _rows(c0, c1, src, bits, dst, scales, C, tc, man, emin, sub, emax_e, max_e, negzero, lo, hi, pbits)


def chunks(nb: int) -> int:
    """The tasks of ``fast_range`` for nb blocks."""
    return -(-nb // CHUNK)


def fast_ok(args: tuple) -> bool:
    """Whether the float32 path holds for ``mxplus_args`` (kernels/block_fast.py's ``pow2_ok`` conditions)."""
    man, emin, sub, emax_e, max_e, negzero, lo, hi = args[:8]
    return -127 <= lo and hi <= 127 and 1 <= man <= 20 and emin - man > -125 and emax_e + 25 - man < 127 and \
        float(np.float32(max_e)) == max_e
