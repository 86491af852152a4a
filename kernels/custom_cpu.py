"""Numba CPU kernels for user-defined types (``CustomFormat``).

- nearest: ``from_code(to_code(x))`` per element, the user's njit functions passed as first-class function
  arguments (numba compiles one specialisation per pair of functions, on the first call for that format and
  dtype; such kernels cannot be cached on disk, so each new format costs one compile per process).
- derived modes (toward_zero, up, down, stochastic; nbits <= 16): ``scalar.round_table_value`` over the
  type's finite values, finished by ``scalar.finish_derived`` (``cache=True``: no user code involved).
Serial and ``prange`` loops visit element i with the same arguments, so the bits never depend on the thread
count. ``custom_runner`` binds a format for ``emunum.quantize`` (raw addresses), like ``table_runner``.
"""
import numpy as np
from numba import carray, njit, prange

from . import _cache, parallel as _parallel, scalar

_cache.guard(__file__, scalar.SOURCES)

from .cpu import _VALUE_WITNESS, _check_dtype, _voidptr, use_parallel  # noqa: E402
from .scalar import NEAREST, STOCHASTIC, finish_derived, random_bits, round_table_value  # noqa: E402


# ---- nearest: the user's functions (no cache: their types are per function) ---------------------------
@njit
def nearest_serial(to_code, from_code, src, dst):
    for i in range(src.size):
        dst[i] = from_code(to_code(np.float64(src[i])))


@njit(parallel=True)
def nearest_parallel(to_code, from_code, src, dst):
    for i in prange(src.size):
        dst[i] = from_code(to_code(np.float64(src[i])))


# one entry per loop, so that a format compiles only the loop it runs
@njit
def nearest_serial_at(to_code, from_code, src, dst, size, w):
    nearest_serial(to_code, from_code, carray(_voidptr(src), size, w.dtype), carray(_voidptr(dst), size, w.dtype))


@njit
def nearest_parallel_at(to_code, from_code, src, dst, size, w):
    nearest_parallel(to_code, from_code, carray(_voidptr(src), size, w.dtype), carray(_voidptr(dst), size, w.dtype))


# ---- derived modes ---------------------------------------------------------------------------------------
@njit(cache=True)
def derived_serial(src, dst, tab, n, snap32, ninf, pinf, negzero, mode, key, nbits):
    for i in range(src.size):
        rnd = random_bits(key, i, nbits) if mode == STOCHASTIC else np.uint64(0)
        x = np.float64(src[i])
        q = round_table_value(x, tab, n, snap32, mode, rnd, nbits)
        dst[i] = finish_derived(x, q, tab[0], tab[n - 1], ninf, pinf, negzero, mode)


@njit(cache=True, parallel=True)
def derived_parallel(src, dst, tab, n, snap32, ninf, pinf, negzero, mode, key, nbits):
    for i in prange(src.size):
        rnd = random_bits(key, i, nbits) if mode == STOCHASTIC else np.uint64(0)
        x = np.float64(src[i])
        q = round_table_value(x, tab, n, snap32, mode, rnd, nbits)
        dst[i] = finish_derived(x, q, tab[0], tab[n - 1], ninf, pinf, negzero, mode)


@njit(cache=True)
def derived_at(src, dst, size, w, par, tab, n, snap32, ninf, pinf, negzero, mode, key, nbits):
    s, d = carray(_voidptr(src), size, w.dtype), carray(_voidptr(dst), size, w.dtype)
    if par:
        derived_parallel(s, d, tab, n, snap32, ninf, pinf, negzero, mode, key, nbits)
    else:
        derived_serial(s, d, tab, n, snap32, ninf, pinf, negzero, mode, key, nbits)


def custom_runner(dtype, fmt):
    """``run(src, dst, size, mode, key, nbits, parallel=None)`` on raw addresses of ``size`` contiguous
    float32/float64 values (dst may be src) for the CustomFormat ``fmt`` (its ``to_code_jit`` /
    ``from_code_jit``; ``check_mode`` and ``derived()`` for the other modes, which raise ValueError where a
    mode is not available)."""
    dt = _check_dtype(dtype)
    w = _VALUE_WITNESS[dt]
    to_code, from_code = fmt.to_code_jit, fmt.from_code_jit
    snap32 = np.int64(dt == np.float32)

    def run(src: int, dst: int, size: int, mode, key, nbits, parallel=None) -> None:
        if int(mode) == NEAREST:
            with _parallel.try_parallel(use_parallel(size, parallel)) as par:
                (nearest_parallel_at if par else nearest_serial_at)(to_code, from_code, src, dst, size, w)
            return
        fmt.check_mode(mode)
        table, ninf, pinf, negzero = fmt.derived()
        n, tab = table.to_kernel_args()  # abi.TableArgs
        with _parallel.try_parallel(use_parallel(size, parallel)) as par:
            derived_at(src, dst, size, w, par, tab, np.int64(n), snap32, np.int64(ninf), np.int64(pinf),
                       np.int64(negzero), mode, np.uint64(key), nbits)

    return run


def quantize_custom(src: np.ndarray, dst: np.ndarray, fmt, mode, key, nbits, parallel=None):
    """Round the flat float32/float64 array ``src`` into ``dst`` (same dtype and size; may be ``src``)."""
    if src.dtype != dst.dtype or src.size != dst.size:
        raise ValueError(f"dst must match src: {dst.size} x {dst.dtype} against {src.size} x {src.dtype}")
    custom_runner(src.dtype, fmt)(src.ctypes.data, dst.ctypes.data, src.size, mode, key, nbits, parallel)


# ---- GEMM on codes (emunum.mad.custom_matmul) -----------------------------------------------------------
@njit(parallel=True)
def matmul_codes(zero, from_code, add, mul, ca, cb, out):
    """out[i, j] = from_code(acc) with acc = add(... add(add(zero, mul(ca[i,0], cb[0,j])), mul(ca[i,1], ...)),
    k in order 0..K-1; ca (m, K), cb (K, n) int64 codes. Rows run in parallel, each dot product serially."""
    m, k = ca.shape
    n = cb.shape[1]
    for i in prange(m):
        for j in range(n):
            acc = zero
            for kk in range(k):
                acc = np.int64(add(acc, np.int64(mul(ca[i, kk], cb[kk, j]))))
            out[i, j] = from_code(acc)


@njit
def encode_values(to_code, x, out):
    for i in range(x.size):
        out[i] = to_code(np.float64(x[i]))


def custom_matmul_codes(fmt, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out`` (m, n float32/float64) = the code-level GEMM of float arrays a (m, K) and b (K, n), rounded to
    ``fmt`` by its ``to_code`` first (see ``emunum.mad.custom_matmul``)."""
    to_code = fmt.to_code_jit
    ca, cb = np.empty(a.shape, np.int64), np.empty(b.shape, np.int64)
    encode_values(to_code, a.reshape(-1), ca.reshape(-1))
    encode_values(to_code, b.reshape(-1), cb.reshape(-1))
    zero = np.int64(to_code(0.0))
    with _parallel.exclusive():
        matmul_codes(zero, fmt.from_code_jit, fmt.add_jit, fmt.mul_jit, ca, cb, out)
