"""Operand packing for the column-tiled float64 GEMM kernels (``gemm_multiterm_f64``, ``gemm_exact_slices``).

A (bA, M, K) float32 becomes float64 rows (bA*M, K); B^T (bB, N, K) float32 becomes column tiles
(bB, ceil(N/TN), K, TN) float64, zero-padded past column N, so that one tile's K x TN block is contiguous (no
cache-set aliasing from a power-of-two row stride) and every column loop has the constant trip count TN.
Optionally each operand's power of two 2**ea, ea = max(floor(log2|x|), emin) (``multiterm_scalar.exponent_of``),
0 for a zero. Every conversion is exact (float32 -> float64, a normal binary64 whose exponent bits alone are
2**floor(log2|x|), in [2**-149, 2**127]).
Also: the operands' finiteness and their exponent range (``span``), on which the kernels' plans depend.
"""
import numpy as np
from numba import njit, prange

from . import _cache, gemm_scalar, scalar

_cache.guard(__file__, [*scalar.SOURCES, gemm_scalar.__file__])

from .gemm_scalar import bits_f64, f64_bits  # noqa: E402

EXP = np.uint64(0x7FF0000000000000)

TN = 128  # output columns per tile (16 AVX-512 registers of float64)
KB = 32   # rows of K per block of pack_b's transpose (a 32 x TN float64 block: 32 KiB)


@njit(inline="always")
def pow_of(x, eminb):
    """2**max(floor(log2|x|), emin) for a float64 x converted from a float32 (a normal binary64 or 0: its
    exponent bits are 2**floor(log2|x|)), 0 for x = 0; eminb: the bits of 2**emin. Same as ``exponent_of``."""
    e = f64_bits(x) & EXP
    e = e if e > eminb else eminb
    return bits_f64(e) if x != 0.0 else 0.0


@njit(cache=True, parallel=True)
def pack_a(A, emin, with_pow, X, PX):
    """X[b*M + i, k] = A[b, i, k] (float64); PX the same rows of 2**ea (0 for a zero) when with_pow."""
    nb, M, K = A.shape
    eminb = np.uint64(max(emin, -1022) + 1023) << np.uint64(52)
    for t in prange(nb * M):
        b, i = t // M, t % M
        for k in range(K):
            X[t, k] = np.float64(A[b, i, k])
        if with_pow:
            for k in range(K):
                PX[t, k] = pow_of(X[t, k], eminb)


@njit(cache=True, parallel=True)
def pack_b(BT, emin, with_pow, X, PX):
    """X[b, jt, k, jj] = BT[b, jt*TN + jj, k] (0 past column N); PX the powers of two when with_pow."""
    nb, N, K = BT.shape
    tj = X.shape[1]
    eminb = np.uint64(max(emin, -1022) + 1023) << np.uint64(52)
    kbs = (K + KB - 1) // KB
    for t in prange(nb * tj * kbs):
        b, jt, k0 = t // (tj * kbs), (t // kbs) % tj, (t % kbs) * KB
        k1 = min(K, k0 + KB)
        for jj in range(TN):  # a KB x TN block at a time: the transpose stays in L1/L2
            j = jt * TN + jj
            if j < N:
                for k in range(k0, k1):
                    X[b, jt, k, jj] = np.float64(BT[b, j, k])
            else:
                for k in range(k0, k1):
                    X[b, jt, k, jj] = 0.0
        if with_pow:
            for k in range(k0, k1):
                for jj in range(TN):
                    PX[b, jt, k, jj] = pow_of(X[b, jt, k, jj], eminb)


@njit(cache=True, parallel=True)
def _span_rows(X, bad, hi, lo):
    R, K = X.shape
    for r in prange(R):
        nbad, h, lw = 0, np.int64(0), np.int64(4095)
        for k in range(K):
            u = np.int64(np.float32(X[r, k]).view(np.uint32))
            be = (u >> 23) & 255
            man = u & 8388607
            sig = man | (1 << 23) if be > 0 else man
            nbad += be == 255
            # x = sig * 2**(e0 - 150): the top bit's exponent from the binary64 value, the lowest set bit's
            # from sig & -sig (a power of two, exact in binary64); biased by 1023 (0: x = 0)
            top = np.int64((f64_bits(np.float64(X[r, k])) >> np.uint64(52)) & np.uint64(2047))
            low = np.int64((f64_bits(np.float64(sig & -sig)) >> np.uint64(52)) & np.uint64(2047))
            low += (be if be > 0 else 1) - 150
            h = top if top > h else h
            lw = low if (sig != 0 and low < lw) else lw
        bad[r], hi[r], lo[r] = nbad, h, lw


def span(X):
    """(finite, msb, lsb) of a float32 array: whether every element is finite, and over its nonzero elements
    the largest floor(log2|x|) and the smallest exponent of a set significand bit (lsb > msb: all zero)."""
    X2 = X.reshape(-1, X.shape[-1]) if X.size else np.zeros((1, 1), np.float32)
    R = X2.shape[0]
    bad, hi, lo = np.empty(R, np.int64), np.empty(R, np.int64), np.empty(R, np.int64)
    _span_rows(X2, bad, hi, lo)
    h, lw = int(hi.max()), int(lo.min())
    if h == 0:  # every element is zero
        return bool(bad.sum() == 0), -100000, 100000
    return bool(bad.sum() == 0), h - 1023, lw - 1023


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
