"""Numba CPU kernels for unsigned IEEE P3109 formats: the float rounding (``emunum.formats.p3109``: the float
kernels with the format's ``FloatArgs``) with x < 0 -> NaN.

- float32, round to nearest or stochastically (where ``elementwise_f32.nearest_ok`` / ``sr_ok`` hold): one
  fused loop, the uint32-lane core ``elementwise_f32.nearest_f32`` / ``sr_f32`` and a select of NaN for
  negative inputs (a second pass over memory cost a quarter to a third of these paths' speed).
- otherwise: the float kernel, and a pass writing NaN where x < 0; it runs before the rounding when rounding
  in place (the signs are still there) and after it otherwise (reading the source).
Each kernel is one serial loop over a range of elements, run whole or in shares on numba's threads
(``shares.launcher``, under parallel.py's lock), every share visiting element i alike, so the bits never depend
on the thread count."""

import numpy as np
from numba import carray, njit

from . import _cache, elementwise_f32 as _ew

_cache.guard(__file__, [_ew.__file__])

from .cpu import PARALLEL_MIN, _check_dtype, _voidptr, run_range  # noqa: E402
from .direct import direct_caller  # noqa: E402
from .elementwise_f32 import NAN32, SIGN, U32, U64  # noqa: E402
from .scalar import NEAREST, STOCHASTIC  # noqa: E402

NEG_INF_BITS = _ew.NEG_INF32


# a select rather than a conditional store: the loop vectorises
@njit(cache=True, nogil=True)
def fix_range(lo, hi, src, dst, w):
    """dst[i] = NaN where src[i] < 0, i in lo..hi-1 of the memory of w's dtype at addresses src, dst."""
    s, d = carray(_voidptr(src), hi, w.dtype), carray(_voidptr(dst), hi, w.dtype)
    for i in range(U64(lo), U64(hi)):
        d[i] = np.nan if s[i] < 0 else d[i]


@njit(inline="always")
def _nearest_loop(lo, hi, src, dst, man, emin, max_bits, ovf):
    s, hm1, mask, magic, mn_bits, big, ovf_nan = _ew.nearest_params(man, emin, 1, max_bits, ovf)
    mb = U32(max_bits)
    for i in range(U64(lo), U64(hi)):
        u = src[i]
        r = _ew.nearest_f32(u, s, hm1, mask, magic, mn_bits, mb, big, ovf_nan, 0)
        dst[i] = NAN32 if (u > SIGN) & (u <= NEG_INF_BITS) else r  # negative nonzero, -inf included


@njit(cache=True, nogil=True)
def nearest_range(lo, hi, src, dst, man, emin, max_bits, ovf):
    """Elements lo..hi-1 of the float32 memory at addresses src, dst: ``elementwise_f32.nearest_f32``, x < 0 ->
    NaN."""
    s, d = carray(_voidptr(src), hi, np.uint32), carray(_voidptr(dst), hi, np.uint32)
    if src == dst:  # one array: LLVM's overlap check would take the scalar loop
        _nearest_loop(lo, hi, d, d, man, emin, max_bits, ovf)
    else:
        _nearest_loop(lo, hi, s, d, man, emin, max_bits, ovf)


@njit(cache=True, nogil=True)
def sr_range(lo, hi, src, dst, man, emin, max_bits, ovf, key, nbits):
    """The float32 stochastic loop of ``elementwise_f32`` (its random words, element i's bits
    ``random_bits(key, i, nbits)``) with NaN selected for x < 0, elements lo..hi-1 at addresses src, dst."""
    s, d = carray(_voidptr(src), hi, np.uint32), carray(_voidptr(dst), hi, np.uint32)
    if src == dst:
        _ew._sr_loop(lo, hi, d, d, man, emin, 1, max_bits, ovf, 0, key, nbits, 0, True)
    else:
        _ew._sr_loop(lo, hi, s, d, man, emin, 1, max_bits, ovf, 0, key, nbits, 0, True)


_WITNESS = {np.dtype(np.float32): np.empty(0, np.float32), np.dtype(np.float64): np.empty(0, np.float64)}


def unsigned_runner(dtype, float_run, man, emin, max_value, overflow):
    """``run(src, dst, n, mode, key, nbits, parallel=None)`` on raw addresses of float32/float64 memory:
    ``float_run`` (the float kernel of the format's FloatArgs: man, emin, subnormals on, max_value, overflow;
    same signature) with x < 0 -> NaN."""
    dt = _check_dtype(dtype)
    w = _WITNESS[dt]
    fix, fused, fused_sr = (direct_caller(k) for k in (fix_range, nearest_range, sr_range))  # no type dispatch
    f32 = dt == np.dtype(np.float32) and emin >= -126
    fast = f32 and bool(_ew.nearest_ok(man, emin, 1, max_value))
    fast_sr = f32 and bool(_ew.sr_ok(man, emin, 1, max_value))
    mbits = int(np.array(max_value, dtype=np.float32).view(np.uint32)) if fast or fast_sr else 0

    def launch(kernel, direct, n, args, parallel):
        if parallel is None and n < PARALLEL_MIN:
            direct(0, n, *args)
        else:
            run_range(kernel, n, args, parallel)

    def run(src, dst, n, mode, key, nbits, parallel=None):
        if n == 0:
            return
        src, dst, n = int(src), int(dst), int(n)
        serial = parallel is None and n < PARALLEL_MIN
        if fast and int(mode) == NEAREST:
            if serial:  # the training path's small tensors: no further Python call
                fused(0, n, src, dst, man, emin, mbits, overflow)
            else:
                run_range(nearest_range, n, (src, dst, man, emin, mbits, overflow), parallel)
        elif fast_sr and int(mode) == STOCHASTIC:
            if serial:
                fused_sr(0, n, src, dst, man, emin, mbits, overflow, np.uint64(key), int(nbits))
            else:
                run_range(sr_range, n, (src, dst, man, emin, mbits, overflow, np.uint64(key), int(nbits)), parallel)
        elif src == dst:
            launch(fix_range, fix, n, (src, dst, w), parallel)
            float_run(src, dst, n, mode, key, nbits, parallel)
        else:
            float_run(src, dst, n, mode, key, nbits, parallel)
            launch(fix_range, fix, n, (src, dst, w), parallel)
    return run
