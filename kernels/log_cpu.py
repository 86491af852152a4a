"""Numba CPU kernels for logarithmic numbers (``LogFormat``): serial and ``prange`` loops over flat
float32/float64 arrays calling ``scalar.round_log_value`` (same bits on any thread count).
``log_runner`` binds a format for ``emunum.quantize`` (raw addresses)."""
import numpy as np
from numba import carray, njit, prange

from . import _cache, parallel as _parallel, scalar

_cache.guard(__file__, scalar.SOURCES)

from .cpu import _VALUE_WITNESS, _check_dtype, _voidptr, use_parallel  # noqa: E402
from .scalar import STOCHASTIC, random_bits, round_log_value  # noqa: E402


@njit(cache=True)
def log_serial(src, dst, tab, frac_bits, kmin, kmax, signed, snap32, mode, key, nbits):
    for i in range(src.size):
        rnd = random_bits(key, i, nbits) if mode == STOCHASTIC else np.uint64(0)
        dst[i] = round_log_value(np.float64(src[i]), tab, frac_bits, kmin, kmax, signed, snap32, mode, rnd, nbits)


@njit(cache=True, parallel=True)
def log_parallel(src, dst, tab, frac_bits, kmin, kmax, signed, snap32, mode, key, nbits):
    for i in prange(src.size):
        rnd = random_bits(key, i, nbits) if mode == STOCHASTIC else np.uint64(0)
        dst[i] = round_log_value(np.float64(src[i]), tab, frac_bits, kmin, kmax, signed, snap32, mode, rnd, nbits)


@njit(cache=True)
def log_at(src, dst, size, w, par, tab, frac_bits, kmin, kmax, signed, snap32, mode, key, nbits):
    s, d = carray(_voidptr(src), size, w.dtype), carray(_voidptr(dst), size, w.dtype)
    if par:
        log_parallel(s, d, tab, frac_bits, kmin, kmax, signed, snap32, mode, key, nbits)
    else:
        log_serial(s, d, tab, frac_bits, kmin, kmax, signed, snap32, mode, key, nbits)


def _ints(frac_bits, kmin, kmax, signed, dtype):
    """The core's int arguments; snap32 (float32 arrays: their values of the codes are exact too) last."""
    return np.int64(frac_bits), np.int64(kmin), np.int64(kmax), np.int64(signed), np.int64(dtype == np.float32)


def log_runner(dtype, frac_bits, kmin, kmax, signed, tab):
    """``run(src, dst, size, mode, key, nbits, parallel=None)`` on raw addresses (see ``table_runner``)."""
    dt = _check_dtype(dtype)
    w, pre = _VALUE_WITNESS[dt], _ints(frac_bits, kmin, kmax, signed, dt)

    def run(src: int, dst: int, size: int, mode, key, nbits, parallel=None) -> None:
        with _parallel.try_parallel(use_parallel(size, parallel)) as par:
            log_at(src, dst, size, w, par, tab, *pre, mode, np.uint64(key), nbits)

    return run


def quantize_log(src: np.ndarray, dst: np.ndarray, frac_bits, kmin, kmax, signed, tab, mode, key, nbits,
                 parallel=None):
    """Round the flat float32/float64 array ``src`` into ``dst`` (same dtype and size; may be ``src``)."""
    with _parallel.try_parallel(use_parallel(src.size, parallel)) as par:
        run = log_parallel if par else log_serial
        run(src, dst, tab, *_ints(frac_bits, kmin, kmax, signed, src.dtype), mode, np.uint64(key), nbits)

