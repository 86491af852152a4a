"""Numba CPU kernel for block-scaled formats: one pass per block (amax, then round while the block is in
cache), parallel over blocks for large tensors (``block_range`` on ``threads.launch``; the float32 rows loop by
``prange``). Every block is visited with the same arguments on any thread count, so the bits never depend on it.

Arrays are 3-D, (P, R, C), C-contiguous; a block is a (tr, tc) tile (1-D blocks along the last axis are
(1, tc) tiles); edge tiles are partial. ``scales`` (P, nbr, nbc) float64 receives each block's scale.

``quantize_blocks`` dispatches float32 data rounded to nearest to kernels/block_fast.py (power-of-two scales in
float32 arithmetic, 1-D blocks; NVFP4- and NVINT4-like amax scales by exact thresholds, no division, 1-D blocks or
2-D tiles) where its proofs hold (``fast_path_of``), float32 data in 1-D blocks or 2-D tiles with amax scales
rounded stochastically to kernels/block_sr.py (``sr_ok``), else to the float64 loops here; all give the bits of
``block_serial``.
"""
import functools
import math
import os

import numba
import numpy as np
from numba import njit, prange

from . import _cache, block_fast, block_sr, scalar, threads
from . import parallel as _parallel
from .scalar.block import AMAX, FLOOR, block_scale, element_mbits, round_element
from .scalar.common import NEAREST, STOCHASTIC, random_bits
from .scalar.float import round_nearest_value

_cache.guard(__file__, [*scalar.SOURCES, block_fast.__file__])

if "NUMBA_THREADING_LAYER" not in os.environ and numba.config.THREADING_LAYER == "default":
    numba.config.THREADING_LAYER = "workqueue"  # as kernels/cpu.py: numba's OpenMP contends with torch's

# From this many elements on, with more than one numba thread, the prange loop runs (kernels/cpu.py's figure).
PARALLEL_MIN = 1 << 18


@njit(inline="always")
def _one_block(src, dst, scales, b, nbr, nbc, tr, tc, split, magic, min_normal, kind, p0, p1, p2, emax_e, max_e,
               negzero, rule, lo, hi, s_man, s_emin, s_sub, s_max, s_min, t, mode, key, nbits):
    P, R, C = src.shape
    per = nbr * nbc
    p = b // per
    bi = (b % per) // nbc
    bj = b % nbc
    r0 = bi * tr
    r1 = min(r0 + tr, R)
    c0 = bj * tc
    c1 = min(c0 + tc, C)
    amax = 0.0
    has_nan = False
    for i in range(r0, r1):
        for j in range(c0, c1):
            v = np.float64(src[p, i, j])
            if v != v:
                has_nan = True
            else:
                amax = max(amax, abs(v))
    s = block_scale(amax, has_nan, rule, emax_e, max_e, lo, hi, s_man, s_emin, s_sub, s_max, s_min, t,
                    element_mbits(kind, p0, p2))
    scales[p, bi, bj] = s
    full = s * t
    if has_nan:
        for i in range(r0, r1):
            for j in range(c0, c1):
                dst[p, i, j] = np.nan
    elif kind == 0 and mode == NEAREST:
        # Veltkamp's split (kernels/scalar/float.py), saturating: 4x the bit-level core's speed, same bits.
        # A power-of-two scale (every rule but amax) divides exactly as a multiplication by its inverse.
        inv = 1.0 / full
        for i in range(r0, r1):
            for j in range(c0, c1):
                v = np.float64(src[p, i, j])
                v = v * inv if rule != AMAX else v / full
                dst[p, i, j] = round_nearest_value(v, split, magic, min_normal, max_e, max_e, negzero) * full
    else:
        for i in range(r0, r1):
            for j in range(c0, c1):
                rnd = random_bits(key, (p * R + i) * C + j, nbits) if mode == STOCHASTIC else np.uint64(0)
                q = round_element(np.float64(src[p, i, j]) / full, kind, p0, p1, p2, max_e, negzero, mode, rnd,
                                  nbits)
                dst[p, i, j] = q * full


