"""Numba CPU kernels of the NVFP4 family's per-row outer scales and 4/6 selection (cores in
kernels/nvfp4_scalar.py), parallel over blocks (``threads.launch``) for large tensors; every block is computed with the
same arguments on any thread count, so the bits never depend on it. Float32 data rounded to nearest with an
e2m1-like element takes kernels/nvfp4_fast.py (4/6 in blocks of 16 columns: kernels/nvfp4_fos_fast.py), the same
bits, where its conditions hold (``fast_ok``); float32 4/6 with an e2m1 element rounded stochastically takes
kernels/nvfp4_fos_sr.py (``fos_sr_ok``); float32 data with per-row outer scales rounded stochastically takes
kernels/block_sr.py with the per-row T_r (``quantize_rows``), the same bits as ``row_block``."""
import functools
import math
import os

import numba
import numpy as np
from numba import njit

from . import _cache, block_fast, block_sr, nvfp4_fast, nvfp4_fos_fast, nvfp4_fos_sr, scalar, threads
from .nvfp4_scalar import fos_block, row_block
from .scalar.block import AMAX
from .scalar.common import NEAREST, STOCHASTIC

_cache.guard(__file__, [*scalar.SOURCES, os.path.join(os.path.dirname(os.path.abspath(__file__)), "nvfp4_scalar.py")])

_FLT_MAX = float(np.finfo(np.float32).max)
PARALLEL_MIN = 1 << 16  # fewer elements than the plain block kernel's figure: a 4/6 block costs ~3 plain ones


@njit(error_model="numpy")
def _loop(src, dst, scales, tr, tc, fos, t, ges, gds, gamax, denom, metric, kind, p0, p1, p2, emax_e, max_e, negzero,
          rule, lo, hi, s_man, s_emin, s_sub, s_max, s_min, mode, key, nbits, b):
    if fos:
        fos_block(src, dst, scales, b, tr, tc, ges, gds, gamax, denom, metric, p0, p1, p2, max_e, negzero, s_man,
                  s_emin, s_sub, s_max, mode, key, nbits)
    else:
        row_block(src, dst, scales, b, tr, tc, t, kind, p0, p1, p2, emax_e, max_e, negzero, rule, lo, hi, s_man,
                  s_emin, s_sub, s_max, s_min, mode, key, nbits)


@njit(cache=True, nogil=True, error_model="numpy")
def nvfp4_range(b0, b1, src, dst, scales, tr, tc, fos, t, ges, gds, gamax, denom, metric, kind, p0, p1, p2, emax_e,
                max_e, negzero, rule, lo, hi, s_man, s_emin, s_sub, s_max, s_min, mode, key, nbits):
    """Blocks b0..b1-1 by the scalar cores; one kernel for the serial call and for each thread's share
    (``threads.launch``): every block's operations depend on its index only."""
    for b in range(b0, b1):
        _loop(src, dst, scales, tr, tc, fos, t, ges, gds, gamax, denom, metric, kind, p0, p1, p2, emax_e, max_e,
              negzero, rule, lo, hi, s_man, s_emin, s_sub, s_max, s_min, mode, key, nbits, b)


def fast_ok(src: np.ndarray, dst: np.ndarray, tile, fos: bool, args: tuple, mode: int) -> bool:
    """Whether kernels/nvfp4_fast.py holds: float32 src and dst, round to nearest, an element of seven positive
    values (e2m1), an amax rule into a float scale format with man >= 1; for per-row outer scales 1-D blocks and
    every M_i * S * T exact in float64 (kernels/block_fast.py's ``table_ok``), for 4/6 blocks of 1 or 16 rows."""
    kind, man, emin, sub, emax_e, max_e, negzero, rule, lo, hi, s_man, s_emin, s_sub, s_max, s_min = args
    if not (src.dtype == np.float32 and dst.dtype == np.float32 and mode == NEAREST and rule == 1 and s_man >= 1
            and block_fast.element_table(tuple(args[:6])) is not None):
        return False
    if fos:
        return int(tile[0]) in (1, 16)
    return int(tile[0]) == 1 and man + 2 + s_man + 1 + 24 <= 53 and 2.0**-1000 < s_min <= s_max < 2.0**1000


