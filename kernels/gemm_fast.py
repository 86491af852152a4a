"""The MAD fast GEMM kernel (``gemm_cpu.gemm`` picks it where ``gemm_fast_plan.fast_plan`` allows): the datapath
of ``emunum.mad``, output tiles of ``gemm_cpu.TM x TN`` elements over threads as in ``gemm_general``.

``gemm_fast`` runs both roundings to nearest-even FloatFormats, product precision P <= accumulator precision
p (significant bits, man + 1), not fused. Arithmetic in a work precision t: binary64 (t = 53) or, where
``fast_plan`` proves it exact, binary32 (t = 24, twice the SIMD width). Rounding is ``round_nearest_fast``
(Veltkamp split / magic constant, branch-free) and a sum x + y (product + accumulator, chunk and lane
sums) is taken as fl_t(x + y), without TwoSum. That is exact: let |x| >= |y|, E the exponent of x, and
Q <= p the significant bits of y. If fl_t(x + y) != x + y, y's last bit is below x + y's last place, so
|y| < 2**(E+1-t+Q); then x + y and fl_t(x + y) both lie within 2**(E+1-t+Q) + 2**(E+1-t) of x. Where x
is on the accumulator's grid (an accumulator value, or a product: P <= p), the grid's midpoints nearest x
are at least 2**(E-p-1) away, which is farther when p + Q <= 2p <= t - 3: both values round to x. A
product off the grid lies beyond the accumulator's range (both overflow) or below its quantum (then
|y| <= |x| and x + y is exact). t = 53 holds for every format (p <= 24); t = 24 needs p <= 10.
Bias is added with TwoSum and round-to-odd in binary64.
Zeros: where a sum may round to zero (``acc_sub``), quantize's sign of zero (-0 for a negative value where
the format has -0, +0 where it has none) needs ``_signed`` on every rounding, products included, as they may
meet an accumulator that holds -0. Without it only zeros may differ (``_mac_row``), so: an accumulator
without -0 needs nothing (the unsigned roundings give +0 and no accumulator ever holds -0); one with -0 runs
unsigned and computes a tile row again, signed, where a result is zero (``Zeros``). Where no sum rounds to
zero, accumulators never hold -0 and IEEE addition's zeros are already those of ``gemm_general``.
The inner loop is compiled once per combination of its flags (``_mac_row``), branch-free.
``tests/kernels/test_gemm_cpu.py`` checks every variant against ``gemm_general`` bit for bit.
"""
import enum
import math

import numpy as np
from numba import njit, prange

from . import _cache, gemm_scalar, scalar

_cache.guard(__file__, [*scalar.SOURCES, gemm_scalar.__file__])

from .gemm_scalar import canonical_nan, round_odd, two_sum  # noqa: E402
from .scalar import round_nearest_fast  # noqa: E402

TM, TN = 8, 64  # output tile: rows x columns (``gemm_cpu`` lays GEMMs out for it)


@njit(inline="always")
def _signed(y, x, zero, sub):
    """quantize's zero for y, the fast rounding of x: x's sign where the format has -0 (zero = -0.0; adding it
    changes nothing else), +0 where it has none (zero = +0.0 turns -0 into +0). sub: y may come from the
    subnormal branch, whose (x + magic) - magic drops x's sign (copysign restores it: every other y already
    has x's sign, NaN and overflow values included)."""
    return (math.copysign(y, x) if sub else y) + zero


@njit(inline="always")
def _mac_row(acc, brow, a, mulf, accf, mul_sub, acc_sub, checks, signed):
    """acc[j] <- round_acc(round_mul(a * brow[j]) + acc[j]) for every j (round-to-nearest, fast rounding).
    signed (with acc_sub): zero results take quantize's sign. Without it a zero result may have the wrong sign,
    and only that: each value equals the signed one up to the sign of a zero (a nonzero x + 0 is x whatever
    the zero's sign, and a rounding keeps a nonzero value's sign), so every nonzero result is the same."""
    ms, mm, mn, mx, mo, mz = mulf[0], mulf[1], mulf[2], mulf[3], mulf[4], mulf[5]
    as_, am, an, ax, ao, az = accf[0], accf[1], accf[2], accf[3], accf[4], accf[5]
    for jj in range(acc.size):
        x = a * brow[jj]
        p = round_nearest_fast(x, ms, mm, mn, mx, mo, mul_sub, checks)
        if signed:
            p = _signed(p, x, mz, mul_sub)
        s = p + acc[jj]
        y = round_nearest_fast(s, as_, am, an, ax, ao, acc_sub, checks)
        acc[jj] = _signed(y, s, az, True) if signed else y


