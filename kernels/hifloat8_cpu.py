"""Numba CPU kernels for HiFloat8 (``emunum.formats.hifloat8``; cores in ``kernels/scalar/hifloat8.py``).

float32: loops specialised per rounding mode (the mode a closure constant, so each vectorises): nearest and
nearest_away (one rule, ties away) and stochastic with at least 23 random bits on uint32 lanes
(``nearest_ta_f32``, ``sr_f32``), the other modes (and fewer random bits) through the
branch-free float32 core (``round_hif8_f32``). float64: one loop over ``round_hif8_bits`` with the mode as an
argument. Each is one serial kernel over a range of elements, run whole or in shares on numba's threads
(``shares.launcher``), every share visiting element i alike, so the bits never depend on the thread count.
``hif8_runner`` binds a dtype and overflow code for ``emunum.quantize`` (raw addresses)."""
import functools

import numpy as np
from numba import carray, njit

from . import _cache, elementwise_f32 as _ew, scalar

_cache.guard(__file__, scalar.SOURCES + [_ew.__file__])

from .cpu import MODES, _check_dtype, _runner, _runtime_mode, _voidptr  # noqa: E402
from .shares import launcher  # noqa: E402
from .wide import prefer_wide_vectors  # noqa: E402
from .scalar import (HIF8_MAX_BITS32, HIF8_MAX_BITS64, NEAREST, NEAREST_AWAY, OVF_SAT, STOCHASTIC,  # noqa: E402
                     hif8_sr_f32, nearest_ta_f32, random_bits, round_hif8_bits, round_hif8_f32)

U32 = np.uint32
U64 = np.uint64


@njit(inline="always")
def _nearest_loop(src, dst, big):
    for i in range(U64(src.size)):  # unsigned indices: signed ones turn the loads into gathers
        dst[i] = nearest_ta_f32(src[i], big)


@njit(inline="always")
def _sr_loop(src, dst, big, key, nbits, base):
    """Element i's bits ``random_bits(key, base + i, nbits)``, made per chunk into a stack buffer first
    (``elementwise_f32.fill_words``: 32-bit lanes for the rounding that reads them). The core's ``rnd * 2**(32 -
    nbits)`` is a shift on uint32 lanes: as a product with 1 << (32 - nbits), LLVM turned it into a 64-bit shift
    (the vector widened, shifted and narrowed again), 4-6% of the loop's time (measured). Each chunk hints the
    source lines ahead (``elementwise_f32.hint``): 6% faster out of cache (2**22 elements), 1-2% slower in cache."""
    pn = np.float32(2.0**nbits)
    two_n = U32((1 << nbits) & 0xFFFFFFFF)
    n = U64(src.size)
    drop = U32(32 - nbits)
    words = _ew.stack_words(base)
    for c0 in range(U64(0), n, U64(_ew.CHUNK)):
        prefer_wide_vectors()
        _ew.hint(src, c0, n)
        m = min(c0 + U64(_ew.CHUNK), n) - c0
        _ew.fill_words(words, key, base, c0, m)
        for j in range(m):
            rnd = _ew.word_bits(words[j], drop)
            dst[c0 + j] = hif8_sr_f32(src[c0 + j], rnd, _ew.shl32(rnd, drop), pn, two_n, big)


def _loop_mode(mode: int) -> int:
    """The mode whose loop serves ``mode``: HiF8 rounds to nearest with ties away in both nearest modes (the same
    loop), so NEAREST_AWAY takes NEAREST's compiled loop instead of a copy of it."""
    return NEAREST if int(mode) == NEAREST_AWAY else int(mode)


def f32_range(MODE: int):
    """``rng(lo, hi, src, dst, ovf, key, nbits)``: elements lo..hi-1 of the float32 memory at addresses src, dst
    (dst may be src) rounded in mode MODE (one serial kernel; ``shares.launcher`` runs it in parallel)."""
    return _f32_range(_loop_mode(MODE))


@functools.lru_cache(maxsize=None)
def _f32_range(MODE: int):
    def rng(lo, hi, src, dst, ovf, key, nbits):
        # arrays that start at lo, loops from 0: loops from lo ran 3-8% slower out of cache (2**22, measured)
        s = carray(_voidptr(src + 4 * lo), hi - lo, np.uint32)
        d = carray(_voidptr(dst + 4 * lo), hi - lo, np.uint32)
        big = U32(HIF8_MAX_BITS32) if ovf == OVF_SAT else U32(0x7F800000)
        if MODE == NEAREST:  # ties away, the loop of both nearest modes (_loop_mode)
            if src == dst:  # one array: LLVM's overlap check would take the scalar loop
                _nearest_loop(d, d, big)
            else:
                _nearest_loop(s, d, big)
        elif MODE == STOCHASTIC and nbits >= 23:
            # big hidden from LLVM: knowing it one of two constants, LLVM reshaped the core's overflow and zero
            # tests into more vector mask operations, 2-4% of the loop's time (measured)
            big = _ew.opaque(big)
            if src == dst:
                _sr_loop(d, d, big, key, nbits, lo)
            else:
                _sr_loop(s, d, big, key, nbits, lo)
        else:
            for i in range(U64(hi - lo)):
                rnd = random_bits(key, U64(lo) + i, nbits) if MODE == STOCHASTIC else U64(0)
                d[i] = U32(round_hif8_f32(s[i], ovf, MODE, rnd, nbits))

    return njit(cache=True, nogil=True)(_cache.variant(rng, f"mode{MODE}"))


def f32_loop(MODE: int, PARALLEL: bool):
    """``loop(src, dst, ovf, key, nbits)`` on uint32 arrays (float32 bits): ``f32_range`` over all of src, in
    shares on numba's threads if PARALLEL (the caller holds parallel.py's lock)."""
    rng = f32_range(MODE)

    def loop(src, dst, ovf, key, nbits):
        args = (src.ctypes.data, dst.ctypes.data, ovf, np.uint64(key), nbits)
        if PARALLEL:
            launcher(rng)(src.size, *args)
        else:
            rng(0, src.size, *args)

    return loop


@njit(cache=True, nogil=True)
def f64_range(lo, hi, src, dst, ovf, mode, key, nbits):
    """Elements lo..hi-1 of the float64 memory at addresses src, dst, the mode an argument."""
    s, d = carray(_voidptr(src), hi, np.uint64), carray(_voidptr(dst), hi, np.uint64)
    for i in range(U64(lo), U64(hi)):
        rnd = random_bits(key, i, nbits) if mode == STOCHASTIC else U64(0)
        d[i] = round_hif8_bits(s[i], 63, 52, 1023, U64(HIF8_MAX_BITS64), ovf, mode, rnd, nbits)


@functools.lru_cache(maxsize=8)
def hif8_runner(dtype, overflow: int):
    """``run(src, dst, n, mode, key, nbits, parallel=None)`` on raw addresses of n contiguous float32/float64
    values (dst may be src), rounding to HiF8 with overflow code ``overflow`` (0 inf, 2 saturate)."""
    dt = _check_dtype(dtype)
    if dt == np.dtype(np.float32):
        return _runner(lambda mode: (f32_range(mode), ()), (int(overflow),))
    return _runner(_runtime_mode(f64_range), (int(overflow),))


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