def fos_sr_ok(src: np.ndarray, dst: np.ndarray, tile, args: tuple, mode: int, gds_max: float) -> bool:
    """Whether kernels/nvfp4_fos_sr.py holds for 4/6: float32 src and dst, stochastic rounding, an e2m1 element
    (man 1, emin 0, subnormals, max 6), an amax rule into a float scale format with man >= 1, blocks of 1 or 16
    rows, and every encode scale positive: s_max * gds_max (the largest outer decode scale) at most FLT_MAX."""
    kind, man, emin, sub, emax_e, max_e, negzero, rule, lo, hi, s_man, s_emin, s_sub, s_max, s_min = args
    return (src.dtype == np.float32 and dst.dtype == np.float32 and mode == STOCHASTIC and int(tile[0]) in (1, 16)
            and (kind, man, emin, sub, max_e) == (0, 1, 0, 1, 6.0) and rule == 1 and s_man >= 1
            and 0.0 < s_max < math.inf and float(s_max) * float(gds_max) <= _FLT_MAX)


def _run_fos_sr(src, dst, scales, tile, ges, gds, gamax, denom, metric, args, key, nbits, par) -> None:
    """``nvfp4_fos_sr.fos_sr_range`` over every chunk (on threads where ``par``) of (P, R, C) src/dst with the
    line arrays (float32, P * R); blocks of 16 columns whose scale format passes ``scale32_ok`` take the lanes
    kernel (``nvfp4_fos_fast.fos_lanes_range`` rounding stochastically: the same bits)."""
    m, vl, lanes = _fos_constants(tuple(args[:6]))
    if int(tile[1]) == 16 and lanes and nvfp4_fos_fast.scale32_ok(*args[10:14]):
        flat, rest = _fos_arguments(src, dst, scales, tile, ges, gds, gamax, denom, metric, m, vl, args)
        _run_fos_lanes(flat, rest, par, key, nbits)
        return
    bits, dbits = src.reshape(-1).view(np.uint32), dst.reshape(-1).view(np.uint32)
    threads.launch(nvfp4_fos_sr.fos_sr_range, nvfp4_fos_sr.chunks(scales), bits, dbits, scales, src.shape[1],
                   src.shape[2], int(tile[0]), int(tile[1]), ges, gds, gamax, np.float32(denom), int(metric), args[6],
                   *args[10:14], np.uint64(key), int(nbits), parallel=par)


def row_amax(src: np.ndarray, parallel=None) -> np.ndarray:
    """The largest finite |x| of each row (float64, P * R) of a (P, R, C) C-contiguous float32 array."""
    if parallel is None:
        parallel = src.size >= PARALLEL_MIN and numba.get_num_threads() > 1
    out = np.empty(src.shape[0] * src.shape[1], np.float64)
    threads.launch(nvfp4_fast.row_amax_range, out.size, src.reshape(-1).view(np.uint32), out, src.shape[2],
                   parallel=parallel)
    return out


def quantize_rows(src: np.ndarray, dst: np.ndarray, scales: np.ndarray, tile, args: tuple, mode: int, key: int,
                  nbits: int, parallel=None) -> bool:
    """Per-row outer scales on float32 data, T_r computed by ``nvfp4_fast.row_scales_range``: rounded to nearest by
    kernels/nvfp4_fast.py where ``fast_ok`` holds, stochastically by kernels/block_sr.py (amax scales; the per-row
    T_r in place of its tensor scale, the blocks' amaxes from the same pass) where ``block_sr.rows_ok`` holds;
    whether it ran (else the caller runs ``quantize_nvfp4``, the same bits). Arguments as ``quantize_nvfp4``'s."""
    f32_rows = src.dtype == np.float32 and dst.dtype == np.float32 and int(tile[0]) == 1
    sr = f32_rows and mode == STOCHASTIC and args[7] == AMAX and block_sr.sr_ok((*args, 1.0))
    if not (sr or fast_ok(src, dst, tile, False, args, mode)):
        return False
    if parallel is None:
        parallel = src.size >= PARALLEL_MIN and numba.get_num_threads() > 1
    kind, man, emin, sub, emax_e, max_e, negzero, rule, lo, hi, s_man, s_emin, s_sub, s_max, s_min = args
    t = np.empty(src.shape[0] * src.shape[1], np.float64)
    bits = src.reshape(-1).view(np.uint32)
    dbits = dst.reshape(-1).view(np.uint32)
    threads.launch(nvfp4_fast.row_scales_range, t.size, bits, scales.reshape(-1), t, src.shape[2], int(tile[1]),
                   max_e * s_max, parallel=parallel)
    if sr:
        if not block_sr.rows_ok(args, t):
            return False
        block_sr.quantize_sr(src, dst, scales, int(tile[1]), args, key, int(nbits), parallel, True, t_rows=t)
        return True
    mids, ups, vals = block_fast.element_table(tuple(args[:6]))
    threads.launch(nvfp4_fast.row_range, nvfp4_fast.chunks(scales.size), bits, dbits, scales.reshape(-1), t,
                   src.shape[2], int(tile[1]), mids, ups, vals, max_e, negzero, s_man, s_emin, s_sub, s_max, s_min,
                   parallel=parallel)
    return True