@njit(inline="always")
def _add_row(acc, brow, a, accf, mz, acc_sub, signed):
    """acc[j] <- round_acc(a * brow[j] + acc[j]) for every j: ``_mac_row`` where every product a * brow[j] is
    exact in the work dtype and a value of the product format, so that its rounding returns it (up to the sign
    of a zero: mz, the product format's zero, as in ``_signed``)."""
    as_, am, an, ax, ao, az = accf[0], accf[1], accf[2], accf[3], accf[4], accf[5]
    for jj in range(acc.size):
        if signed:
            s = (a * brow[jj] + mz) + acc[jj]
            acc[jj] = _signed(round_nearest_fast(s, as_, am, an, ax, ao, True, False), s, az, True)
        else:
            acc[jj] = round_nearest_fast(a * brow[jj] + acc[jj], as_, am, an, ax, ao, acc_sub, False)


@njit(inline="always")
def _round_acc(x, accf, sub, checks, signed=True):
    """The accumulator's rounding of a chunk or lane sum x, with quantize's zero where a sum may round to zero
    (sub) and signed."""
    y = round_nearest_fast(x, accf[0], accf[1], accf[2], accf[3], accf[4], sub, checks)
    return _signed(y, x, accf[5], True) if sub and signed else y


class Zeros(enum.IntEnum):
    """How ``gemm_fast`` gives zero results quantize's sign where sums may round to zero (acc_sub)."""

    # Unsigned and signed roundings give the same bits until a nonzero sum rounds to zero (the accumulators start
    # at +0, and -0 + +0 = +0): never where every product is zero (a zero row of A or column of B).
    SIGNED = 0  # every rounding signs its zero (``_signed``)
    NONE = 1  # nothing to do: the accumulator has no -0, and without signing no accumulator ever holds -0
    RERUN = 2  # unsigned roundings; in a tile row with zero results, those columns are computed again, signed
    # (gathered); once a tile has redone two rows or half a row's columns, its other rows run signed


@njit(inline="always")
def _row(inner, outer, arow, B, bbi, j0, nj, K, span, lanes, chunk, mulf, accf, mul_sub, acc_sub, checks,
         mul_exact, sg):
    """One row of a tile: the K loop, the chunk closes and the pairwise lane reduction, into src[0, :nj]
    (src: inner, or outer with chunks, returned); sg: zeros signed (``_mac_row``)."""
    inner[:, :] = 0.0
    outer[:, :] = 0.0
    for kk in range(0, K, span):
        for k in range(kk, min(K, kk + span)):
            a = arow[k]
            brow = B[bbi, k, j0:j0 + nj]
            acc = inner[k % lanes, :nj]
            # constant flags per loop, so that each loop compiles branch-free and vectorises
            if checks:
                _mac_row(acc, brow, a, mulf, accf, True, True, True, True)
            elif mul_exact and acc_sub and sg:
                _add_row(acc, brow, a, accf, mulf[5], True, True)
            elif mul_exact and acc_sub:
                _add_row(acc, brow, a, accf, mulf[5], True, False)
            elif mul_exact:
                _add_row(acc, brow, a, accf, mulf[5], False, False)
            elif mul_sub and acc_sub and sg:
                _mac_row(acc, brow, a, mulf, accf, True, True, False, True)
            elif mul_sub and acc_sub:
                _mac_row(acc, brow, a, mulf, accf, True, True, False, False)
            elif mul_sub:
                _mac_row(acc, brow, a, mulf, accf, True, False, False, False)
            elif acc_sub and sg:
                _mac_row(acc, brow, a, mulf, accf, False, True, False, True)
            elif acc_sub:
                _mac_row(acc, brow, a, mulf, accf, False, True, False, False)
            else:
                _mac_row(acc, brow, a, mulf, accf, False, False, False, False)
        if chunk > 0:
            for lane in range(lanes):
                for jj in range(nj):
                    outer[lane, jj] = _round_acc(outer[lane, jj] + inner[lane, jj], accf, acc_sub, checks, sg)
                    inner[lane, jj] = 0.0
    src = outer if chunk > 0 else inner
    for jj in range(nj):
        n = lanes
        while n > 1:  # pairwise, as reduce_lanes
            h = n // 2
            for q in range(h):
                src[q, jj] = _round_acc(src[2 * q, jj] + src[2 * q + 1, jj], accf, acc_sub, checks, sg)
            if n % 2 == 1:
                src[h, jj] = src[n - 1, jj]
                n = h + 1
            else:
                n = h
    return src


