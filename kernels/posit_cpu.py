"""Numba CPU kernels for posits (``PositFormat``): one serial loop over a range of a flat float32/float64 array,
run whole or in shares on threads (``threads.launch``), calling the shared scalar core
``scalar.posit.round_posit_value`` (the CUDA kernel calls the same core).

Element i gets the same arguments on any thread count (stochastic bits keyed on (key, i)), so the bits never
depend on it. The value is rounded in float64 and stored with a cast to the array's dtype (to nearest even):
exact whenever the posit's value fits that dtype. NaR is written as NaN: the positive quiet NaN for an infinite
input; a NaN input is copied as bits with the quiet bit set (its sign and payload kept).
"""
import functools

import numpy as np
from numba import carray, njit

from . import _cache, scalar, threads
from .cpu import _check_dtype, _voidptr, use_parallel
from .scalar.common import STOCHASTIC, random_bits
from .scalar.posit import round_posit_value

_cache.guard(__file__, scalar.SOURCES)


@njit(cache=True, nogil=True)
def posit_range(lo, hi, src, dst, sbits, dbits, quiet, nbits, es, mode, key, srbits):
    """Elements lo..hi-1 of ``src`` rounded into ``dst`` (sbits, dbits: their unsigned-int views)."""
    for i in range(lo, hi):
        x = src[i]
        if x != x:
            dbits[i] = sbits[i] | quiet
        else:
            rnd = random_bits(key, i, srbits) if mode == STOCHASTIC else np.uint64(0)
            dst[i] = round_posit_value(np.float64(x), nbits, es, mode, rnd, srbits)


@njit(cache=True, nogil=True)
def posit_at(lo, hi, src, dst, n, w, wb, quiet, nbits, es, mode, key, srbits):
    """``posit_range`` over elements lo..hi-1 of the n values of w's dtype at addresses src, dst."""
    s, d = carray(_voidptr(src), n, w.dtype), carray(_voidptr(dst), n, w.dtype)
    sb, db = carray(_voidptr(src), n, wb.dtype), carray(_voidptr(dst), n, wb.dtype)
    posit_range(lo, hi, s, d, sb, db, quiet, nbits, es, mode, key, srbits)


# dtype -> (value witness, bits witness, quiet bit): a NaN is copied as bits with the quiet bit set, so that it
# comes back quietened with its sign and payload whatever the compiler does with NaN values
_WITNESS = {np.dtype(np.float32): (np.empty(0, np.float32), np.empty(0, np.uint32), np.uint64(1 << 22)),
            np.dtype(np.float64): (np.empty(0, np.float64), np.empty(0, np.uint64), np.uint64(1 << 51))}


def posit_runner(dtype, nbits: int, es: int):
    """``run(src, dst, n, mode, key, srbits, parallel=None)`` rounding ``n`` contiguous ``dtype`` values
    (float32/float64) at address ``src`` into those at ``dst`` (may equal ``src``); the caller keeps both
    buffers alive for the call. Cached per (dtype, nbits, es)."""
    return _posit_runner(_check_dtype(dtype), int(nbits), int(es))


@functools.lru_cache(maxsize=256)
def _posit_runner(dt, nbits, es):
    w, wb, quiet = _WITNESS[dt]

    def run(src: int, dst: int, n: int, mode, key, srbits, parallel=None) -> None:
        threads.launch(posit_at, n, src, dst, n, w, wb, quiet, nbits, es, int(mode), np.uint64(key), int(srbits),
                       parallel=use_parallel(n, parallel))

    return run


def quantize_posit(src: np.ndarray, dst: np.ndarray, nbits, es, mode, key, srbits, parallel=None):
    """Round the flat float32/float64 array ``src`` to the posit format (nbits, es) into ``dst`` (same dtype
    and size; may be ``src``)."""
    _check_dtype(src.dtype)
    if dst.dtype != src.dtype or dst.size != src.size:
        raise ValueError(f"dst must match src in size and dtype: src is {src.size} x {src.dtype}, "
                         f"dst is {dst.size} x {dst.dtype}")
    _, wb, quiet = _WITNESS[src.dtype]
    threads.launch(posit_range, src.size, src, dst, src.view(wb.dtype), dst.view(wb.dtype), quiet, int(nbits), int(es),
                   int(mode), np.uint64(key), int(srbits), parallel=use_parallel(src.size, parallel))
