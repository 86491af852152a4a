"""Numba CPU kernels: loops over flat, contiguous arrays, calling the shared scalar cores.

Each kernel exists twice, compiled lazily on first call (``cache=True``): a serial loop for small arrays,
and a ``parallel=True`` / ``prange`` loop for large ones, where the thread start-up pays off. Both visit
element ``i`` with the same arguments, so the bits never depend on the thread count.
"""

import os

import numba
import numpy as np
from numba import njit, prange

from . import _cache, scalar

_cache.guard(__file__, [scalar.__file__])

# numba's OpenMP layer contends with torch's own OpenMP runtime (measured: half the throughput once torch is
# loaded); the workqueue layer does not. A user's explicit NUMBA_THREADING_LAYER wins.
if "NUMBA_THREADING_LAYER" not in os.environ and numba.config.THREADING_LAYER == "default":
    numba.config.THREADING_LAYER = "workqueue"

from .scalar import (DOWN, NEAREST, NEAREST_AWAY, ODD, STOCHASTIC, TOWARD_ZERO, UP, random_bits,  # noqa: E402
                     round_f32_fast, round_fixed_value, round_float_bits)

# Below this many elements the serial loop wins (measured by benchmarks/quantize.py --crossover).
PARALLEL_MIN = 1 << 15


@njit(cache=True)
def float_serial(src, dst, sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero, mode, key, nbits):
    for i in range(src.size):
        rnd = random_bits(key, i, nbits) if mode == STOCHASTIC else np.uint64(0)
        dst[i] = round_float_bits(src[i], sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero,
                                  mode, rnd, nbits)


@njit(cache=True, parallel=True)
def float_parallel(src, dst, sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero, mode, key, nbits):
    for i in prange(src.size):
        rnd = random_bits(key, i, nbits) if mode == STOCHASTIC else np.uint64(0)
        dst[i] = round_float_bits(src[i], sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero,
                                  mode, rnd, nbits)


# The float32 and fixed-point loops are written once per rounding mode, with the mode a compile-time
# constant: the other modes' branches vanish and the loop vectorises (5x faster than a runtime mode).
@njit(cache=True)
def f32_serial(src, dst, man, emin, sub, max_bits, ovf, negzero, mode, key, nbits):
    if mode == NEAREST:
        for i in range(src.size):
            dst[i] = round_f32_fast(src[i], man, emin, sub, max_bits, ovf, negzero, NEAREST, 0, nbits)
    elif mode == NEAREST_AWAY:
        for i in range(src.size):
            dst[i] = round_f32_fast(src[i], man, emin, sub, max_bits, ovf, negzero, NEAREST_AWAY, 0, nbits)
    elif mode == TOWARD_ZERO:
        for i in range(src.size):
            dst[i] = round_f32_fast(src[i], man, emin, sub, max_bits, ovf, negzero, TOWARD_ZERO, 0, nbits)
    elif mode == UP:
        for i in range(src.size):
            dst[i] = round_f32_fast(src[i], man, emin, sub, max_bits, ovf, negzero, UP, 0, nbits)
    elif mode == DOWN:
        for i in range(src.size):
            dst[i] = round_f32_fast(src[i], man, emin, sub, max_bits, ovf, negzero, DOWN, 0, nbits)
    elif mode == ODD:
        for i in range(src.size):
            dst[i] = round_f32_fast(src[i], man, emin, sub, max_bits, ovf, negzero, ODD, 0, nbits)
    else:
        for i in range(src.size):
            dst[i] = round_f32_fast(src[i], man, emin, sub, max_bits, ovf, negzero, STOCHASTIC, random_bits(key, i, nbits), nbits)


@njit(cache=True, parallel=True)
def f32_parallel(src, dst, man, emin, sub, max_bits, ovf, negzero, mode, key, nbits):
    if mode == NEAREST:
        for i in prange(src.size):
            dst[i] = round_f32_fast(src[i], man, emin, sub, max_bits, ovf, negzero, NEAREST, 0, nbits)
    elif mode == NEAREST_AWAY:
        for i in prange(src.size):
            dst[i] = round_f32_fast(src[i], man, emin, sub, max_bits, ovf, negzero, NEAREST_AWAY, 0, nbits)
    elif mode == TOWARD_ZERO:
        for i in prange(src.size):
            dst[i] = round_f32_fast(src[i], man, emin, sub, max_bits, ovf, negzero, TOWARD_ZERO, 0, nbits)
    elif mode == UP:
        for i in prange(src.size):
            dst[i] = round_f32_fast(src[i], man, emin, sub, max_bits, ovf, negzero, UP, 0, nbits)
    elif mode == DOWN:
        for i in prange(src.size):
            dst[i] = round_f32_fast(src[i], man, emin, sub, max_bits, ovf, negzero, DOWN, 0, nbits)
    elif mode == ODD:
        for i in prange(src.size):
            dst[i] = round_f32_fast(src[i], man, emin, sub, max_bits, ovf, negzero, ODD, 0, nbits)
    else:
        for i in prange(src.size):
            dst[i] = round_f32_fast(src[i], man, emin, sub, max_bits, ovf, negzero, STOCHASTIC, random_bits(key, i, nbits), nbits)


