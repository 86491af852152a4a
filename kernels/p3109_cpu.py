"""Numba CPU kernels for unsigned IEEE P3109 formats: the float rounding (``emunum.formats.p3109``: the float
kernels with the format's ``FloatArgs``) with x < 0 -> NaN.

- float32, round to nearest or stochastically (where ``elementwise_f32.nearest_ok`` / ``sr_ok`` hold): one
  fused loop, the uint32-lane core ``elementwise_f32.nearest_f32`` / ``sr_f32`` and a select of NaN for
  negative inputs (a second pass over memory cost a quarter to a third of these paths' speed).
- otherwise: the float kernel, and a pass writing NaN where x < 0; it runs before the rounding when rounding
  in place (the signs are still there) and after it otherwise (reading the source).
Serial and ``prange`` loops visit element i alike, so the bits never depend on the thread count."""

import numpy as np
from numba import carray, njit, prange

from . import _cache, elementwise_f32 as _ew

_cache.guard(__file__, [_ew.__file__])

from .cpu import _check_dtype, _voidptr, use_parallel  # noqa: E402
from .direct import direct_caller  # noqa: E402
from .elementwise_f32 import NAN32, SIGN, U32, U64  # noqa: E402
from .scalar import NEAREST, STOCHASTIC  # noqa: E402

NEG_INF_BITS = _ew.NEG_INF32


# a select rather than a conditional store: the loop vectorises
@njit(inline="always")
def _fix_loop(src, dst):
    for i in prange(src.size):
        dst[i] = np.nan if src[i] < 0 else dst[i]


@njit(cache=True)
def fix_serial(src, dst):
    _fix_loop(src, dst)


@njit(cache=True, parallel=True)
def fix_parallel(src, dst):
    _fix_loop(src, dst)


@njit(cache=True)
def negative_to_nan_at(src, dst, n, w, par):
    s, d = carray(_voidptr(src), n, w.dtype), carray(_voidptr(dst), n, w.dtype)
    if par:
        fix_parallel(s, d)
    else:
        fix_serial(s, d)


@njit(inline="always")
def _nearest_loop(src, dst, man, emin, max_bits, ovf):
    s, hm1, mask, magic, mn_bits, big, ovf_nan = _ew.nearest_params(man, emin, 1, max_bits, ovf)
    mb = U32(max_bits)
    for i in prange(src.size):
        u = src[U64(i)]
        r = _ew.nearest_f32(u, s, hm1, mask, magic, mn_bits, mb, big, ovf_nan, 0)
        dst[U64(i)] = NAN32 if (u > SIGN) & (u <= NEG_INF_BITS) else r  # negative nonzero, -inf included


@njit(inline="always")
def _nearest(src, dst, man, emin, max_bits, ovf):
    if src.ctypes.data == dst.ctypes.data:  # one array: LLVM's overlap check would take the scalar loop
        _nearest_loop(dst, dst, man, emin, max_bits, ovf)
    else:
        _nearest_loop(src, dst, man, emin, max_bits, ovf)


@njit(cache=True, nogil=True)
def nearest_serial(src, dst, man, emin, max_bits, ovf):
    _nearest(src, dst, man, emin, max_bits, ovf)


@njit(cache=True, parallel=True)
def nearest_parallel(src, dst, man, emin, max_bits, ovf):
    _nearest(src, dst, man, emin, max_bits, ovf)


@njit(cache=True)
def nearest_at(src, dst, n, par, man, emin, max_bits, ovf):
    s, d = carray(_voidptr(src), n, np.uint32), carray(_voidptr(dst), n, np.uint32)
    if par:
        nearest_parallel(s, d, man, emin, max_bits, ovf)
    else:
        nearest_serial(s, d, man, emin, max_bits, ovf)


@njit(inline="always")
def _sr_loop(src, dst, man, emin, max_bits, ovf, key, nbits):
    """The float32 stochastic loop of ``elementwise_f32`` (its random words, element i's bits
    ``random_bits(key, i, nbits)``) with NaN selected for x < 0."""
    _ew._sr_loop(src, dst, man, emin, 1, max_bits, ovf, 0, key, nbits, 0, True)


@njit(inline="always")
def _sr(src, dst, man, emin, max_bits, ovf, key, nbits):
    if src.ctypes.data == dst.ctypes.data:
        _sr_loop(dst, dst, man, emin, max_bits, ovf, key, nbits)
    else:
        _sr_loop(src, dst, man, emin, max_bits, ovf, key, nbits)


@njit(cache=True, nogil=True)
def sr_serial(src, dst, man, emin, max_bits, ovf, key, nbits):
    _sr(src, dst, man, emin, max_bits, ovf, key, nbits)


@njit(cache=True, parallel=True)
def sr_parallel(src, dst, man, emin, max_bits, ovf, key, nbits):
    _sr(src, dst, man, emin, max_bits, ovf, key, nbits)


@njit(cache=True)
def sr_at(src, dst, n, par, man, emin, max_bits, ovf, key, nbits):
    s, d = carray(_voidptr(src), n, np.uint32), carray(_voidptr(dst), n, np.uint32)
    if par:
        sr_parallel(s, d, man, emin, max_bits, ovf, key, nbits)
    else:
        sr_serial(s, d, man, emin, max_bits, ovf, key, nbits)


_WITNESS = {np.dtype(np.float32): np.empty(0, np.float32), np.dtype(np.float64): np.empty(0, np.float64)}


def unsigned_runner(dtype, float_run, man, emin, max_value, overflow):
    """``run(src, dst, n, mode, key, nbits, parallel=None)`` on raw addresses of float32/float64 memory:
    ``float_run`` (the float kernel of the format's FloatArgs: man, emin, subnormals on, max_value, overflow;
    same signature) with x < 0 -> NaN."""
    dt = _check_dtype(dtype)
    w = _WITNESS[dt]
    fix = direct_caller(negative_to_nan_at)  # same Python types every call: skip numba's type dispatch
    fused, fused_sr = direct_caller(nearest_at), direct_caller(sr_at)
    f32 = dt == np.dtype(np.float32) and emin >= -126
    fast = f32 and bool(_ew.nearest_ok(man, emin, 1, max_value))
    fast_sr = f32 and bool(_ew.sr_ok(man, emin, 1, max_value))
    mbits = int(np.array(max_value, dtype=np.float32).view(np.uint32)) if fast or fast_sr else 0

    def run(src, dst, n, mode, key, nbits, parallel=None):
        if n == 0:
            return
        src, dst, n = int(src), int(dst), int(n)
        par = use_parallel(n, parallel)
        if fast and int(mode) == NEAREST:
            fused(src, dst, n, par, man, emin, mbits, overflow)
        elif fast_sr and int(mode) == STOCHASTIC:
            fused_sr(src, dst, n, par, man, emin, mbits, overflow, np.uint64(key), int(nbits))
        elif src == dst:
            fix(src, dst, n, w, par)
            float_run(src, dst, n, mode, key, nbits, parallel)
        else:
            float_run(src, dst, n, mode, key, nbits, parallel)
            fix(src, dst, n, w, par)
    return run