def quantize_nvfp4(src: np.ndarray, dst: np.ndarray, scales: np.ndarray, tile, lines: tuple, args: tuple, mode: int,
                   key: int, nbits: int, parallel=None, fast: bool = True) -> None:
    """src, dst: (P, R, C) C-contiguous float32/float64; scales (P, nbr, nbc) float64; lines: (fos, t, ges, gds,
    gamax, denom, metric) from emunum/nvfp4_quantize.py; args: ``block_args`` without its tensor scale; fast:
    4/6 may take the fast paths (False: the scalar cores alone, for tests)."""
    if parallel is None:
        parallel = src.size >= PARALLEL_MIN and numba.get_num_threads() > 1
    fos, _, ges, gds, gamax, denom, metric = lines
    if fast and fos and gds.size and fos_sr_ok(src, dst, tile, args, mode, float(gds.max())):
        _run_fos_sr(src, dst, scales, tile, ges, gds, gamax, denom, metric, args, key, nbits, parallel)
        return
    if fast and fos and fast_ok(src, dst, tile, True, args, mode):
        m, vl, lanes = _fos_constants(tuple(args[:6]))
        flat, rest = _fos_arguments(src, dst, scales, tile, ges, gds, gamax, denom, metric, m, vl, args)
        if int(tile[1]) == 16 and lanes and nvfp4_fos_fast.scale32_ok(*args[10:14]):  # lanes = blocks
            _run_fos_lanes(flat, rest, parallel)
        else:
            threads.launch(nvfp4_fast.fos_range, nvfp4_fast.chunks(scales.size), *flat, int(tile[1]), *rest,
                           parallel=parallel)
        return
    out = dst
    if src.dtype == np.float32 and dst.dtype == np.float32:
        # The scalar cores read x as float64 (exact for a float32 x) and store float64 values, which a float32 dst
        # rounds once to nearest-even: on float64 copies, rounded to float32 once at the end, the bits are the
        # same, and the scalar-core kernel (~30 CPU-s to compile) needs only its float64 signature.
        src, dst = src.astype(np.float64), np.empty(src.shape, np.float64)
    threads.launch(nvfp4_range, scales.size, src, dst, scales, int(tile[0]), int(tile[1]), *lines, *args, int(mode),
                   np.uint64(key), int(nbits), parallel=parallel)
    if out is not dst:
        with np.errstate(over="ignore"):  # a value past FLT_MAX is inf, as the float32 store makes it
            out[...] = dst


def tensor_line_values(finite_bits: int, denom) -> tuple:
    """(gamax, ges, gds) as float32 scalars of 4/6 with a tensor outer scale, from the bits of the tensor's largest
    finite |x|: emunum/nvfp4_quantize.py's float32 rule (ges = min(denom / gamax, FLT_MAX), 1 if 0; gds = 1 /
    ges), each operation one IEEE float32 rounding as torch's. The quotient denom / gamax is taken in float64 and
    then rounded to float32, which is float32's quotient (53 >= 2 * 24 + 2 bits) and needs no floating-point
    warnings switched off; clamped first, a float64 quotient past FLT_MAX gives FLT_MAX, as float32's inf does."""
    gamax = np.uint32(finite_bits).view(np.float32)
    ges = np.float32(min(float(np.float32(denom)) / float(gamax), _FLT_MAX)) if gamax != 0 else np.float32(_FLT_MAX)
    ges = np.float32(1.0) if ges == 0 else ges
    return gamax, ges, np.float32(np.float32(1.0) / ges)


