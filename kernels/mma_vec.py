"""Vectorised exact paths of the NVIDIA datapaths (``emunum.mad.mma``) on the CPU: the scalar cores' bits
(``mma_scalar.nv_fused`` / ``nv_groups``), with inner loops over contiguous output columns and no branch per
product, so that the compiler emits SIMD code. ``out`` holds C (fp32 values as float64) on entry and D on
return; rows are distributed over threads, each output element is computed alone, so the bits never depend
on the thread count.

``fused8_gemm`` (NV_FUSED on elements of <= 8 bits, F <= 25; scales constant over a step). A step's term for
product k is trunc(a_k * b_k * 2**(es + F - E)) with es the step's scale exponents and E the step exponent
(the largest of exp(c) and exp(a_k) + exp(b_k) + es, zeros at -126): the integer the scalar core adds. Here
a_k * b_k is a float32 product (at most 8 significant bits: exact) and the power of two P = 2**(es + F - E)
a float32 too, its exponent clamped to [-90, 90], so no product underflows into float32's subnormals (the
product of the smallest e5m2 values with 2**-90 is 2**-122) and none overflows. Clamping changes nothing:
below -90 every |a_k b_k| P < 2**32 * 2**-90 truncates to 0 either way; above 90, E - es < F - 90 lies below
every non-zero product's exponent (>= -32), so all products of the step are zero. Every term satisfies
|a_k b_k P| < 4 * 2**F <= 2**27 (exp(a_k) + exp(b_k) + es <= E, significand product < 4), so float32 -> int32
truncation is exact and 16 terms sum in int32 without overflow (< 2**31) before they are added in int64.
c's term trunc(c * 2**(F - E)) is formed in binary64 (exact: |c| < 2**(exp(c) + 1)).

``groups_vec`` (NV_GROUPS, fp4_e2m1 elements, groups of 16, F <= 36). G, a group's sum, is summed in float32
and exact (E2M1 products are multiples of 2**-2 below 36 in magnitude, a group sum below 2**10: every
partial sum in any order is an exact float32). A group's term is
G * sig(sa) * sig(sb) * 2**(exp(sa) + exp(sb)); with scale significands kept as 8 * sig (integers <= 15),
w = G * (8 sig(sa)) * (8 sig(sb)) is an exact float32 (a multiple of 2**-2 below 2**17) and the term, in
units of 2**(E - F), is trunc(w * 2**(exp(sa) + exp(sb) - 6 + F - E)) (the exponent clamped to [-60, 60]:
below -60 the term truncates to 0 either way; it never exceeds F - 6). The step sum, below 2**50, is exact
in binary64. A NaN scale makes the step NaN, an infinite c passes through (``nv_groups``).

Both end a step with ``_trunc_fp32`` (``mma_scalar.truncate_fp32`` on binary64 bits, without branches).
"""
import math

import numpy as np
from numba import njit, prange

from . import _cache

_cache.guard(__file__, [])

FP32_EMIN = -126
TWO128 = 2.0**128
NAN_EXP = 1 << 20  # the exponent marking a NaN scale (``groups_vec``): every sum with it stays >= 2**19
TN = 128  # output columns a ``fused8_gemm`` tile advances together (its operand tile stays in L1)
RB = 8  # rows of a ``fused8_gemm`` task (they reuse one column tile of B from L2)
CHUNK = 16  # products summed in int32 (each term < 2**27)


@njit
def _pow2(k):
    """2**k as a binary64, exact for -1022 <= k <= 1023 (built from its bits)."""
    return np.uint64((k + 1023) << 52).view(np.float64)


@njit
def _pow2_32(k):
    """2**k as a float32, exact for -126 <= k <= 127."""
    return np.uint32((k + 127) << 23).view(np.float32)


@njit
def _ilogb(x):
    """floor(log2|x|) of a normal binary64 x; -1023 for 0."""
    return np.int64((np.float64(x).view(np.uint64) >> np.uint64(52)) & np.uint64(2047)) - 1023


