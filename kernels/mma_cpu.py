"""Numba CPU kernel of the matrix-instruction datapaths (``emunum.mad.mma``; scalar cores in ``mma_scalar``).

B and its scales arrive transposed, BT (N, K) and SBT (N, K/block), so each dot product reads contiguous
rows. Rows i are distributed over threads with ``prange``; each output element is computed alone, step after
step in increasing k, so the bits never depend on the thread count. Compiles on first call (``cache=True``).
"""
import numpy as np
from numba import njit, prange

from . import _cache, mma_scalar

_cache.guard(__file__, [mma_scalar.__file__])

from .mma_scalar import dot  # noqa: E402


@njit(cache=True, parallel=True)
def gemm(A, BT, SA, SBT, C, out, prm):
    """out[i, j] = the instruction chain on row A[i], column BT[j] (scales SA[i], SBT[j]) and c = C[i, j]."""
    M, N = out.shape
    K = A.shape[1]
    for i in prange(M):
        for j in range(N):
            out[i, j] = dot(A[i], BT[j], SA[i], SBT[j], K, np.float64(C[i, j]), prm)
