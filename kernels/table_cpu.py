"""Numba CPU kernels for codebooks (``TableFormat``): one loop over a range of a flat float32/float64 array, run
whole or in shares on threads (``threads.launch``), calling ``scalar.round_table_value``; element i gets the
same arguments in every share, so the bits never depend on the thread count. ``table_runner`` binds a format for
``emunum.quantize`` (raw addresses)."""

import numpy as np
from numba import carray, njit

from . import _cache, scalar, threads

_cache.guard(__file__, scalar.SOURCES)

from .cpu import _VALUE_WITNESS, _check_dtype, _voidptr, use_parallel  # noqa: E402
from .scalar import STOCHASTIC, random_bits, round_table_value  # noqa: E402


@njit(cache=True, nogil=True)
def table_range(lo, hi, src, dst, tab, n, snap32, mode, key, nbits):
    """Elements lo..hi-1 of ``src`` rounded into ``dst``."""
    for i in range(lo, hi):
        rnd = random_bits(key, i, nbits) if mode == STOCHASTIC else np.uint64(0)
        dst[i] = round_table_value(np.float64(src[i]), tab, n, snap32, mode, rnd, nbits)


@njit(cache=True, nogil=True)
def table_at(lo, hi, src, dst, size, w, tab, n, snap32, mode, key, nbits):
    """``table_range`` over elements lo..hi-1 of the ``size`` values of w's dtype at addresses src, dst."""
    s, d = carray(_voidptr(src), size, w.dtype), carray(_voidptr(dst), size, w.dtype)
    table_range(lo, hi, s, d, tab, n, snap32, mode, key, nbits)


def table_runner(dtype, n, tab):
    """``run(src, dst, size, mode, key, nbits, parallel=None)`` on raw addresses of ``size`` contiguous
    float32/float64 values (dst may be src), for the table ``tab`` of ``n`` values (kernel layout). In
    float32 arrays, the float32 roundings of the table values are exact too (snap32)."""
    dt = _check_dtype(dtype)
    w, n, snap32 = _VALUE_WITNESS[dt], np.int64(n), np.int64(dt == np.float32)

    def run(src: int, dst: int, size: int, mode, key, nbits, parallel=None) -> None:
        threads.launch(table_at, size, src, dst, size, w, tab, n, snap32, mode, np.uint64(key), nbits,
                       parallel=use_parallel(size, parallel))

    return run


def quantize_table(src: np.ndarray, dst: np.ndarray, n, tab, mode, key, nbits, parallel=None):
    """Round the flat float32/float64 array ``src`` into ``dst`` (same dtype and size; may be ``src``)."""
    threads.launch(table_range, src.size, src, dst, tab, np.int64(n), np.int64(src.dtype == np.float32), mode,
                   np.uint64(key), nbits, parallel=use_parallel(src.size, parallel))

