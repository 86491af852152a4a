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
from .multiterm_scalar import (  # noqa: E402
    NLIMB, T_IN_EMIN, T_KIND, T_PROMOTE, T_TERMS, exact_accumulate, exact_result, fused_step, is_promotion_point,
    kul_clear, product, promote,
)


@njit(cache=True, parallel=True)
def gemm(A, BT, C, bias, has_bias, out, prm, mulp, accp, outerp, keys, nbits):
    """out[b, i, j] = the datapath's d for row A[b % bA, i], column BT[b % bB, j] and c = C[b, i, j]
    (+ bias[b, i, j] last, rounded to the result's format; exact units add it into the exact sum)."""
    nb, M, N = out.shape
    K = A.shape[2]
    bA, bB = A.shape[0], BT.shape[0]
    n = prm[T_TERMS]
    for t in prange(nb * M):
        b = t // M
        i = t % M
        ab, bb = b % bA, b % bB
        limbs = np.zeros(NLIMB, np.int64)
        av = np.empty(n, np.float32)
        bv = np.empty(n, np.float32)
        for j in range(N):
            o = (b * M + i) * N + j
            if prm[T_KIND] == 1:
                kul_clear(limbs)
                sp, has = exact_accumulate(limbs, C[b, i, j], 0.0, False)
                if has_bias:
                    sp, has = exact_accumulate(limbs, bias[b, i, j], sp, has)
                for k in range(K):
                    p, e = product(A[ab, i, k], BT[bb, j, k], prm[T_IN_EMIN], prm, mulp)
                    sp, has = exact_accumulate(limbs, p, sp, has)
                out[b, i, j] = exact_result(limbs, sp, has, accp, keys[S_ACC], o, nbits)
                continue
            acc = C[b, i, j]
            outer = 0.0
            k0 = 0
            while True:
                k1 = min(K, k0 + n)
                for q in range(k1 - k0):
                    av[q] = A[ab, i, k0 + q]
                    bv[q] = BT[bb, j, k0 + q]
                acc = fused_step(av, bv, k1 - k0, acc, prm, mulp, accp, limbs)
                if is_promotion_point(k1, K, prm):
                    outer = promote(outer, acc, outerp)
                    acc = 0.0
                k0 = k1
                if k0 >= K:
                    break
            if prm[T_PROMOTE] > 0:
                acc = outer
                if has_bias:
                    acc = add_round(acc, bias[b, i, j], outerp, keys[S_BIAS], o, nbits)
            elif has_bias:
                acc = add_round(acc, bias[b, i, j], accp, keys[S_BIAS], o, nbits)
            out[b, i, j] = acc