@njit(inline="always")
def _nearest_constants(kind, man, emin, sub):
    """Veltkamp split, subnormal magic and min normal of a float element (``round_nearest_fast``)."""
    if kind != 0:
        return 0.0, 0.0, 0.0
    return (math.ldexp(1.0, 52 - man) + 1.0, 1.5 * math.ldexp(1.0, 52 + (emin - man if sub != 0 else emin)),
            math.ldexp(1.0, emin))


@njit(cache=True, nogil=True)
def block_range(b0, b1, src, dst, scales, tr, tc, kind, p0, p1, p2, emax_e, max_e, negzero, rule, lo, hi, s_man,
                s_emin, s_sub, s_max, s_min, t, mode, key, nbits):
    """Blocks b0..b1-1 (flat block index over ``scales``) of the general float64 loop; one kernel for the serial
    call and for each thread's share (``threads.launch``): every block's operations depend on its index only."""
    nbr, nbc = scales.shape[1], scales.shape[2]
    split, magic, min_normal = _nearest_constants(kind, p0, p1, p2)
    for b in range(b0, b1):
        _one_block(src, dst, scales, b, nbr, nbc, tr, tc, split, magic, min_normal, kind, p0, p1, p2, emax_e, max_e,
                   negzero, rule, lo, hi, s_man, s_emin, s_sub, s_max, s_min, t, mode, key, nbits)


def block_serial(src, dst, scales, tr, tc, *args):
    """Every block on the calling thread (``block_range`` over all of them): the reference the fast paths' tests
    compare with. args: ``block_args``, then mode, key (np.uint64), nbits."""
    block_range(0, scales.size, src, dst, scales, tr, tc, *args)


# ---- the float64 fast path: float32 data, 1-D blocks, a float element, round to nearest, where block_fast.py
# takes none (amax scales of other elements; OCP scale formats wider than float32's exponents) ----------------
# The same values as ``_one_block``'s nearest branch, laid out so that LLVM vectorises the loops: the block's
# amax as an integer max over the float32 bits (|v|'s bits order as |v|; NaN's lie above +inf's); for OCP
# scales (rule 0) the exponent read off those bits and 2**e built from its bits (frexp/ldexp otherwise, as
# ``block_scale``); for amax scales (rule 1) ``block_scale``'s expression with the scale rounded by Veltkamp's
# split (``round_nearest_value``, the same bits as the bit-level core for a scale format with man >= 1).

@njit(inline="always")
def _fast_scale(m, rule, emax_e, max_e, lo, hi, s_man, s_emin, s_sub, s_max, s_min, t, s_split, s_magic,
                s_min_normal, mbits):
    """The scale of a block whose largest |v| has float32 bits ``m`` (NaN bits: the block holds a NaN)."""
    has_nan = m > np.uint32(0x7F800000)
    amax = np.float64(np.uint32(m).view(np.float32))
    e_field = np.int64(m >> np.uint32(23))
    if rule == FLOOR and 0 < e_field < 255:
        e = min(max(e_field - 127 - emax_e, lo), hi)  # frexp(amax)[1] - 1 - emax_e, clipped
        if -1022 <= e <= 1023:
            return np.int64((e + 1023) << 52).view(np.float64)  # 2**e
    if rule == AMAX and not has_nan and s_man >= 1:
        want = min(amax / max_e / t, s_max)
        return max(round_nearest_value(want, s_split, s_magic, s_min_normal, s_max, s_max, 0), s_min)
    return block_scale(amax, has_nan, rule, emax_e, max_e, lo, hi, s_man, s_emin, s_sub, s_max, s_min, t, mbits)


@njit(inline="always")
def _round_not_nan(x, split, magic, min_normal, max_value, negzero):
    """``round_nearest_value(x, split, magic, min_normal, max_value, max_value, negzero)`` for an x that is not
    NaN (its NaN selects dropped: with a finite ovf_value the result is never NaN)."""
    c = x * split
    y = c - (c - x)
    lo = (x + magic) - magic
    y = lo if abs(x) < min_normal else y
    y = y if abs(y) <= max_value else math.copysign(max_value, x)
    zero = math.copysign(0.0, x) if negzero != 0 else 0.0
    return zero if y == 0.0 else y


