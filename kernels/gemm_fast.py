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
Zeros: where a sum may round to zero (``acc_sub``), the roundings give quantize's sign of zero (``_signed``:
-0 for a negative value where the format has -0, +0 where it has none), products included, as they may meet
an accumulator that holds -0; elsewhere no sum rounds to zero, accumulators never hold -0 and IEEE
addition's zeros are already those of ``gemm_general``.
The inner loop is compiled once per combination of its flags (``_mac_row``), branch-free. Where the products
are exact and no sum rounds to zero (``mul_exact``, not ``acc_sub``: the fp8 recipe's unit), ``_exact_span``
takes each lane's terms four at a time on two rows at a time, each sum a * b + acc as one fused multiply-add
(the same value: the product is exact): a quarter of the accumulator loads and stores, half of B's loads, one
operation fewer per term.
``tests/kernels/test_gemm_cpu.py`` checks every variant against ``gemm_general`` bit for bit.
"""
import math

import numpy as np
from numba import njit, prange

from . import _cache, gemm_scalar, scalar

_cache.guard(__file__, [*scalar.SOURCES, gemm_scalar.__file__])

from .gemm_scalar import bits_f64, canonical_nan, f64_bits, tile_of, two_sum  # noqa: E402
from .scalar import round_nearest_fast  # noqa: E402
from .fma import compiles_with_fma, fma  # noqa: E402
from .llvm_inline import inline_in_llvm  # noqa: E402
from .wide import prefer_wide_vectors  # noqa: E402

TM, TN = 8, 256  # output tile: rows x columns (``gemm_cpu`` lays GEMMs out for it)
FMA = compiles_with_fma()  # frozen into the kernels when they compile (numba's cache is per target CPU)


@njit(inline="always")
def _signed(y, x, zero, sub):
    """quantize's zero for y, the fast rounding of x: x's sign where the format has -0 (zero = -0.0; adding it
    changes nothing else), +0 where it has none (zero = +0.0 turns -0 into +0). sub: y may come from the
    subnormal branch, whose (x + magic) - magic drops x's sign (copysign restores it: every other y already
    has x's sign, NaN and overflow values included)."""
    return (math.copysign(y, x) if sub else y) + zero


@njit
def _mac_row(acc, brow, a, mulf, accf, mul_sub, acc_sub, checks):
    """acc[j] <- round_acc(round_mul(a * brow[j]) + acc[j]) for every j (round-to-nearest, fast rounding).
    Zero results take quantize's sign only with acc_sub: otherwise no sum rounds to zero, so the accumulators
    never hold -0 and a sum's sign of zero cannot depend on the product's (+0 + -0 = +0)."""
    inline_in_llvm()
    prefer_wide_vectors()  # here, not only in the caller: this loop is vectorised before LLVM inlines it
    ms, mm, mn, mx, mo, mz = mulf[0], mulf[1], mulf[2], mulf[3], mulf[4], mulf[5]
    as_, am, an, ax, ao, az = accf[0], accf[1], accf[2], accf[3], accf[4], accf[5]
    for jj in range(acc.size):
        x = a * brow[jj]
        p = round_nearest_fast(x, ms, mm, mn, mx, mo, mul_sub, checks)
        if acc_sub:
            p = _signed(p, x, mz, mul_sub)
        s = p + acc[jj]
        y = round_nearest_fast(s, as_, am, an, ax, ao, acc_sub, checks)
        acc[jj] = _signed(y, s, az, True) if acc_sub else y


@njit
def _add_row(acc, brow, a, accf, mz, acc_sub):
    """acc[j] <- round_acc(a * brow[j] + acc[j]) for every j: ``_mac_row`` where every product a * brow[j] is
    exact in the work dtype and a value of the product format, so that its rounding returns it (up to the sign
    of a zero: mz, the product format's zero, as in ``_signed``)."""
    inline_in_llvm()
    prefer_wide_vectors()
    as_, am, an, ax, ao, az = accf[0], accf[1], accf[2], accf[3], accf[4], accf[5]
    for jj in range(acc.size):
        if acc_sub:
            s = (a * brow[jj] + mz) + acc[jj]
            acc[jj] = _signed(round_nearest_fast(s, as_, am, an, ax, ao, True, False), s, az, True)
        else:
            acc[jj] = round_nearest_fast(a * brow[jj] + acc[jj], as_, am, an, ax, ao, False, False)


@njit(inline="always")
def _exact_mac(a, b, s, as_, am, an, ax, ao):
    """round_acc(a * b + s) for an exact product a * b and no sum that rounds to zero (``_add_row`` without
    acc_sub): one fused multiply-add where the CPU has it, the same value (kernels/fma.py)."""
    x = fma(a, b, s) if FMA else a * b + s
    return round_nearest_fast(x, as_, am, an, ax, ao, False, False)


@njit
def _add_rows_2x4(acc0, acc1, b0, b1, b2, b3, a00, a01, a02, a03, a10, a11, a12, a13, accf):
    """Four ``_add_row`` calls (acc_sub False) on each of two accumulator rows: acc0[j] takes a00 * b0[j], then
    a01 * b1[j], a02 * b2[j], a03 * b3[j], each rounded, in that order, and acc1[j] likewise with a10..a13. One
    pass loads each element of B's four rows once for both rows and each accumulator once for its four terms
    (1.3-2.4x the MACs per second of four single-term passes, with ``_exact_mac``'s FMA: benchmarks/RESULTS.md
    "Stop 56")."""
    inline_in_llvm()
    prefer_wide_vectors()
    as_, am, an, ax, ao = accf[0], accf[1], accf[2], accf[3], accf[4]
    for jj in range(acc0.size):
        x0, x1, x2, x3 = b0[jj], b1[jj], b2[jj], b3[jj]
        s = _exact_mac(a00, x0, acc0[jj], as_, am, an, ax, ao)
        s = _exact_mac(a01, x1, s, as_, am, an, ax, ao)
        s = _exact_mac(a02, x2, s, as_, am, an, ax, ao)
        acc0[jj] = _exact_mac(a03, x3, s, as_, am, an, ax, ao)
        s = _exact_mac(a10, x0, acc1[jj], as_, am, an, ax, ao)
        s = _exact_mac(a11, x1, s, as_, am, an, ax, ao)
        s = _exact_mac(a12, x2, s, as_, am, an, ax, ao)
        acc1[jj] = _exact_mac(a13, x3, s, as_, am, an, ax, ao)


@njit(inline="always")
def _exact_span(A, B, ka, kb, inner, spare, ab, bbi, i0, rows, j0, nj, kk, kend, lanes, accf):
    """The terms k in [kk, kend) of a tile's rows into their lanes' accumulators, for exact products without
    subnormal sums (``mul_exact`` and not acc_sub): per lane, four terms at a time on two rows at a time
    (``_add_rows_2x4``; an odd last row pairs with ``spare``, a scratch row with zero multipliers), the lane's
    last terms one at a time (``_add_row``). Each accumulator takes its terms in increasing k, as ``gemm_fast``'s
    general loop gives them. Term k reads A[ab, i0 + r, k - ka] and B[bbi, k - kb] (ka = kb = 0: the operands
    themselves; ka = kb = kk: panels holding the span's terms)."""
    z = A.dtype.type(0.0)
    for ln in range(lanes):
        k = kk + ln
        while k + 3 * lanes < kend:
            k1, k2, k3 = k + lanes, k + 2 * lanes, k + 3 * lanes
            b0, b1 = B[bbi, k - kb, j0:j0 + nj], B[bbi, k1 - kb, j0:j0 + nj]
            b2, b3 = B[bbi, k2 - kb, j0:j0 + nj], B[bbi, k3 - kb, j0:j0 + nj]
            q0, q1, q2, q3 = k - ka, k1 - ka, k2 - ka, k3 - ka
            for r in range(0, rows, 2):
                r0, r1 = i0 + r, i0 + r + 1
                acc0 = inner[r, ln, :nj]
                if r + 1 < rows:
                    acc1 = inner[r + 1, ln, :nj]
                    _add_rows_2x4(acc0, acc1, b0, b1, b2, b3, A[ab, r0, q0], A[ab, r0, q1], A[ab, r0, q2],
                                  A[ab, r0, q3], A[ab, r1, q0], A[ab, r1, q1], A[ab, r1, q2], A[ab, r1, q3], accf)
                else:
                    _add_rows_2x4(acc0, spare[:nj], b0, b1, b2, b3, A[ab, r0, q0], A[ab, r0, q1], A[ab, r0, q2],
                                  A[ab, r0, q3], z, z, z, z, accf)
            k += 4 * lanes
        while k < kend:
            brow = B[bbi, k - kb, j0:j0 + nj]
            for r in range(rows):
                _add_row(inner[r, ln, :nj], brow, A[ab, i0 + r, k - ka], accf, z, False)  # z: not read
            k += lanes


@njit
def _round_acc(x, accf, sub, checks):
    """The accumulator's rounding of a chunk or lane sum x, with quantize's zero where a sum may round to zero."""
    inline_in_llvm()
    y = round_nearest_fast(x, accf[0], accf[1], accf[2], accf[3], accf[4], sub, checks)
    return _signed(y, x, accf[5], True) if sub else y


@njit(inline="always")
def _add_bias(y, bias, acc64):
    """round_acc(y + bias) in binary64: TwoSum, then ``gemm_scalar.round_odd`` as selects (s + e exact: s; s not
    finite: s; else the one of s and its neighbour on e's side whose last bit is 1), then the accumulator's
    rounding. s == 0 gives e == 0, so the neighbour's direction (away from zero when e and s share a sign)
    never meets a zero s."""
    s, e = two_sum(y, bias)
    u = f64_bits(s)
    odd = (e == 0.0) | (abs(s) == math.inf) | (s != s) | ((u & np.uint64(1)) == np.uint64(1))
    step = np.uint64(1) if (e > 0.0) == (s > 0.0) else np.uint64(0xFFFFFFFFFFFFFFFF)
    return _round_acc(s if odd else bits_f64(u + step), acc64, True, True)


@njit(cache=True, parallel=True)
def gemm_fast(A, B, bias, has_bias, out, mulf, accf, acc64, lanes, chunk, mul_sub, acc_sub, checks, mul_exact, tm):
    """Round-to-nearest FloatFormat units (``fast_plan``). A, B, mulf, accf share the work dtype (float32 or
    float64); acc64: the accumulator's float64 parameters, for the bias addition. mul_exact (only with
    neither mul_sub nor checks): the products need no rounding (``fast_plan``). tm: output rows per tile (a
    multiple of TM; more rows read B's panel fewer times, fewer tiles share fewer threads; any tm gives the same
    bits, each output element being computed alone)."""
    nb, M, N = out.shape
    K = A.shape[2]
    bA, bB = A.shape[0], B.shape[0]
    ti, tj = (M + tm - 1) // tm, (N + TN - 1) // TN
    span = chunk * lanes if chunk > 0 else max(K, 1)
    for t in prange(nb * ti * tj):
        prefer_wide_vectors()
        b, i0, i1, j0, nj, ab, bbi = tile_of(t, M, N, bA, bB, tm, TN)
        rows = i1 - i0
        # the tile's rows advance together over k: each row of B is read once per tile, not once per output row
        # (a K x TN panel of B outgrows the caches for long sums); each output element still takes its terms in
        # increasing k, so the bits are those of one row at a time
        inner = np.zeros((rows, lanes, TN), A.dtype)
        outer = np.zeros((rows, lanes, TN), A.dtype)
        spare = np.zeros(TN, A.dtype)
        for kk in range(0, K, span):
            kend = min(K, kk + span)
            if mul_exact and not acc_sub:
                _exact_span(A, B, 0, 0, inner, spare, ab, bbi, i0, rows, j0, nj, kk, kend, lanes, accf)
                kend = kk  # every term taken
            lane = 0  # k % lanes (span is a multiple of lanes), counted: an integer division per k cost more
            for k in range(kk, kend):
                brow = B[bbi, k, j0:j0 + nj]
                for r in range(rows):
                    a = A[ab, i0 + r, k]
                    acc = inner[r, lane, :nj]
                    # constant flags per loop, so that each loop compiles branch-free and vectorises
                    if checks:
                        _mac_row(acc, brow, a, mulf, accf, True, True, True)
                    elif mul_exact and acc_sub:
                        _add_row(acc, brow, a, accf, mulf[5], True)
                    elif mul_exact:
                        _add_row(acc, brow, a, accf, mulf[5], False)
                    elif mul_sub and acc_sub:
                        _mac_row(acc, brow, a, mulf, accf, True, True, False)
                    elif mul_sub:
                        _mac_row(acc, brow, a, mulf, accf, True, False, False)
                    elif acc_sub:
                        _mac_row(acc, brow, a, mulf, accf, False, True, False)
                    else:
                        _mac_row(acc, brow, a, mulf, accf, False, False, False)
                lane = 0 if lane + 1 == lanes else lane + 1
            if chunk > 0:
                close_chunk(inner, outer, rows, lanes, nj, accf, acc_sub, checks)
        finish_tile(outer if chunk > 0 else inner, out, b, i0, rows, j0, nj, lanes, bias, has_bias, accf, acc64,
                    acc_sub, checks)


@njit(inline="always")
def close_chunk(inner, outer, rows, lanes, nj, accf, acc_sub, checks):
    """A chunk's close: each lane's chunk sum into its outer accumulator (one rounding), the chunk sum reset."""
    for r in range(rows):
        for ln in range(lanes):
            for jj in range(nj):
                outer[r, ln, jj] = _round_acc(outer[r, ln, jj] + inner[r, ln, jj], accf, acc_sub, checks)
                inner[r, ln, jj] = 0.0


@njit(inline="always")
def finish_tile(acc, out, b, i0, rows, j0, nj, lanes, bias, has_bias, accf, acc64, acc_sub, checks):
    """A tile's results: each element's lanes summed pairwise (as ``reduce_lanes``), the bias added with one
    rounding where has_bias, written to out[b, i0 + r, j0 + jj] as float64 with the one NaN."""
    for r in range(rows):
        src = acc[r]
        for jj in range(nj):
            n = lanes
            while n > 1:  # pairwise, as reduce_lanes
                h = n // 2
                for q in range(h):
                    src[q, jj] = _round_acc(src[2 * q, jj] + src[2 * q + 1, jj], accf, acc_sub, checks)
                if n % 2 == 1:
                    src[h, jj] = src[n - 1, jj]
                    n = h + 1
                else:
                    n = h
        # the output writes as loops of their own, branch-free, so that they vectorise
        orow = out[b, i0 + r, j0:j0 + nj]
        if has_bias:
            brow = bias[b, i0 + r, j0:j0 + nj]
            for jj in range(nj):
                orow[jj] = canonical_nan(_add_bias(np.float64(src[0, jj]), brow[jj], acc64))
        else:
            for jj in range(nj):
                orow[jj] = canonical_nan(np.float64(src[0, jj]))