@njit
def _trunc_fp32(v, out_man):
    """``mma_scalar.truncate_fp32`` of a normal binary64 v or 0: the same value, with selects for branches."""
    e = max(_ilogb(v), FP32_EMIN)
    t = np.floor(abs(v) * _pow2(out_man - e)) * _pow2(e - out_man)
    a = math.inf if t >= TWO128 else t
    return 0.0 if a == 0.0 else (-a if v < 0.0 else a)


@njit
def _c_exp(c):
    """exp(c) of an fp32 value c (0: -126), as the datapath takes it."""
    return max(_ilogb(c), FP32_EMIN)


@njit(cache=True, parallel=True)
def fused8_gemm(A, EA, B, EB, ESA, ESB, out, n, frac, out_man):
    """out (M, N) <- the NV_FUSED chain: A (M, K), B (K, N) float32 element values (finite), EA, EB int16 their
    exponents (exp(x), zeros -126); ESA (M, nsteps), ESB (nsteps, N) int64 the step's scale exponents (0
    without scales); n products per step; frac = F; out_man the result's fraction bits."""
    M, K = A.shape
    N = B.shape[1]
    nsteps = (K + n - 1) // n  # exponents as int16 (32 SIMD lanes): |exp(a) + exp(b)| <= 252
    for rb in prange((M + RB - 1) // RB):
        E = np.empty(TN, np.int16)
        Es = np.empty(TN, np.int64)
        P = np.empty(TN, np.float32)
        S = np.empty(TN, np.int64)
        S32 = np.empty(TN, np.int32)
        for j0 in range(0, N, TN):
            w = min(TN, N - j0)
            for i in range(rb * RB, min(M, rb * RB + RB)):
                o = out[i, j0:j0 + w]
                for s in range(nsteps):
                    k0 = s * n
                    k1 = min(K, k0 + n)
                    esb = ESB[s, j0:j0 + w]
                    esa = ESA[i, s]
                    for t in range(w):
                        E[t] = -30000
                    k = k0
                    while k + 4 <= k1:  # four products a pass: fewer loads and stores of E
                        ea0, ea1, ea2, ea3 = EA[i, k], EA[i, k + 1], EA[i, k + 2], EA[i, k + 3]
                        b0, b1 = EB[k, j0:j0 + w], EB[k + 1, j0:j0 + w]
                        b2, b3 = EB[k + 2, j0:j0 + w], EB[k + 3, j0:j0 + w]
                        for t in range(w):
                            E[t] = max(max(E[t], ea0 + b0[t]), max(max(ea1 + b1[t], ea2 + b2[t]), ea3 + b3[t]))
                        k += 4
                    for kk in range(k, k1):
                        ea = EA[i, kk]
                        b0 = EB[kk, j0:j0 + w]
                        for t in range(w):
                            E[t] = max(E[t], ea + b0[t])
                    for t in range(w):
                        cf = o[t] if math.isfinite(o[t]) else 0.0
                        es = esa + esb[t]
                        ep = np.int64(E[t]) + es
                        ec = _c_exp(cf)
                        e = max(ep, ec)
                        Es[t] = e
                        P[t] = _pow2_32(min(max(frac + es - e, -90), 90))
                        S[t] = np.int64(cf * _pow2(frac - e))
                    for kc in range(k0, k1, CHUNK):
                        for t in range(w):
                            S32[t] = 0
                        kend = min(k1, kc + CHUNK)
                        k = kc
                        while k + 4 <= kend:  # four products a pass: fewer loads and stores of S32
                            a0, a1, a2, a3 = A[i, k], A[i, k + 1], A[i, k + 2], A[i, k + 3]
                            b0, b1 = B[k, j0:j0 + w], B[k + 1, j0:j0 + w]
                            b2, b3 = B[k + 2, j0:j0 + w], B[k + 3, j0:j0 + w]
                            for t in range(w):
                                p = P[t]
                                S32[t] += (np.int32(a0 * b0[t] * p) + np.int32(a1 * b1[t] * p)) + \
                                    (np.int32(a2 * b2[t] * p) + np.int32(a3 * b3[t] * p))
                            k += 4
                        for kk in range(k, kend):
                            a = A[i, kk]
                            b0 = B[kk, j0:j0 + w]
                            for t in range(w):
                                S32[t] += np.int32(a * b0[t] * P[t])
                        for t in range(w):
                            S[t] += S32[t]
                    for t in range(w):
                        r = _trunc_fp32(np.float64(S[t]) * _pow2(Es[t] - frac), out_man)
                        o[t] = r if math.isfinite(o[t]) else o[t]


@njit(cache=True, parallel=True)
def groups_vec(A, B, EA, SA, EB, SB, out, groups, frac, out_man):
    """out (M, N) <- the NV_GROUPS chain: A (M, K), B (K, N) float32 E2M1 values (K a multiple of 16); EA
    (M, ngroups), EB (ngroups, N) int32 each group's scale exponents (zero scale: -126, NaN: NAN_EXP); SA, SB
    float32 8 * their significands (NaN: 0); ``groups`` per step; frac = F; out_man the result's fraction bits."""
    M, K = A.shape
    N = B.shape[1]
    ng = K // 16
    for i in prange(M):
        E = np.empty(N, np.int64)
        S = np.empty(N, np.float64)
        G = np.empty(N, np.float32)
        nan = np.empty(N, np.bool_)
        o = out[i]
        for g0 in range(0, ng, groups):
            g1 = min(ng, g0 + groups)
            for j in range(N):
                E[j] = -NAN_EXP
            for g in range(g0, g1):
                ea = EA[i, g]
                eb = EB[g]
                for j in range(N):
                    E[j] = max(E[j], np.int64(ea + eb[j]))
            for j in range(N):
                cf = o[j] if math.isfinite(o[j]) else 0.0
                e = max(E[j], _c_exp(cf))
                nan[j] = e >= NAN_EXP // 2
                e0 = e if e < NAN_EXP // 2 else 0  # a NaN scale: any exponent (the step is NaN)
                E[j] = e0
                S[j] = np.trunc(cf * _pow2(frac - e0))
            for g in range(g0, g1):
                for j in range(N):
                    G[j] = 0.0
                for k in range(16 * g, 16 * g + 16):  # the group sum: exact in any order (module docstring)
                    a = A[i, k]
                    b = B[k]
                    for j in range(N):
                        G[j] += a * b[j]
                ea = EA[i, g]
                sa = SA[i, g]
                eb = EB[g]
                sb = SB[g]
                for j in range(N):
                    h = min(max(ea + eb[j] - 6 + frac - E[j], -60), 60)
                    S[j] += np.trunc(np.float64(G[j] * (sa * sb[j])) * _pow2(h))
            for j in range(N):
                r = _trunc_fp32(S[j] * _pow2(E[j] - frac), out_man)
                o[j] = math.nan if nan[j] else (r if math.isfinite(o[j]) else o[j])


@njit(cache=True, parallel=True)
def exponents(X, emin, EX):
    """EX (int16) <- exp(x) of every float32 x of X (2-D): max(floor(log2|x|), emin), zeros -126 (emin > -127:
    float32 subnormals, biased exponent 0, are clamped to emin); returns the number of non-finite x."""
    R, C = X.shape
    bad = np.zeros(R, np.int64)
    for r in prange(R):
        cnt = 0
        for c in range(C):
            be = np.int32((np.float32(X[r, c]).view(np.uint32) >> np.uint32(23)) & np.uint32(255)) - 127
            EX[r, c] = -126 if X[r, c] == 0 else max(be, emin)
            cnt += 1 if be == 128 else 0
        bad[r] = cnt
    return bad.sum()
