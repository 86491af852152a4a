"""Numba CPU kernel of the multi-term (tensor-core) datapath and of exact accumulation.

The datapath is specified in ``emunum.mad.unit``; the scalar cores (steps, alignment, Kulisch accumulator)
are in ``multiterm_scalar``, shared with the CUDA kernel. B arrives transposed, (bB, N, K), so each dot
product reads two contiguous rows. Rows (b, i) are distributed over threads with ``prange``; each output
element is computed alone, in increasing k, so the bits never depend on the thread count.
Nothing is compiled at import; the kernel compiles on first call (``cache=True``).
"""
import math

import numpy as np
from numba import njit, prange

from . import _cache, gemm_exact_slices, gemm_multiterm_f64, gemm_pack, gemm_scalar, multiterm_scalar, scalar
from . import parallel as _parallel

_cache.guard(__file__, [*scalar.SOURCES, gemm_scalar.__file__, multiterm_scalar.__file__])

from .gemm_scalar import S_ACC, S_BIAS, add_round  # noqa: E402
from .multiterm_scalar import (  # noqa: E402
    NLIMB, T_IN_EMIN, T_KIND, T_PROMOTE, T_TERMS, exact_accumulate, exact_result, fused_step, is_promotion_point,
    kul_add_int, kul_clear, product, promote, decompose, fast_step, T_AMODE, T_P, T_FUSED, T_FLOOR, T_C_EMIN,
    T_CARRY, NO_FLOOR, round_int_scaled,
)
from .gemm_scalar import P_MODE, f64_bits, round_value  # noqa: E402
from .scalar import STOCHASTIC  # noqa: E402

TN = 32  # output columns advanced together by ``gemm_int_tiled``
N_F64 = 4  # below this many output columns the integer kernel beats gemm_multiterm_f64's padded column tiles
INT_COST = 16  # one product of gemm_int costs about this many column slots of gemm_multiterm_f64 (measured ~38)


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


@njit(cache=True, parallel=True)
def split(X, emin, M, E):
    """M, E <- ``decompose`` of every element of X (b, r, K); returns whether all are exact integers."""
    nb, R, K = X.shape
    bad = np.zeros(nb * R, np.int64)
    for t in prange(nb * R):
        b, r = t // R, t % R
        for k in range(K):
            m, e, ok = decompose(np.float64(X[b, r, k]), emin)
            M[t, k] = m
            E[t, k] = e
            if not ok:
                bad[t] = 1
    return bad.sum() == 0


@njit(cache=True, parallel=True)
def gemm_int(MA, EA, MB, EB, bA, bB, C, bias, has_bias, out, prm, accp, outerp, keys, nbits):
    """``gemm`` on integer operands (``split``; rows b*M + i of A, b*N + j of B^T) for fused units with
    toward-zero alignment (multi-term) or exact accumulation: the same bits, integer arithmetic."""
    nb, M, N = out.shape
    K = MA.shape[1]
    n = prm[T_TERMS]
    for t in prange(nb * M):
        b = t // M
        i = t % M
        ia = (b % bA) * M + i
        limbs = np.zeros(NLIMB, np.int64)
        for j in range(N):
            ib = (b % bB) * N + j
            o = (b * M + i) * N + j
            if prm[T_KIND] == 1:
                kul_clear(limbs)
                sp, has = exact_accumulate(limbs, C[b, i, j], 0.0, False)
                if has_bias:
                    sp, has = exact_accumulate(limbs, bias[b, i, j], sp, has)
                for k in range(K):
                    prod = MA[ia, k] * MB[ib, k]
                    if prod != 0:
                        kul_add_int(limbs, prod, EA[ia, k] + EB[ib, k] - 46)
                out[b, i, j] = exact_result(limbs, sp, has, accp, keys[S_ACC], o, nbits)
                continue
            acc = C[b, i, j]
            outer = 0.0
            k0 = 0
            while True:
                k1 = min(K, k0 + n)
                acc = fast_step(MA, EA, ia, MB, EB, ib, k0, k1, acc, prm, accp)
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


