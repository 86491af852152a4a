"""Operand packing for the column-tiled float64 GEMM kernels (``gemm_multiterm_f64``, ``gemm_exact_slices``).

A (bA, M, K) float32 becomes float64 rows (bA*M, K); B^T (bB, N, K) float32 becomes column tiles
(bB, ceil(N/TN), K, TN) float64, zero-padded past column N, so that one tile's K x TN block is contiguous (no
cache-set aliasing from a power-of-two row stride) and every column loop has the constant trip count TN.
Optionally each operand's power of two 2**ea, ea = max(floor(log2|x|), emin) (``exponent_of``), 0 for a zero.
Every conversion is exact (float32 -> float64; ldexp of 1 by an exponent in [-149, 127]).
Also: the operands' finiteness and their exponent range (``span``), on which the kernels' plans depend.
"""
import math

import numpy as np
from numba import njit, prange

from . import _cache, gemm_scalar, multiterm_scalar, scalar

_cache.guard(__file__, [*scalar.SOURCES, gemm_scalar.__file__, multiterm_scalar.__file__])

from .multiterm_scalar import exponent_of  # noqa: E402

TN = 128  # output columns per tile (16 AVX-512 registers of float64)


@njit(cache=True, parallel=True)
def pack_a(A, emin, with_pow, X, PX):
    """X[b*M + i, k] = A[b, i, k] (float64); PX the same rows of 2**ea (0 for a zero) when with_pow."""
    nb, M, K = A.shape
    for t in prange(nb * M):
        b, i = t // M, t % M
        for k in range(K):
            x = np.float64(A[b, i, k])
            X[t, k] = x
            if with_pow:
                PX[t, k] = math.ldexp(1.0, exponent_of(x, emin)) if x != 0.0 else 0.0


@njit(cache=True, parallel=True)
def pack_b(BT, emin, with_pow, X, PX):
    """X[b, jt, k, jj] = BT[b, jt*TN + jj, k] (0 past column N); PX the powers of two when with_pow."""
    nb, N, K = BT.shape
    tj = X.shape[1]
    for t in prange(nb * tj):
        b, jt = t // tj, t % tj
        for jj in range(TN):
            j = jt * TN + jj
            for k in range(K):
                x = np.float64(BT[b, j, k]) if j < N else 0.0
                X[b, jt, k, jj] = x
                if with_pow:
                    PX[b, jt, k, jj] = math.ldexp(1.0, exponent_of(x, emin)) if x != 0.0 else 0.0


@njit(cache=True)
def span(X):
    """(finite, msb, lsb) of a float32 array: whether every element is finite, and over its nonzero elements
    the largest floor(log2|x|) and the smallest exponent of a set significand bit (lsb > msb: all zero)."""
    msb, lsb = -100000, 100000
    for x in X.ravel():
        u = np.int64(np.float32(x).view(np.uint32))
        be = (u >> 23) & 255
        man = u & 8388607
        if be == 255:
            return False, msb, lsb
        if be == 0 and man == 0:
            continue
        sig = man | (1 << 23) if be > 0 else man
        e0 = (be if be > 0 else 1) - 150  # x = sig * 2**e0
        top = math.frexp(np.float64(x))[1] - 1
        low = e0
        while (sig >> (low - e0)) & 1 == 0:
            low += 1
        msb = max(msb, top)
        lsb = min(lsb, low)
    return True, msb, lsb


def packed_a(A, emin, with_pow):
    bA, M, K = A.shape
    X = np.empty((bA * M, K))
    PX = np.empty((bA * M, K)) if with_pow else np.empty((1, 1))
    pack_a(A, emin, with_pow, X, PX)
    return X, PX


def packed_b(BT, emin, with_pow):
    bB, N, K = BT.shape
    tj = (N + TN - 1) // TN
    X = np.empty((bB, tj, K, TN))
    PX = np.empty((bB, tj, K, TN)) if with_pow else np.empty((1, 1, 1, 1))
    pack_b(BT, emin, with_pow, X, PX)
    return X, PX
