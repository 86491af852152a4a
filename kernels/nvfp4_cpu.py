"""Numba CPU kernels of the NVFP4 family's per-row outer scales and 4/6 selection (cores in
kernels/nvfp4_scalar.py), parallel over blocks (``prange``) for large tensors; every block is computed with the
same arguments on any thread count, so the bits never depend on it."""
import os

import numba
import numpy as np
from numba import njit, prange

from . import _cache, scalar
from . import parallel as _parallel
from .nvfp4_scalar import fos_block, row_block

_cache.guard(__file__, [*scalar.SOURCES, os.path.join(os.path.dirname(os.path.abspath(__file__)), "nvfp4_scalar.py")])

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


@njit(cache=True, error_model="numpy")
def nvfp4_serial(src, dst, scales, tr, tc, fos, t, ges, gds, gamax, denom, metric, kind, p0, p1, p2, emax_e, max_e,
                 negzero, rule, lo, hi, s_man, s_emin, s_sub, s_max, s_min, mode, key, nbits):
    for b in range(scales.size):
        _loop(src, dst, scales, tr, tc, fos, t, ges, gds, gamax, denom, metric, kind, p0, p1, p2, emax_e, max_e,
              negzero, rule, lo, hi, s_man, s_emin, s_sub, s_max, s_min, mode, key, nbits, b)


@njit(cache=True, parallel=True, error_model="numpy")
def nvfp4_parallel(src, dst, scales, tr, tc, fos, t, ges, gds, gamax, denom, metric, kind, p0, p1, p2, emax_e,
                   max_e, negzero, rule, lo, hi, s_man, s_emin, s_sub, s_max, s_min, mode, key, nbits):
    for b in prange(scales.size):
        _loop(src, dst, scales, tr, tc, fos, t, ges, gds, gamax, denom, metric, kind, p0, p1, p2, emax_e, max_e,
              negzero, rule, lo, hi, s_man, s_emin, s_sub, s_max, s_min, mode, key, nbits, b)


def quantize_nvfp4(src: np.ndarray, dst: np.ndarray, scales: np.ndarray, tile, lines: tuple, args: tuple, mode: int,
                   key: int, nbits: int, parallel=None) -> None:
    """src, dst: (P, R, C) C-contiguous float32/float64; scales (P, nbr, nbc) float64; lines: (fos, t, ges, gds,
    gamax, denom, metric) from emunum/nvfp4_quantize.py; args: ``block_args`` without its tensor scale."""
    if parallel is None:
        parallel = src.size >= PARALLEL_MIN and numba.get_num_threads() > 1
    with _parallel.try_parallel(parallel) as par:
        run = nvfp4_parallel if par else nvfp4_serial
        run(src, dst, scales, int(tile[0]), int(tile[1]), *lines, *args, int(mode), np.uint64(key), int(nbits))
