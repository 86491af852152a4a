"""Numba CPU kernels for codebooks (``TableFormat``): serial and ``prange`` loops over flat float32/float64
arrays calling ``scalar.round_table_value``; element i gets the same arguments in both, so the bits never
depend on the thread count. ``table_runner`` binds a format for ``emunum.quantize`` (raw addresses)."""

import numpy as np
from numba import carray, njit, prange

from . import _cache, parallel as _parallel, scalar

_cache.guard(__file__, scalar.SOURCES)

from .cpu import _VALUE_WITNESS, _check_dtype, _voidptr, use_parallel  # noqa: E402
from .scalar import STOCHASTIC, random_bits, round_table_value  # noqa: E402


@njit(cache=True)
def table_serial(src, dst, tab, n, snap32, mode, key, nbits):
    for i in range(src.size):
        rnd = random_bits(key, i, nbits) if mode == STOCHASTIC else np.uint64(0)
        dst[i] = round_table_value(np.float64(src[i]), tab, n, snap32, mode, rnd, nbits)


@njit(cache=True, parallel=True)
def table_parallel(src, dst, tab, n, snap32, mode, key, nbits):
    for i in prange(src.size):
        rnd = random_bits(key, i, nbits) if mode == STOCHASTIC else np.uint64(0)
        dst[i] = round_table_value(np.float64(src[i]), tab, n, snap32, mode, rnd, nbits)


@njit(cache=True)
def table_at(src, dst, size, w, par, tab, n, snap32, mode, key, nbits):
    s, d = carray(_voidptr(src), size, w.dtype), carray(_voidptr(dst), size, w.dtype)
    if par:
        table_parallel(s, d, tab, n, snap32, mode, key, nbits)
    else:
        table_serial(s, d, tab, n, snap32, mode, key, nbits)


def table_runner(dtype, n, tab):
    """``run(src, dst, size, mode, key, nbits, parallel=None)`` on raw addresses of ``size`` contiguous
    float32/float64 values (dst may be src), for the table ``tab`` of ``n`` values (kernel layout). In
    float32 arrays, the float32 roundings of the table values are exact too (snap32)."""
    dt = _check_dtype(dtype)
    w, n, snap32 = _VALUE_WITNESS[dt], np.int64(n), np.int64(dt == np.float32)

    def run(src: int, dst: int, size: int, mode, key, nbits, parallel=None) -> None:
        with _parallel.try_parallel(use_parallel(size, parallel)) as par:
            table_at(src, dst, size, w, par, tab, n, snap32, mode, np.uint64(key), nbits)

    return run


def quantize_table(src: np.ndarray, dst: np.ndarray, n, tab, mode, key, nbits, parallel=None):
    """Round the flat float32/float64 array ``src`` into ``dst`` (same dtype and size; may be ``src``)."""
    with _parallel.try_parallel(use_parallel(src.size, parallel)) as par:
        run = table_parallel if par else table_serial
        run(src, dst, tab, np.int64(n), np.int64(src.dtype == np.float32), mode, np.uint64(key), nbits)