@njit(inline="always")
def _row_range(b, nbc, tc, C):
    """(start, size) of block b of a (rows, C) array cut into nbc blocks of tc per row (the last partial)."""
    r = b // nbc
    c0 = (b - r * nbc) * tc
    return r * C + c0, min(tc, C - c0)


@njit(inline="always")
def _blocks_f32(src, bits, dst, scales, tc, C, tiled, split, magic, min_normal, emax_e, max_e, negzero, rule, lo,
                hi, s_man, s_emin, s_sub, s_max, s_min, t, s_split, s_magic, s_min_normal, mbits):
    """Every block; ``tiled``: the blocks of tc tile the rows (block b is the flat [b*tc, b*tc + tc)). A
    ``prange`` loop (a plain one in the serial kernel)."""
    nbc = scales.size // (src.size // C)
    for b in prange(scales.size):
        if tiled:
            start, size = b * tc, tc
        else:
            start, size = _row_range(b, nbc, tc, C)
        m = np.uint32(0)
        for k in range(size):
            m = max(m, np.uint32(bits[start + k] & np.uint32(0x7FFFFFFF)))
        s = _fast_scale(m, rule, emax_e, max_e, lo, hi, s_man, s_emin, s_sub, s_max, s_min, t, s_split, s_magic,
                        s_min_normal, mbits)
        scales[b] = s
        full = s * t
        if m > np.uint32(0x7F800000):
            for k in range(size):
                dst[start + k] = np.nan
        elif rule != AMAX:
            inv = 1.0 / full  # exact: full is a power of two
            for k in range(size):
                v = np.float64(src[start + k]) * inv
                dst[start + k] = _round_not_nan(v, split, magic, min_normal, max_e, negzero) * full
        else:
            for k in range(size):
                v = np.float64(src[start + k]) / full
                dst[start + k] = _round_not_nan(v, split, magic, min_normal, max_e, negzero) * full


