"""Numba CPU kernels for logarithmic numbers (``LogFormat``): one loop over a range of a flat float32/float64
array, run whole or in shares on threads (``threads.launch``), calling ``scalar.round_log_value`` (same bits on
any thread count).
``log_runner`` binds a format for ``emunum.quantize`` (raw addresses)."""
import numpy as np
from numba import carray, njit

from . import _cache, scalar, threads

_cache.guard(__file__, scalar.SOURCES)

from .cpu import _VALUE_WITNESS, _check_dtype, _voidptr, use_parallel  # noqa: E402
from .scalar import STOCHASTIC, random_bits, round_log_value  # noqa: E402


@njit(cache=True, nogil=True)
def log_range(lo, hi, src, dst, tab, frac_bits, kmin, kmax, signed, snap32, mode, key, nbits):
    """Elements lo..hi-1 of ``src`` rounded into ``dst``."""
    for i in range(lo, hi):
        rnd = random_bits(key, i, nbits) if mode == STOCHASTIC else np.uint64(0)
        dst[i] = round_log_value(np.float64(src[i]), tab, frac_bits, kmin, kmax, signed, snap32, mode, rnd, nbits)


@njit(cache=True, nogil=True)
def log_at(lo, hi, src, dst, size, w, tab, frac_bits, kmin, kmax, signed, snap32, mode, key, nbits):
    """``log_range`` over elements lo..hi-1 of the ``size`` values of w's dtype at addresses src, dst."""
    s, d = carray(_voidptr(src), size, w.dtype), carray(_voidptr(dst), size, w.dtype)
    log_range(lo, hi, s, d, tab, frac_bits, kmin, kmax, signed, snap32, mode, key, nbits)


def _ints(frac_bits, kmin, kmax, signed, dtype):
    """The core's int arguments; snap32 (float32 arrays: their values of the codes are exact too) last."""
    return np.int64(frac_bits), np.int64(kmin), np.int64(kmax), np.int64(signed), np.int64(dtype == np.float32)


def log_runner(dtype, frac_bits, kmin, kmax, signed, tab):
    """``run(src, dst, size, mode, key, nbits, parallel=None)`` on raw addresses (see ``table_runner``)."""
    dt = _check_dtype(dtype)
    w, pre = _VALUE_WITNESS[dt], _ints(frac_bits, kmin, kmax, signed, dt)

    def run(src: int, dst: int, size: int, mode, key, nbits, parallel=None) -> None:
        threads.launch(log_at, size, src, dst, size, w, tab, *pre, mode, np.uint64(key), nbits,
                       parallel=use_parallel(size, parallel))

    return run


def quantize_log(src: np.ndarray, dst: np.ndarray, frac_bits, kmin, kmax, signed, tab, mode, key, nbits,
                 parallel=None):
    """Round the flat float32/float64 array ``src`` into ``dst`` (same dtype and size; may be ``src``)."""
    threads.launch(log_range, src.size, src, dst, tab, *_ints(frac_bits, kmin, kmax, signed, src.dtype), mode,
                   np.uint64(key), nbits, parallel=use_parallel(src.size, parallel))