@njit(cache=True, parallel=True)
def gemm_int_tiled(MA, EA, MB, EB, bA, bB, C, bias, has_bias, out, prm, accp, outerp, keys, nbits):
    """Multi-term ``gemm_int`` with TN output columns per step pass (MB, EB as (bB, K, N): contiguous in the
    column), so the alignment loops run over columns (SIMD). Same operations per element: same bits."""
    nb, M, N = out.shape
    K = MA.shape[1]
    n = prm[T_TERMS]
    p_bits = prm[T_P]
    floor = prm[T_FLOOR]
    cemin = prm[T_C_EMIN]
    tj = (N + TN - 1) // TN
    for t in prange(nb * M * tj):
        b = t // (M * tj)
        r = t % (M * tj)
        i = r // tj
        j0 = (r % tj) * TN
        nj = min(TN, N - j0)
        ia = (b % bA) * M + i
        bb = b % bB
        acc = np.empty(TN)
        outer = np.zeros(TN)
        em = np.empty(TN, np.int64)
        base = np.empty(TN, np.int64)
        s = np.empty(TN, np.int64)
        for jj in range(nj):
            acc[jj] = C[b, i, j0 + jj]
        k0 = 0
        while True:
            k1 = min(K, k0 + n)
            for jj in range(TN):
                em[jj] = NO_FLOOR
            for k in range(k0, k1):
                a = MA[ia, k]
                if a == 0:
                    continue
                ea = EA[ia, k]
                for jj in range(nj):
                    e = ea + EB[bb, k, j0 + jj] if MB[bb, k, j0 + jj] != 0 else NO_FLOOR
                    em[jj] = max(em[jj], e)
            for jj in range(nj):
                c = acc[jj]
                E = max(em[jj], floor)
                s[jj] = 0
                if c != 0.0 and math.isfinite(c):
                    cb = f64_bits(c)
                    be = np.int64((cb >> np.uint64(52)) & np.uint64(2047))
                    ec = max(be - 1023, cemin)
                    E = max(E, ec)
                    cm = np.int64(cb & np.uint64(4503599627370495)) | (np.int64(1) << 52)
                    sh = min(E - p_bits - (be - 1075), 63)
                    v = cm >> sh
                    s[jj] = -v if c < 0.0 else v
                base[jj] = E - p_bits
            for k in range(k0, k1):
                a = MA[ia, k]
                if a == 0:
                    continue
                ea46 = EA[ia, k] - 46
                for jj in range(nj):
                    prod = a * MB[bb, k, j0 + jj]
                    sh = min(base[jj] - ea46 - EB[bb, k, j0 + jj], 63)
                    sgn = prod >> 63
                    s[jj] += (((prod ^ sgn) - sgn) >> sh ^ sgn) - sgn
            for jj in range(nj):
                c = acc[jj]
                if not math.isfinite(c):
                    acc[jj] = round_value(c, accp, np.uint64(0), 32)
                elif em[jj] == NO_FLOOR and c == 0.0:
                    acc[jj] = 0.0
                else:
                    sv = s[jj]
                    if prm[T_CARRY] >= 0:
                        w = 3 + prm[T_CARRY] + p_bits
                        h = np.int64(1) << (w - 1)
                        sv = ((sv + h) & ((np.int64(1) << w) - 1)) - h
                    acc[jj] = round_int_scaled(sv, base[jj], accp)
                if is_promotion_point(k1, K, prm):
                    outer[jj] = promote(outer[jj], acc[jj], outerp)
                    acc[jj] = 0.0
            k0 = k1
            if k0 >= K:
                break
        for jj in range(nj):
            o = (b * M + i) * N + j0 + jj
            y = acc[jj]
            if prm[T_PROMOTE] > 0:
                y = outer[jj]
                if has_bias:
                    y = add_round(y, bias[b, i, j0 + jj], outerp, keys[S_BIAS], o, nbits)
            elif has_bias:
                y = add_round(y, bias[b, i, j0 + jj], accp, keys[S_BIAS], o, nbits)
            out[b, i, j0 + jj] = y


def gemm_auto(A, BT, C, bias, has_bias, out, prm, mulp, accp, outerp, keys, nbits, fast=True):
    """The fastest kernel that applies, all with ``gemm``'s bits: ``gemm_multiterm_f64`` (fused multi-term,
    toward-zero alignment, operands and C in its proven range; for N < N_F64 only where the integer kernel does
    not apply), ``gemm_exact_slices`` (exact accumulation of exact products within its exponent span),
    ``gemm_int``/``gemm_int_tiled`` (exact products; toward-zero alignment or exact accumulation; operands on
    their format's grid), else ``gemm``. Holds the process-wide parallel lock. Returns the name of the kernel
    that ran. fast=False: skip the float64 kernels (the integer and general kernels only: a baseline for
    benchmarks and tests)."""
    with _parallel.exclusive():
        return _gemm_auto(A, BT, C, bias, has_bias, out, prm, mulp, accp, outerp, keys, nbits, fast)