@functools.lru_cache(maxsize=64)
def _fos_constants(elem_args: tuple) -> tuple:
    """(m, vl, lanes): ``nvfp4_fast.e2m1_constants`` of ``block_args[:6]``, and whether its values are e2m1's
    (kernels/nvfp4_fos_fast.py then holds)."""
    m, vl = nvfp4_fast.e2m1_constants(*block_fast.element_table(elem_args))
    return m, vl, nvfp4_fos_fast.e2m1_values(vl)


def _run_fos_lanes(flat: tuple, rest: tuple, par: bool, key: int = 0, nbits: int | None = None) -> None:
    """``nvfp4_fos_fast.fos_lanes_range`` over every unit (on threads where ``par``), ``_fos_arguments``';
    rounded stochastically with ``nbits`` random bits under ``key`` where nbits is given, else to nearest."""
    threads.launch(nvfp4_fos_fast.fos_lanes_range, nvfp4_fos_fast.units(flat[3], flat[5]), *flat, *rest,
                   np.uint64(key), 32 if nbits is None else int(nbits), nbits is not None, parallel=par)


def _fos_arguments(src, dst, scales, tile, ges, gds, gamax, denom, metric, m, vl, args: tuple) -> tuple:
    """(flat, rest): the arguments of the fast 4/6 kernels (``nvfp4_fos_fast.fos_lanes_range``: flat + rest;
    ``nvfp4_fast.fos_range``: flat, the tile's width, rest) for (P, R, C) src/dst, the line arrays and
    ``block_args``."""
    flat = (src.reshape(-1), src.reshape(-1).view(np.uint32), dst.reshape(-1).view(np.uint32), scales,
            src.shape[1], src.shape[2], int(tile[0]))
    rest = (ges, gds, gamax, np.float32(denom), int(metric), m, vl, args[6], *args[10:14])
    return flat, rest


def quantize_fos_tensor(src: np.ndarray, dst: np.ndarray, scales: np.ndarray, tile, denom, metric: int, args: tuple,
                        mode: int, key: int = 0, nbits: int = 32, parallel=None) -> bool:
    """4/6 with a tensor outer scale in blocks of 16 columns by kernels/nvfp4_fos_fast.py where ``fast_ok`` holds,
    or in blocks of 1 or 16 rows rounded stochastically by kernels/nvfp4_fos_sr.py where ``fos_sr_ok`` holds,
    the tensor's amax found here by ``nvfp4_fast.row_amax_range`` (one pass over the bits, parallel like the rest);
    whether it ran (else the caller makes the line arrays and runs ``quantize_nvfp4``). The same bits as
    ``quantize_nvfp4`` with emunum/nvfp4_quantize.py's line arrays (``tensor_line_values``)."""
    sr = fos_sr_ok(src, dst, tile, args, mode, 0.0)  # gds checked below
    if not sr and (int(tile[1]) != 16 or not fast_ok(src, dst, tile, True, args, mode)):
        return False
    if parallel is None:
        parallel = src.size >= PARALLEL_MIN and numba.get_num_threads() > 1
    P, R, C = src.shape
    bits = src.reshape(-1).view(np.uint32)
    m, vl, lanes = _fos_constants(tuple(args[:6]))
    n = P * R
    rows = np.empty(n, np.float64)
    # the tensor's largest finite |x| from each row's (the kernel finds its blocks' maxima itself)
    threads.launch(nvfp4_fast.row_amax_range, n, bits, rows, C, parallel=parallel)
    gamax, ges, gds = tensor_line_values(int(np.float32(rows.max()).view(np.uint32)), denom)
    if sr:
        if not fos_sr_ok(src, dst, tile, args, mode, float(gds)):
            return False
        _run_fos_sr(src, dst, scales, tile, np.full(n, ges), np.full(n, gds), np.full(n, gamax), denom, metric,
                    args, key, nbits, parallel)
        return True
    if lanes and nvfp4_fos_fast.scale32_ok(*args[10:14]):  # quantize_nvfp4's call of the lanes kernel
        flat, rest = _fos_arguments(src, dst, scales, tile, np.full(n, ges), np.full(n, gds), np.full(n, gamax),
                                    denom, metric, m, vl, args)
        _run_fos_lanes(flat, rest, parallel)
        return True
    lines = (True, None, np.full(n, ges), np.full(n, gds), np.full(n, gamax), np.float32(denom), int(metric))
    quantize_nvfp4(src, dst, scales, tile, lines, args, mode, 0, 0, parallel=parallel)
    return True
