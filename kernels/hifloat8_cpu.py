"""Numba CPU kernels for HiFloat8 (``emunum.formats.hifloat8``; cores in ``kernels/scalar/hifloat8.py``).

float32: loops specialised per rounding mode (the mode a closure constant, so each vectorises): nearest and
nearest_away (one rule, ties away) and stochastic with at least 23 random bits on uint32 lanes
(``nearest_ta_f32``, ``sr_f32``), the other modes (and fewer random bits) through the
branch-free float32 core (``round_hif8_f32``). float64: one loop over ``round_hif8_bits`` with the mode as an
argument. Serial and ``prange`` loops visit element i alike, so the bits never depend on the thread count.
``hif8_runner`` binds a dtype and overflow code for ``emunum.quantize`` (raw addresses)."""
import functools

import numpy as np
from numba import carray, njit, prange

from . import _cache, elementwise_f32 as _ew, scalar

_cache.guard(__file__, scalar.SOURCES + [_ew.__file__])

from .cpu import MODES, _check_dtype, _runner, _runtime_mode, _voidptr  # noqa: E402
from .wide import prefer_wide_vectors  # noqa: E402
from .scalar import (HIF8_MAX_BITS32, HIF8_MAX_BITS64, NEAREST, NEAREST_AWAY, OVF_SAT, STOCHASTIC,  # noqa: E402
                     hif8_sr_f32, nearest_ta_f32, random_bits, round_hif8_bits, round_hif8_f32)

U32 = np.uint32
U64 = np.uint64


@njit(inline="always")
def _nearest_loop(src, dst, big):
    for i in prange(src.size):  # unsigned indices: signed ones turn the loads into gathers
        dst[U64(i)] = nearest_ta_f32(src[U64(i)], big)


