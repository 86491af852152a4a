"""Exact fast path of the mxf4nvf4 datapath (``emunum.mad.mma``, NV_GROUPS) on the CPU: the same bits as
``mma_scalar.nv_groups``, with the products summed by a float64 GEMM wherever that sum is provably exact.

Why it is exact. In a step, group g's term is G_g * sig(sa) * sig(sb) * 2**e_g with G_g a multiple of 2**-2
and scale significands multiples of 2**-3, so the term is a multiple of 2**(e_g - 8). With E the step
exponent, the datapath truncates it at 2**(E - F) (F = 35): nothing is lost when E - e_g <= F - 8 for every
group. Then the step's aligned sum S * 2**(E - F) equals trunc(c at 2**(E - F)) + P, P the exact sum of the
step's scaled products a*sa*b*sb, and P is what a float64 GEMM of the scaled operands returns: every term and
partial sum is a multiple of 2**(min e_g - 8) below 2**(max e_g + 13), at most 2**48 units when
max e_g - min e_g <= 27, so no summation order rounds. c' + P is exact for the same reason. Steps that fail the
test (groups far apart in exponent, a NaN scale, a non-finite c or P) take the scalar core.
"""
import math

import numpy as np
from numba import njit, prange

from . import _cache, mma_scalar

_cache.guard(__file__, [mma_scalar.__file__])

from .mma_scalar import FP32_EMIN, FRAC, OUT_MAN, TERMS, nv_groups, sig_exp, trunc_int, truncate_fp32  # noqa: E402

GROUP = 16


@njit(cache=True, parallel=True)
def groups_gemm(A, BT, SA, SBT, C, P, EA, EBT, out, prm):
    """out[i, j]: the mxf4nvf4 chain on row i / column j. P (nsteps, M, N): the float64 GEMM of each step's scaled
    products; EA (M, ngroups), EBT (N, ngroups): each group's scale exponent (sig_exp's; NaN scales: a huge
    value, which fails the exactness test)."""
    M, N = out.shape
    K = A.shape[1]
    n = prm[TERMS]
    frac = prm[FRAC]
    lim = frac - 8
    for i in prange(M):
        for j in range(N):
            acc = np.float64(C[i, j])
            s = 0
            for k0 in range(0, K, n):
                k1 = min(K, k0 + n)
                p = P[s, i, j]
                fast = math.isfinite(acc) and math.isfinite(p)
                if fast:
                    emax = -1000000
                    emin = 1000000
                    for g in range(k0 // GROUP, (k1 + GROUP - 1) // GROUP):
                        e = EA[i, g] + EBT[j, g]
                        emax = e if e > emax else emax
                        emin = e if e < emin else emin
                    sc, ec = sig_exp(acc, FP32_EMIN)
                    E = ec if ec > emax else emax
                    fast = E - emin <= lim
                if fast:
                    cq = math.ldexp(np.float64(trunc_int(math.ldexp(sc, frac + ec - E))), E - frac)
                    acc = truncate_fp32(cq + p, prm[OUT_MAN])
                else:
                    acc = nv_groups(A[i], BT[j], SA[i], SBT[j], k0, k1, acc, prm)
                s += 1
            out[i, j] = acc
