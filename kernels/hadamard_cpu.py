"""The random Hadamard transform of float32 data as a fast Walsh-Hadamard butterfly (``emunum.hadamard.rht``).

``rht_f32(x, out, signs, shift)``: x is float32 viewed as (A, L, B) (the transformed dimension in the middle),
out a float32 (A, B, Lp) array, Lp = L rounded up to a multiple of n = signs.size. Each run of n elements along
L (zero-padded) is multiplied by the signs, transformed by the n x n Sylvester Hadamard matrix and scaled by
2**-shift = 1/sqrt(n); the sums are taken in float64 and rounded once to float32.

Why this equals the float64 product u @ M of ``rht``'s reference path, bit for bit: every term s_j H_ji u_j
is a float32 value with its sign flipped, so every partial sum the butterfly forms (a signed sum of a subset
of the run) is a multiple of the run's smallest unit in the last place, 2**lsb, and below the sum of the
magnitudes, 2**(emax + 1 + log2 n). Where emax + 1 + log2 n - lsb <= 53 every such sum is exact in float64,
in any order and grouping, so the butterfly and the matrix product (whatever its summation order) reach the
same exact value; the power-of-two scale is exact as well. The kernel checks that condition on every run,
with emax and lsb taken from the float32 exponent fields (a subnormal's counted as 1, which bounds both), and
returns False as soon as a run fails it or holds an infinity or NaN; the caller then takes the reference path.
A sum that is exactly zero is +0 in both: the product's accumulators start at +0 (a zero sum of terms that
are not all -0 is +0 in any order under round-to-nearest; ``+ 0.0`` makes the all -0 case agree).
Serial: the transform runs inside a training step's backward GEMM, on one thread.
"""
import numpy as np
from numba import njit

from . import _cache

_cache.guard(__file__, [])


@njit(cache=True)
def rht_f32(x, out, signs, shift):
    """out[a, b, r*n + i] = float32(2**-shift * sum_j signs[j] * H[j, i] * x[a, r*n + j, b]) for every run r
    (x read as zero beyond L); False (out partly written) where a run's sums might not be exact in float64."""
    A, L, B = x.shape
    n = signs.size
    runs = out.shape[2] // n
    log2n = 0
    while (1 << log2n) < n:
        log2n += 1
    span = 29 - log2n  # the largest exponent spread with exact float64 sums (module doc)
    scale = np.ldexp(1.0, -shift)
    work = np.empty((n, B), dtype=np.float64)
    bits = x.view(np.uint32)
    emax = np.empty(B, dtype=np.int64)
    emin = np.empty(B, dtype=np.int64)
    for a in range(A):
        for r in range(runs):
            for b in range(B):
                emax[b] = 0
                emin[b] = 1 << 20
            for j in range(n):
                t = r * n + j
                if t < L:
                    sj = np.float64(signs[j])
                    for b in range(B):
                        u = bits[a, t, b]
                        e = np.int64((u >> np.uint32(23)) & np.uint32(0xFF))
                        e1 = max(e, np.int64(1)) if (u & np.uint32(0x7FFFFFFF)) != np.uint32(0) else np.int64(0)
                        emax[b] = max(emax[b], e1)
                        emin[b] = min(emin[b], e1 if e1 != 0 else np.int64(1 << 20))
                        work[j, b] = sj * np.float64(x[a, t, b])
                else:
                    for b in range(B):
                        work[j, b] = 0.0
            for b in range(B):
                if emax[b] >= 255 or (emax[b] > 0 and emax[b] - emin[b] > span):
                    return False
            h = 1
            while h < n:
                for i0 in range(0, n, 2 * h):
                    for j in range(i0, i0 + h):
                        for b in range(B):
                            p = work[j, b]
                            q = work[j + h, b]
                            work[j, b] = p + q
                            work[j + h, b] = p - q
                h *= 2
            for b in range(B):
                for i in range(n):
                    out[a, b, r * n + i] = np.float32((work[i, b] + 0.0) * scale)
    return True
