"""Numba CPU kernel of the multi-term (tensor-core) datapath and of exact accumulation.

The datapath is specified in ``emunum.mad.unit``; the scalar cores (steps, alignment, Kulisch accumulator)
are in ``multiterm_scalar``, shared with the CUDA kernel. B arrives transposed, (bB, N, K), so each dot
product reads two contiguous rows. Rows (b, i) are distributed over threads with ``prange``; each output
element is computed alone, in increasing k, so the bits never depend on the thread count.
Nothing is compiled at import; the kernel compiles on first call (``cache=True``).
"""
import numpy as np
from numba import njit, prange

from . import _cache, gemm_scalar, multiterm_scalar, scalar

_cache.guard(__file__, [scalar.__file__, gemm_scalar.__file__, multiterm_scalar.__file__])

from .gemm_scalar import S_ACC, S_BIAS, add_round  # noqa: E402
from .multiterm_scalar import NLIMB, T_KIND, dot_exact, dot_multiterm  # noqa: E402


@njit(cache=True, parallel=True)
def gemm(A, BT, C, bias, has_bias, out, prm, mulp, accp, outerp, keys, nbits):
    """out[b, i, j] = the datapath's d for row A[b % bA, i], column BT[b % bB, j] and c = C[b, i, j]
    (+ bias[b, i, j] last, rounded to the result's format; exact units add it into the exact sum)."""
    nb, M, N = out.shape
    K = A.shape[2]
    bA, bB = A.shape[0], BT.shape[0]
    for t in prange(nb * M):
        b = t // M
        i = t % M
        ab, bb = b % bA, b % bB
        limbs = np.zeros(NLIMB, np.int64)
        for j in range(N):
            o = (b * M + i) * N + j
            if prm[T_KIND] == 1:
                bv = bias[b, i, j] if has_bias else 0.0
                out[b, i, j] = dot_exact(A, ab, i, BT, bb, j, K, C[b, i, j], bv, prm, mulp, accp, limbs,
                                         keys[S_ACC], o, nbits)
            else:
                y = dot_multiterm(A, ab, i, BT, bb, j, K, C[b, i, j], prm, mulp, accp, outerp, limbs)
                if has_bias:
                    y = add_round(y, bias[b, i, j], outerp if prm[6] > 0 else accp, keys[S_BIAS], o, nbits)
                out[b, i, j] = y
