"""Numba CPU kernel of the MX+ block formats (core: kernels/mxplus_scalar.py), parallel over blocks (shares of
them on threads, ``threads.launch``) for large tensors; every block is computed with the same arguments on any
thread count, so the bits never depend on it."""
import os

import numba
import numpy as np
from numba import njit

from . import _cache, block_sr, mxplus_fast, scalar, threads
from .mxplus_scalar import mxplus_block
from .scalar.common import NEAREST, STOCHASTIC

_cache.guard(__file__, [*scalar.SOURCES, *(os.path.join(os.path.dirname(os.path.abspath(__file__)), f)
                                            for f in ("mxplus_scalar.py", "mxplus_fast.py", "nvfp4_scalar.py"))])

PARALLEL_MIN = 1 << 18  # the plain block kernel's figure (kernels/block_cpu.py)


@njit(cache=True, nogil=True)
def mxplus_range(b0, b1, src, dst, scales, tr, tc, man, emin, sub, emax_e, max_e, negzero, lo, hi, pbits, split, magic,
                 min_normal, mode, key, nbits):
    """Blocks b0..b1-1 of ``scales.size``."""
    for b in range(b0, b1):
        mxplus_block(src, dst, scales, b, tr, tc, man, emin, sub, emax_e, max_e, negzero, lo, hi, pbits, split, magic,
                     min_normal, mode, key, nbits)


def quantize_mxplus(src: np.ndarray, dst: np.ndarray, scales: np.ndarray, tile, args: tuple, mode: int, key: int,
                    nbits: int, parallel=None) -> None:
    """src, dst: (P, R, C) C-contiguous float32/float64; scales (P, nbr, nbc) float64; args: ``mxplus_args``
    (emunum/mxplus_quantize.py)."""
    if parallel is None:
        parallel = src.size >= PARALLEL_MIN and numba.get_num_threads() > 1
    fast = (int(tile[0]) == 1 and src.dtype == np.float32 and dst.dtype == np.float32 and mode == NEAREST
            and mxplus_fast.fast_ok(args))
    if fast:  # float32, 1-D blocks, nearest: kernels/mxplus_fast.py (the same bits)
        flat, sc = src.reshape(-1), scales.reshape(-1)
        threads.launch(mxplus_fast.fast_range, mxplus_fast.chunks(sc.size), flat, flat.view(np.uint32), dst.reshape(-1),
                       sc, src.shape[2], int(tile[1]), *args[:9], parallel=parallel)
        return
    if src.dtype == np.float32 and dst.dtype == np.float32 and mode == STOCHASTIC:
        plain = block_sr.mxplus_block_args(args)
        if block_sr.sr_ok(plain):  # kernels/block_sr.py, the same bits
            block_sr.quantize_sr(src, dst, scales, int(tile[1]), plain, key, int(nbits), parallel, False,
                                 tr=int(tile[0]), pbits=int(args[8]))
            return
    threads.launch(mxplus_range, scales.size, src, dst, scales, int(tile[0]), int(tile[1]), *args, int(mode),
                   np.uint64(key), int(nbits), parallel=parallel)