@njit(inline="always")
def _sr_loop(src, dst, big, key, nbits):
    """Element i's bits ``random_bits(key, i, nbits)``, made per chunk into a stack buffer first
    (``elementwise_f32.fill_words``: 32-bit lanes for the rounding that reads them)."""
    pw = U32(1 << (32 - nbits))
    pn = np.float32(2.0**nbits)
    two_n = U32((1 << nbits) & 0xFFFFFFFF)
    n = U64(src.size)
    drop = U32(32 - nbits)
    for c in prange((src.size + _ew.CHUNK - 1) // _ew.CHUNK):
        prefer_wide_vectors()
        c0 = U64(c) * U64(_ew.CHUNK)
        m = min(c0 + U64(_ew.CHUNK), n) - c0
        words = _ew.stack_words(c)
        _ew.fill_words(words, key, 0, c0, m)
        for j in range(m):
            dst[c0 + j] = hif8_sr_f32(src[c0 + j], _ew.word_bits(words[j], drop), pw, pn, two_n, big)


def _loop_mode(mode: int) -> int:
    """The mode whose loop serves ``mode``: HiF8 rounds to nearest with ties away in both nearest modes (the same
    loop), so NEAREST_AWAY takes NEAREST's compiled loop instead of a copy of it."""
    return NEAREST if int(mode) == NEAREST_AWAY else int(mode)


def f32_loop(MODE: int, PARALLEL: bool):
    """``loop(src, dst, ovf, key, nbits)``: dst = src rounded in mode MODE; src, dst uint32 (float32 bits)."""
    return _f32_loop(_loop_mode(MODE), bool(PARALLEL))


@functools.lru_cache(maxsize=None)
def _f32_loop(MODE: int, PARALLEL: bool):
    """``f32_loop``. numba's cache key holds the closure's variables, which must be exactly MODE and PARALLEL:
    without PARALLEL the serial and prange loops share a key and a process may load the other one (a thread-pool
    launch per call: 15 us on 10 elements, measured)."""

    @njit(cache=True, parallel=PARALLEL)
    def loop(src, dst, ovf, key, nbits):
        _ = PARALLEL  # puts PARALLEL in the closure, so in the cache key
        big = U32(HIF8_MAX_BITS32) if ovf == OVF_SAT else U32(0x7F800000)
        if MODE == NEAREST:  # ties away, the loop of both nearest modes (_loop_mode)
            if src.ctypes.data == dst.ctypes.data:  # one array: LLVM's overlap check would take the scalar loop
                _nearest_loop(dst, dst, big)
            else:
                _nearest_loop(src, dst, big)
        elif MODE == STOCHASTIC and nbits >= 23:
            if src.ctypes.data == dst.ctypes.data:
                _sr_loop(dst, dst, big, key, nbits)
            else:
                _sr_loop(src, dst, big, key, nbits)
        else:
            for i in prange(src.size):
                rnd = random_bits(key, U64(i), nbits) if MODE == STOCHASTIC else U64(0)
                dst[U64(i)] = U32(round_hif8_f32(src[U64(i)], ovf, MODE, rnd, nbits))

    return loop


def f32_at(MODE: int):
    """``at(src, dst, n, w, par, ovf, key, nbits)``: ``f32_loop`` on the n float32 values at address src."""
    return _f32_at(_loop_mode(MODE))


@functools.lru_cache(maxsize=None)
def _f32_at(MODE: int):
    serial, parallel = f32_loop(MODE, False), f32_loop(MODE, True)

    @njit(cache=True)
    def at(src, dst, n, w, par, ovf, key, nbits):
        s, d = carray(_voidptr(src), n, np.uint32), carray(_voidptr(dst), n, np.uint32)
        if par:
            parallel(s, d, ovf, key, nbits)
        else:
            serial(s, d, ovf, key, nbits)

    return at


@njit(inline="always")
def _f64_body(src, dst, ovf, mode, key, nbits):
    for i in prange(src.size):
        rnd = random_bits(key, i, nbits) if mode == STOCHASTIC else U64(0)
        dst[i] = round_hif8_bits(src[i], 63, 52, 1023, U64(HIF8_MAX_BITS64), ovf, mode, rnd, nbits)


@njit(cache=True)
def f64_serial(src, dst, ovf, mode, key, nbits):
    _f64_body(src, dst, ovf, mode, key, nbits)


@njit(cache=True, parallel=True)
def f64_parallel(src, dst, ovf, mode, key, nbits):
    _f64_body(src, dst, ovf, mode, key, nbits)


@njit(cache=True)
def f64_at(src, dst, n, w, par, ovf, mode, key, nbits):
    s, d = carray(_voidptr(src), n, np.uint64), carray(_voidptr(dst), n, np.uint64)
    if par:
        f64_parallel(s, d, ovf, mode, key, nbits)
    else:
        f64_serial(s, d, ovf, mode, key, nbits)


_WITNESS = np.empty(0, np.uint8)


@functools.lru_cache(maxsize=8)
def hif8_runner(dtype, overflow: int):
    """``run(src, dst, n, mode, key, nbits, parallel=None)`` on raw addresses of n contiguous float32/float64
    values (dst may be src), rounding to HiF8 with overflow code ``overflow`` (0 inf, 2 saturate)."""
    dt = _check_dtype(dtype)
    if dt == np.dtype(np.float32):
        return _runner(lambda mode: (f32_at(mode), ()), _WITNESS, (int(overflow),))
    return _runner(_runtime_mode(f64_at), _WITNESS, (int(overflow),))


def quantize_hif8(src: np.ndarray, dst: np.ndarray, overflow: int, mode: int, key: int, nbits: int,
                  parallel=None) -> None:
    """Round the flat float32/float64 array ``src`` into ``dst`` (same dtype and size; may be ``src``)."""
    if src.dtype != dst.dtype or src.size != dst.size:
        raise ValueError(f"dst must match src in size and dtype: src is {src.size} x {src.dtype}, "
                         f"dst is {dst.size} x {dst.dtype}")
    if int(mode) not in MODES:
        raise ValueError(f"mode={mode!r}; allowed: the rounding mode codes {MODES}")
    hif8_runner(src.dtype, int(overflow))(src.ctypes.data, dst.ctypes.data, src.size, int(mode), key, nbits,
                                          parallel)
