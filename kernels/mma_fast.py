"""Exact fast paths of the NVIDIA datapaths (``emunum.mad.mma``) on the CPU, the same bits as the scalar cores.

``fused_gemm`` (NV_FUSED: f8f6f4, mxf8f6f4, wgmma, mma): ``nv_fused`` on integer operands. Each element is split
once into x = m * 2**(e - man) (int32 m and e, e = exp(x), zero: m = 0, e = -126); a step then needs integer
adds, a max, and shifts: a product m_a*m_b at exponent e_a + e_b + es (es: the step's scale exponents) in
units of 2**(E - F) is m_a*m_b shifted by F - 2*man + e_a + e_b + es - E (right shifts truncate the magnitude:
toward zero), c likewise with its 24-bit significand; S fits int64 (|S| < 2**33 for F <= 25, man <= 7).

The vectorised paths of ``mma_vec`` run fp8 fused steps and mxf4nvf4; this one runs the others (bf16 mma,
F > 25) where operands and scales are finite and the scales are constant over a step.
"""
import math

import numpy as np
from numba import njit, prange

from . import _cache, mma_scalar

_cache.guard(__file__, [mma_scalar.__file__])

from .mma_scalar import FP32_EMIN, FRAC, OUT_MAN, TERMS, TWO128, ZERO_EXP, nv_fused, sig_exp  # noqa: E402



@njit(cache=True, parallel=True)
def split(X, emin, man, MX, EX):
    """MX, EX <- the integer significand and exponent of every element of X (rows, K); False if any element
    is not finite or not an integer multiple of 2**(e - man) (not a value of the format)."""
    R, K = X.shape
    bad = np.zeros(R, np.int64)
    for r in prange(R):
        for k in range(K):
            x = np.float64(X[r, k])
            if x == 0.0:
                MX[r, k] = 0
                EX[r, k] = ZERO_EXP
                continue
            if not math.isfinite(x):
                bad[r] = 1
                continue
            e = math.frexp(x)[1] - 1
            e = e if e > emin else emin
            y = math.ldexp(x, man - e)
            if y != math.floor(y):
                bad[r] = 1
            MX[r, k] = np.int32(y)
            EX[r, k] = e
    return bad.sum() == 0


@njit(cache=True)
def _shift_trunc(v, sh):
    """v * 2**sh for sh >= 0, else v / 2**-sh truncated toward zero (v an int64)."""
    sgn = v >> 63
    u = (v ^ sgn) - sgn
    left = sh if sh > 0 else 0
    right = -sh if sh < 0 else 0
    right = right if right < 63 else 63
    t = (u << left) >> right
    return (t ^ sgn) - sgn


TN = 64  # output columns advanced together by ``fused_gemm`` (its inner loops run over them: SIMD)


@njit(cache=True, parallel=True)
def fused_gemm(A, BT, SA, SBT, C, MA, EA, MB, EB, ESA, ESB, man, out, prm):
    """out[i, j]: the NV_FUSED chain on integer operands (``split`` of A (M, K) and of B (K, N), not
    transposed, so the inner loops run over contiguous columns j); ESA (M, nsteps), ESB (nsteps, N): the step's
    scale exponents (0 without scales). A non-finite c takes the scalar core (on A and BT)."""
    M, N = out.shape
    K = MA.shape[1]
    n = prm[TERMS]
    frac = prm[FRAC]
    for i in prange(M):
        acc = np.empty(TN, np.float64)
        S = np.empty(TN, np.int64)
        E = np.empty(TN, np.int64)
        base = np.empty(TN, np.int64)
        for j0 in range(0, N, TN):
            w = min(TN, N - j0)
            for t in range(w):
                acc[t] = np.float64(C[i, j0 + t])
            s = 0
            for k0 in range(0, K, n):
                k1 = min(K, k0 + n)
                for t in range(w):
                    E[t] = -1000000
                for k in range(k0, k1):  # the step exponent: the largest product exponent ...
                    ea = EA[i, k]
                    for t in range(w):
                        e = ea + EB[k, j0 + t]
                        E[t] = e if e > E[t] else E[t]
                for t in range(w):  # ... with the scales, and c's
                    es = ESA[i, s] + ESB[s, j0 + t]
                    sc, ec = sig_exp(acc[t], FP32_EMIN) if math.isfinite(acc[t]) else (0.0, FP32_EMIN)
                    e = E[t] + es
                    e = ec if ec > e else e
                    E[t] = e
                    base[t] = frac - 2 * man + es - e
                    S[t] = _shift_trunc(np.int64(math.ldexp(sc, 23)), frac - 23 + ec - e)
                for k in range(k0, k1):
                    ma = MA[i, k]
                    ea = EA[i, k]
                    for t in range(w):
                        S[t] += _shift_trunc(np.int64(ma * MB[k, j0 + t]), base[t] + ea + EB[k, j0 + t])
                for t in range(w):
                    if math.isfinite(acc[t]):
                        acc[t] = _truncate_fp32(np.float64(S[t]) * _pow2(E[t] - frac), prm[OUT_MAN])
                    else:
                        acc[t] = nv_fused(A[i], BT[j0 + t], SA[i], SBT[j0 + t], k0, k1, acc[t], prm)
                s += 1
            for t in range(w):
                out[i, j0 + t] = acc[t]


@njit(cache=True)
def _ilogb(x):
    """floor(log2|x|) of a normal nonzero binary64 x (from its exponent field)."""
    return np.int64((np.float64(x).view(np.uint64) >> np.uint64(52)) & np.uint64(2047)) - 1023


@njit(cache=True)
def _pow2(k):
    """2**k for -1022 <= k <= 1023, exactly (built from its bits)."""
    return np.uint64((k + 1023) << 52).view(np.float64)


@njit(cache=True)
def _truncate_fp32(v, out_man):
    """``mma_scalar.truncate_fp32`` with bit-level exponents, for a normal binary64 v or 0: the same value."""
    if v == 0.0:
        return 0.0
    e = _ilogb(v)
    e = e if e > FP32_EMIN else FP32_EMIN
    a = math.floor(abs(v) * _pow2(out_man - e)) * _pow2(e - out_man)
    if a == 0.0:
        return 0.0
    if a >= TWO128:
        a = math.inf
    return -a if v < 0.0 else a