@njit(cache=True, parallel=True)
def gemm_fast(A, B, bias, has_bias, out, mulf, accf, acc64, lanes, chunk, mul_sub, acc_sub, checks, mul_exact,
              zeros):
    """Round-to-nearest FloatFormat units (``fast_plan``). A, B, mulf, accf share the work dtype (float32 or
    float64); acc64: the accumulator's float64 parameters, for the bias addition. mul_exact (only with
    neither mul_sub nor checks): the products need no rounding (``fast_plan``). zeros: a ``Zeros`` value
    (any gives the same bits; checks always signs)."""
    nb, M, N = out.shape
    K = A.shape[2]
    bA, bB = A.shape[0], B.shape[0]
    ti, tj = (M + TM - 1) // TM, (N + TN - 1) // TN
    span = chunk * lanes if chunk > 0 else max(K, 1)
    sg = acc_sub and (checks or zeros == 0)
    rerun = acc_sub and not sg and zeros == 2
    for t in prange(nb * ti * tj):
        b = t // (ti * tj)
        r = t % (ti * tj)
        i0, j0 = (r // tj) * TM, (r % tj) * TN
        i1, nj = min(i0 + TM, M), min(j0 + TN, N) - j0
        ab, bbi = b % bA, b % bB
        inner = np.zeros((lanes, TN), A.dtype)
        outer = np.zeros((lanes, TN), A.dtype)
        inner2 = np.zeros((lanes, TN), A.dtype)
        outer2 = np.zeros((lanes, TN), A.dtype)
        idx = np.empty(TN, np.int64)  # the columns to redo
        colnz = np.full(TN, -1, np.int8)  # whether B's column has a nonzero value (-1: not looked at yet)
        prev = np.empty(TN, np.int64)  # the columns gathered in bg
        bg = np.empty((1, K, TN if rerun else 0), A.dtype)
        npv = 0
        sgt = sg
        redone = rows = 0
        for i in range(i0, i1):
            arow = A[ab, i]
            src = _row(inner, outer, arow, B, bbi, j0, nj, K, span, lanes, chunk, mulf, accf, mul_sub, acc_sub,
                       checks, mul_exact, sgt)
            if rerun and not sgt:
                nz = 0
                for jj in range(nj):
                    if src[0, jj] == 0.0:
                        idx[nz] = jj
                        nz += 1
                if nz > 0:  # a zero column of B (or row of A) has no nonzero sum to flush: its zero is right
                    live = False
                    for k in range(K):
                        live |= arow[k] != 0.0
                    m = 0
                    for q in range(nz if live else 0):
                        if colnz[idx[q]] < 0:  # once per tile
                            col = False
                            for k in range(K):
                                col |= B[bbi, k, j0 + idx[q]] != 0.0
                            colnz[idx[q]] = col
                        if colnz[idx[q]] == 1:
                            idx[m] = idx[q]
                            m += 1
                    nz = m
                if nz > 0:  # only a zero may have the wrong sign (``_mac_row``): those columns again, signed
                    if idx[nz - 1] - idx[0] + 1 == nz:  # one run of columns: in place
                        src2 = _row(inner2, outer2, arow, B, bbi, j0 + idx[0], nz, K, span, lanes, chunk, mulf, accf,
                                    mul_sub, acc_sub, checks, mul_exact, True)
                    else:  # gathered (the same columns as the last row's, often: zero columns of B)
                        same = nz == npv
                        for q in range(nz):
                            same &= idx[q] == prev[q]
                        if not same:
                            for k in range(K):
                                for q in range(nz):
                                    bg[0, k, q] = B[bbi, k, j0 + idx[q]]
                            prev[:nz] = idx[:nz]
                            npv = nz
                        src2 = _row(inner2, outer2, arow, bg, 0, 0, nz, K, span, lanes, chunk, mulf, accf, mul_sub,
                                    acc_sub, checks, mul_exact, True)
                    for q in range(nz):
                        src[0, idx[q]] = src2[0, q]
                    redone += nz
                    rows += 1
                    # zeros are common here (a rerun costs about a quarter of a row, plus nz / nj of one; signing
                    # a fifth): the tile's other rows signed at once
                    sgt = rows >= 2 or 2 * redone >= nj
            for jj in range(nj):
                y = np.float64(src[0, jj])
                if has_bias:
                    s, e = two_sum(y, bias[b, i, j0 + jj])
                    y = _round_acc(round_odd(s, e), acc64, True, True)
                out[b, i, j0 + jj] = canonical_nan(y)