@njit(inline="always")
def _tiled_amax_scaled_f32(src, bits, dst, scales, tc, split, magic, min_normal, max_e, negzero, s_max, s_min, t,
                           s_split, s_magic, s_min_normal):
    """Blocks of tc tiling the flat array, amax scales (rule 1, a scale format with man >= 1): in chunks of 64
    blocks, the amaxes first (into ``scales``), then the 64 scales in one vectorised loop (``_fast_scale``'s
    expression, NaN for a block with a NaN), then the elements."""
    nb = scales.size
    for ch in prange(-(-nb // 64)):
        b0 = ch * 64
        b1 = min(b0 + 64, nb)
        for b in range(b0, b1):
            m = np.uint32(0)
            for k in range(tc):
                m = max(m, np.uint32(bits[b * tc + k] & np.uint32(0x7FFFFFFF)))
            scales[b] = np.float64(np.uint32(m).view(np.float32))  # NaN where the block holds one
        for b in range(b0, b1):
            amax = scales[b]
            want = min(amax / max_e / t, s_max)
            q = max(round_nearest_value(want, s_split, s_magic, s_min_normal, s_max, s_max, 0), s_min)
            scales[b] = q if amax == amax else math.nan
        for b in range(b0, b1):
            s = scales[b]
            start = b * tc
            if s != s:
                for k in range(tc):
                    dst[start + k] = np.nan
            else:
                full = s * t
                for k in range(tc):
                    v = np.float64(src[start + k]) / full
                    dst[start + k] = _round_not_nan(v, split, magic, min_normal, max_e, negzero) * full


# The block loop four times over: blocks of 32 and of 16 that tile the rows (every MX, MSFP and NVFP4 preset on
# a row length that is a multiple of the block), whose constant trip count LLVM unrolls (~1.5x the speed of a
# variable one), OCP scales or (16) NVFP4's amax scales; and any other block length, rule or a partial block.

@njit(inline="always")
def _rows_f32(src, bits, dst, scales, C, tc, man, emin, sub, emax_e, max_e, negzero, rule, lo, hi, s_man, s_emin,
              s_sub, s_max, s_min, t):
    split, magic, min_normal = _nearest_constants(0, man, emin, sub)
    s_split, s_magic, s_min_normal = _nearest_constants(0 if s_man >= 1 else 1, s_man, s_emin, s_sub)
    if tc == 32 and C % 32 == 0 and rule == 0:  # rule as a constant: LLVM drops the other rule's loop
        _blocks_f32(src, bits, dst, scales, 32, C, True, split, magic, min_normal, emax_e, max_e, negzero, 0, lo,
                    hi, s_man, s_emin, s_sub, s_max, s_min, t, s_split, s_magic, s_min_normal, man)
    elif tc == 16 and C % 16 == 0 and rule == 0:
        _blocks_f32(src, bits, dst, scales, 16, C, True, split, magic, min_normal, emax_e, max_e, negzero, 0, lo,
                    hi, s_man, s_emin, s_sub, s_max, s_min, t, s_split, s_magic, s_min_normal, man)
    elif tc == 16 and C % 16 == 0 and rule == 1 and s_man >= 1:
        _tiled_amax_scaled_f32(src, bits, dst, scales, 16, split, magic, min_normal, max_e, negzero, s_max, s_min, t,
                               s_split, s_magic, s_min_normal)
    else:
        _blocks_f32(src, bits, dst, scales, tc, C, False, split, magic, min_normal, emax_e, max_e, negzero, rule,
                    lo, hi, s_man, s_emin, s_sub, s_max, s_min, t, s_split, s_magic, s_min_normal, man)


@njit(cache=True)
def rows_f32_serial(src, bits, dst, scales, C, tc, man, emin, sub, emax_e, max_e, negzero, rule, lo, hi, s_man,
                    s_emin, s_sub, s_max, s_min, t):
    """Flat float32 src (its uint32 ``bits`` view) as rows of C in blocks of tc; scales: flat float64."""
    _rows_f32(src, bits, dst, scales, C, tc, man, emin, sub, emax_e, max_e, negzero, rule, lo, hi, s_man, s_emin,
              s_sub, s_max, s_min, t)


@njit(cache=True, parallel=True)
def rows_f32_parallel(src, bits, dst, scales, C, tc, man, emin, sub, emax_e, max_e, negzero, rule, lo, hi, s_man,
                      s_emin, s_sub, s_max, s_min, t):
    """``rows_f32_serial``, parallel over blocks."""
    _rows_f32(src, bits, dst, scales, C, tc, man, emin, sub, emax_e, max_e, negzero, rule, lo, hi, s_man, s_emin,
              s_sub, s_max, s_min, t)


@njit(cache=True)
def finite_amax_serial(bits):
    """The bits of the largest finite magnitude among float32 ``bits`` (0 if none)."""
    return block_fast.finite_max_bits(bits, 0, bits.size)


def finite_amax(src: np.ndarray) -> float:
    """The largest finite |v| of a C-contiguous float32 array (0.0 if it has none), in one serial pass: it only
    reads, and one thread reads at about copy_'s bandwidth on the 2-core VM of benchmarks/RESULTS.md. (NVFP4
    with 1-D blocks takes ``block_amaxes`` instead, which also keeps each block's amax.)"""
    m = finite_amax_serial(src.reshape(-1).view(np.uint32))
    return float(np.array(m, dtype=np.uint32).view(np.float32))


@functools.lru_cache(maxsize=256)
def fast_path_of(args: tuple) -> str | None:
    """Which ``block_fast`` path a float32, 1-D, round-to-nearest call with these ``block_args`` takes:
    "pow2", "table" or None (the float64 loops below)."""
    if block_fast.pow2_ok(args):
        return "pow2"
    if block_fast.table_ok(args):
        return "table"
    return None


@functools.lru_cache(maxsize=16)
def _scale_table(args: tuple):
    """``block_fast.scale_table`` for ``block_args`` (T included), kept for repeated calls (read-only)."""
    mids, ups, vals = block_fast.table_of(args[:6])
    return block_fast.scale_table(mids, ups, vals, args[15], args[10], args[14], args[13])


def block_amaxes(src: np.ndarray, scales: np.ndarray, tc: int, parallel=None) -> float:
    """Each block's largest |v| (NaN where it holds one) into ``scales`` (float64, one per block), for
    ``quantize_blocks(scanned=True)``, and the largest finite |v| of the whole array returned (0.0 if none), for
    NVFP4's tensor scale; src: (P, R, C) C-contiguous float32 in 1-D blocks of tc along C. One pass, parallel
    over blocks (block_fast.amax_*)."""
    C = src.shape[2]
    if parallel is None:
        parallel = src.size >= PARALLEL_MIN and numba.get_num_threads() > 1
    bits = src.reshape(-1).view(np.uint32)
    amaxes = scales.reshape(-1)
    part = np.zeros(block_fast.amax_tasks(amaxes.size), np.uint32)
    threads.launch(block_fast.amax_range, part.size, bits, amaxes, part, C, tc, parallel=parallel)
    return float(np.array(part.max(initial=0), dtype=np.uint32).view(np.float32))


def _fast_path(src, dst, scales, tile, args: tuple, par: bool, scanned: bool) -> bool:
    """Run the ``block_fast`` kernel for these arguments and (tr, tc) tile, if one holds (pow2: 1-D blocks only);
    whether one ran."""
    path = fast_path_of(args)
    tr, tc = int(tile[0]), int(tile[1])
    if path is None or (path == "pow2" and tr != 1):
        return False
    kind, man, emin, sub, emax_e, max_e, negzero, rule, lo, hi, s_man, s_emin, s_sub, s_max, s_min, t = args
    flat, out, C = src.reshape(-1), dst.reshape(-1), src.shape[2]
    bits, dbits = flat.view(np.uint32), out.view(np.uint32)
    if path == "pow2":
        sc = scales.reshape(-1)
        threads.launch(block_fast.pow2_range, sc.size, flat, bits, out, dbits, sc, C, tc, man, emin, sub, emax_e,
                       max_e, negzero, lo, hi, s_man, s_emin, s_sub, s_max, s_min, rule, parallel=par)
    else:
        thr, val, k0 = _scale_table(args)
        sc = scales.reshape(-1)
        threads.launch(block_fast.table_range, block_fast.table_chunks(sc.size), bits, dbits, sc, scanned,
                       src.shape[1], C, tr, tc, thr, val, k0, negzero, max_e, s_man, s_emin, s_sub, s_max, s_min, t,
                       parallel=par)
    return True


def quantize_blocks(src: np.ndarray, dst: np.ndarray, scales: np.ndarray, tile, args: tuple, mode: int, key: int,
                    nbits: int, parallel=None, scanned: bool = False) -> None:
    """src, dst: (P, R, C) C-contiguous float32/float64 (dst may be src); scales: (P, nbr, nbc) float64;
    tile: (tr, tc); args: ``block_args`` of the format (emunum/block_quantize.py); scanned: ``scales`` holds
    ``block_amaxes``'s per-block maxima of src, which the amax-scaled fast path then starts from instead of
    scanning (every other path computes them itself)."""
    if parallel is None:
        parallel = src.size >= PARALLEL_MIN and numba.get_num_threads() > 1
    kind, man, emin, sub = args[:4]
    f32 = src.dtype == np.float32 and dst.dtype == np.float32
    fast = f32 and mode == NEAREST
    if f32 and mode == STOCHASTIC and block_sr.sr_ok(args):
        block_sr.quantize_sr(src, dst, scales, int(tile[1]), args, key, int(nbits), parallel, scanned, tr=int(tile[0]))
        return
    if fast and _fast_path(src, dst, scales, tile, args, parallel, scanned):
        return
    if fast and kind == 1 and block_sr.sr_ok(args):  # fixed elements under power-of-two scales (MXINT8, MXINT4)
        block_sr.quantize_sr(src, dst, scales, int(tile[1]), args, key, int(nbits), parallel, scanned,
                             tr=int(tile[0]), nearest=True)
        return
    if fast and kind == 0 and int(tile[0]) == 1:
        with _parallel.try_parallel(parallel) as par:  # one prange section per process (kernels/parallel.py)
            flat = src.reshape(-1)
            run = rows_f32_parallel if par else rows_f32_serial
            run(flat, flat.view(np.uint32), dst.reshape(-1), scales.reshape(-1), src.shape[2], int(tile[1]), man,
                emin, sub, *args[4:])
        return
    threads.launch(block_range, scales.size, src, dst, scales, int(tile[0]), int(tile[1]), *args, int(mode),
                   np.uint64(key), int(nbits), parallel=parallel)