@njit(cache=True)
def fixed_serial(src, dst, frac_bits, code_min, code_max, saturate, mode, key, nbits):
    if mode == NEAREST:
        for i in range(src.size):
            dst[i] = round_fixed_value(np.float64(src[i]), frac_bits, code_min, code_max, saturate, NEAREST, 0, nbits)
    elif mode == NEAREST_AWAY:
        for i in range(src.size):
            dst[i] = round_fixed_value(np.float64(src[i]), frac_bits, code_min, code_max, saturate, NEAREST_AWAY, 0, nbits)
    elif mode == TOWARD_ZERO:
        for i in range(src.size):
            dst[i] = round_fixed_value(np.float64(src[i]), frac_bits, code_min, code_max, saturate, TOWARD_ZERO, 0, nbits)
    elif mode == UP:
        for i in range(src.size):
            dst[i] = round_fixed_value(np.float64(src[i]), frac_bits, code_min, code_max, saturate, UP, 0, nbits)
    elif mode == DOWN:
        for i in range(src.size):
            dst[i] = round_fixed_value(np.float64(src[i]), frac_bits, code_min, code_max, saturate, DOWN, 0, nbits)
    elif mode == ODD:
        for i in range(src.size):
            dst[i] = round_fixed_value(np.float64(src[i]), frac_bits, code_min, code_max, saturate, ODD, 0, nbits)
    else:
        for i in range(src.size):
            dst[i] = round_fixed_value(np.float64(src[i]), frac_bits, code_min, code_max, saturate, STOCHASTIC, random_bits(key, i, nbits), nbits)


@njit(cache=True, parallel=True)
def fixed_parallel(src, dst, frac_bits, code_min, code_max, saturate, mode, key, nbits):
    if mode == NEAREST:
        for i in prange(src.size):
            dst[i] = round_fixed_value(np.float64(src[i]), frac_bits, code_min, code_max, saturate, NEAREST, 0, nbits)
    elif mode == NEAREST_AWAY:
        for i in prange(src.size):
            dst[i] = round_fixed_value(np.float64(src[i]), frac_bits, code_min, code_max, saturate, NEAREST_AWAY, 0, nbits)
    elif mode == TOWARD_ZERO:
        for i in prange(src.size):
            dst[i] = round_fixed_value(np.float64(src[i]), frac_bits, code_min, code_max, saturate, TOWARD_ZERO, 0, nbits)
    elif mode == UP:
        for i in prange(src.size):
            dst[i] = round_fixed_value(np.float64(src[i]), frac_bits, code_min, code_max, saturate, UP, 0, nbits)
    elif mode == DOWN:
        for i in prange(src.size):
            dst[i] = round_fixed_value(np.float64(src[i]), frac_bits, code_min, code_max, saturate, DOWN, 0, nbits)
    elif mode == ODD:
        for i in prange(src.size):
            dst[i] = round_fixed_value(np.float64(src[i]), frac_bits, code_min, code_max, saturate, ODD, 0, nbits)
    else:
        for i in prange(src.size):
            dst[i] = round_fixed_value(np.float64(src[i]), frac_bits, code_min, code_max, saturate, STOCHASTIC, random_bits(key, i, nbits), nbits)


# binary layout of the float dtypes the float kernels read as bits: (uint view, sign_pos, man, bias)
LAYOUT = {
    np.dtype(np.float32): (np.uint32, 31, 23, 127),
    np.dtype(np.float64): (np.uint64, 63, 52, 1023),
}


def max_bits(max_value: float, dtype) -> int:
    """Bits of ``max_value`` in the binary layout of ``dtype`` (float32 or float64)."""
    uint = LAYOUT[np.dtype(dtype)][0]
    return int(np.array(max_value, dtype=dtype).view(uint))


def quantize_float(src: np.ndarray, dst: np.ndarray, man, emin, subnormals, max_value, overflow, negzero,
                   mode, key, nbits, parallel=None):
    """Round the flat float32/float64 array ``src`` into ``dst`` (same dtype and size; may be ``src``)."""
    uint, sign_pos, in_man, in_bias = LAYOUT[src.dtype]
    par = src.size >= PARALLEL_MIN if parallel is None else parallel
    if src.dtype == np.float32 and emin >= -126:
        run = f32_parallel if par else f32_serial
        run(src.view(uint), dst.view(uint), man, emin, subnormals, np.int64(max_bits(max_value, src.dtype)),
            overflow, negzero, mode, np.uint64(key), nbits)
        return
    run = float_parallel if par else float_serial
    run(src.view(uint), dst.view(uint), sign_pos, in_man, in_bias, man, emin, subnormals,
        np.uint64(max_bits(max_value, src.dtype)), overflow, negzero, mode, np.uint64(key), nbits)


def quantize_fixed(src: np.ndarray, dst: np.ndarray, frac_bits, code_min, code_max, saturate, mode, key, nbits,
                   parallel=None):
    """Round the flat float32/float64 array ``src`` to fixed point into ``dst``."""
    run = fixed_parallel if (src.size >= PARALLEL_MIN if parallel is None else parallel) else fixed_serial
    run(src, dst, frac_bits, np.int64(code_min), np.int64(code_max), saturate, mode, np.uint64(key), nbits)