def _gemm_auto(A, BT, C, bias, has_bias, out, prm, mulp, accp, outerp, keys, nbits, fast):
    exact = prm[T_KIND] == 1
    f64 = (fast and not exact and A.shape[2] > 0 and gemm_multiterm_f64.applies(prm, accp, C)
           and np.isfinite(A).all() and np.isfinite(BT).all())  # K = 0: gemm's one step of c alone
    if f64 and _transposed_pays(A.shape[1], BT.shape[1]) and _index_free(prm, accp, outerp, has_bias):
        return _run_f64_transposed(A, BT, C, bias, has_bias, out, prm, accp, outerp, keys, nbits)
    if f64 and BT.shape[1] >= N_F64:
        return _run_f64(A, BT, C, bias, has_bias, out, prm, accp, outerp, keys, nbits)
    if fast and exact and prm[T_FUSED] == 1:
        okA, msbA, lsbA = gemm_pack.span(A)
        okB, msbB, lsbB = gemm_pack.span(BT)
        sig = gemm_exact_slices.plan(A.shape[2], msbA, lsbA, msbB, lsbB) if okA and okB else None
        if sig is not None:
            A64, _ = gemm_pack.packed_a(A, 0, False)
            B64, _ = gemm_pack.packed_b(BT, 0, False)
            gemm_exact_slices.gemm(A64, B64, A.shape[0], BT.shape[0], C, bias, has_bias, out, sig, accp, keys, nbits)
            return "exact_slices"
    if prm[T_FUSED] == 1 and (exact or (prm[T_P] >= 0 and prm[T_AMODE] == 2)):
        bA, M, K = A.shape
        bB, N, _ = BT.shape
        MA, EA = np.empty((bA * M, K), np.int64), np.empty((bA * M, K), np.int64)
        MB, EB = np.empty((bB * N, K), np.int64), np.empty((bB * N, K), np.int64)
        emin = prm[T_IN_EMIN]
        if split(A, emin, MA, EA) and split(BT, emin, MB, EB):
            if exact or N < 8:  # column tiles pay off only for wide outputs
                gemm_int(MA, EA, MB, EB, bA, bB, C, bias, has_bias, out, prm, accp, outerp, keys, nbits)
                return "int"
            else:
                MBk = np.ascontiguousarray(MB.reshape(bB, N, K).transpose(0, 2, 1))
                EBk = np.ascontiguousarray(EB.reshape(bB, N, K).transpose(0, 2, 1))
                gemm_int_tiled(MA, EA, MBk, EBk, bA, bB, C, bias, has_bias, out, prm, accp, outerp, keys, nbits)
                return "int_tiled"
    if f64:  # narrow output, operands off their format's grid: padded column tiles still beat ``gemm``
        return _run_f64(A, BT, C, bias, has_bias, out, prm, accp, outerp, keys, nbits)
    gemm(A, BT, C, bias, has_bias, out, prm, mulp, accp, outerp, keys, nbits)
    return "general"


def _run_f64(A, BT, C, bias, has_bias, out, prm, accp, outerp, keys, nbits):
    emin = prm[T_IN_EMIN]
    A64, PA = gemm_pack.packed_a(A, emin, True)
    B64, PB = gemm_pack.packed_b(BT, emin, True)
    gemm_multiterm_f64.gemm(A64, PA, B64, PB, A.shape[0], BT.shape[0], C, bias, has_bias, out, prm, accp, outerp,
                            keys, nbits, gemm_multiterm_f64.fast_rounding(accp))
    return "multiterm_f64"


def _transposed_pays(M, N) -> bool:
    """Whether ``gemm_multiterm_f64`` on out^T (M columns, padded to whole tiles of ``gemm_pack.TN``) does less
    work than the kernel that runs on out (N columns: the f64 kernel's padded tiles, or below N_F64 columns the
    integer kernel at INT_COST slots per product). A conv's GEMM on a small feature map has a few columns."""
    tn = gemm_pack.TN
    now = M * (-(-N // tn) * tn) if N >= N_F64 else INT_COST * M * N
    return N * (-(-M // tn) * tn) < now


def _index_free(prm, accp, outerp, has_bias) -> bool:
    """Whether no rounding of the float64 kernel draws a stochastic counter (the output's index, which a
    transposed run would change): only the bias's ``add_round`` can, in its format's mode."""
    return not has_bias or (outerp if prm[T_PROMOTE] > 0 else accp)[P_MODE] != STOCHASTIC


def _run_f64_transposed(A, BT, C, bias, has_bias, out, prm, accp, outerp, keys, nbits):
    """``_run_f64`` on out^T[b] = B[b % bB]^T A[b % bA]^T: each element is the same dot product of the same
    finite operands (exact binary64 products, which commute) with the same c and bias, so the same bits."""
    nb, M, N = out.shape
    CT = np.ascontiguousarray(C.transpose(0, 2, 1))
    biasT = np.ascontiguousarray(bias.transpose(0, 2, 1)) if has_bias else bias
    outT = np.empty((nb, N, M))
    _run_f64(BT, A, CT, biasT, has_bias, outT, prm, accp, outerp, keys, nbits)
    out[...] = outT.transpose(0, 2, 1)
    return "multiterm_f64_transposed"
