"""The random Hadamard transform of float32 data as a fast Walsh-Hadamard butterfly (``emunum.hadamard.rht``).

``rht_f32(x, out, signs, shift, amaxes, finite)``: x is float32 viewed as (A, L, B) (the transformed dimension in the middle),
out a float32 (A, B, Lp) array, Lp = L rounded up to a multiple of n = signs.size. Each run of n elements along
L (zero-padded) is multiplied by the signs, transformed by the n x n Sylvester Hadamard matrix and scaled by
2**-shift = 1/sqrt(n); the sums are taken in float64 and rounded once to float32.

Why this equals the float64 product u @ M of ``rht``'s reference path, bit for bit: every term s_j H_ji u_j
is a float32 value with its sign flipped (the product's terms u_j M_ji are those times 2**-shift, exact), so
every partial sum either forms (a signed sum of a subset of the run, in any order and grouping) is an integer
multiple of 2**lsb, the value of the lowest set significand bit among the run's nonzero elements, and at most
S = sum_j |u_j| in magnitude. Where S < 2**(lsb + 53) every such sum is an integer below 2**53 times 2**lsb:
exact in float64, so the butterfly and the matrix product (whatever its summation order) reach the same exact
value; the power-of-two scale is exact as well. The kernel checks that condition on every run: 2**lsb is the
minimum over nonzero elements of |u| - |u with its lowest set bit cleared| (|u| itself where the stored
significand is 0: the implicit bit is the lowest), both float32 values of one binade, so the difference is
exact; S is bounded above by its float64 sum times 1 + 2**-40, rounded (n <= 256 nonnegative terms: the sum
is at least S (1 - 255 * 2**-53) > S (1 - 2**-44)). A run holding an infinity or NaN has S = inf or NaN
and fails. A finite run that fails is summed in index order instead (``_index_order``: each output's n terms
from +0, j = 0 .. n-1, the definition ``emunum.hadamard`` gives for every run, which any order meets where the
sums are exact); a run holding an infinity or NaN makes the kernel return False, and the caller computes that
definition with torch ops.
A cheaper test runs first, on the float64 exponents e of the run's nonzero elements (|u| in [2**e, 2**(e+1))):
a spread max e - min e <= 29 - log2 n implies the exact test's condition with room to spare. Every nonzero
float32 u is a multiple of 2**(e_u - 23) (a subnormal one too), so 2**lsb >= 2**(min e - 23), while
S <= n (2**(max e + 1) - 2**(max e - 23)) = n 2**(max e + 1) (1 - 2**-24) <= 2**(lsb + 53) (1 - 2**-24), which the
float64 sum times BOUND stays below. So where the spread test passes the exact test would pass too, and only a
run that fails it (or holds an infinity or NaN: exponent field 2047) takes the exact test: the kernel's verdicts
are the exact test's alone, at a fraction of its cost per element.
A sum that is exactly zero is +0 in both: the product's accumulators start at +0 (a zero sum of terms that
are not all -0 is +0 in any order under round-to-nearest; ``+ 0.0`` makes the all -0 case agree).
Serial: the transform runs inside a training step's backward GEMM, on one thread.
"""
import numpy as np
from numba import njit

from . import _cache

_cache.guard(__file__, [])


U64 = np.uint64
U32 = np.uint32


COLUMNS = 48  # columns of x (rows of out) transformed together; measured best of 8-144 on (65536, 144)
BOUND = 1.0 + 2.0**-40  # S's float64 sum times this bounds S from above (module doc)
TWO53 = 2.0**53
NO_EXP = 4096  # min e of a run without a nonzero element: above every float64 exponent field
RUNS = 16  # runs transformed per sweep over the columns: their rows of x stay in cache (measured best of 4-64)


@njit(inline="always")
def _exact(x, bits, a, r, n, L, b0, nb, total, lsb):
    """The exact test (module doc) on run r of columns b0..b0+nb-1: every column's S below 2**(lsb + 53)."""
    for c in range(nb):
        total[U64(c)] = 0.0
        lsb[U64(c)] = np.inf
    for j in range(n):
        t = r * n + j
        if t < L:
            xr, ur = x[a, t, b0:b0 + nb], bits[a, t, b0:b0 + nb]
            for c in range(nb):
                uc = U64(c)
                mag = abs(np.float64(xr[uc]))
                m = U32(ur[uc] & U32(0x7FFFFFFF))
                low = mag - np.float64(U32(m & (m - U32(1))).view(np.float32))
                low = mag if (m & U32(0x7FFFFF)) == U32(0) else low
                total[uc] += mag
                lsb[uc] = min(lsb[uc], low if m != U32(0) else np.inf)
    for c in range(nb):
        if not total[c] * BOUND < lsb[c] * TWO53:  # NaN and inf fail too
            return False
    return True


@njit(inline="always")
def _butterfly(work, n, nb):
    """work[:, :nb] (n signed terms per column) replaced by its Walsh-Hadamard transform, in place."""
    h = 1
    while h < n:
        for i0 in range(0, n, 2 * h):
            for j in range(i0, i0 + h):
                p, q = work[j], work[j + h]
                for c in range(nb):
                    uc = U64(c)
                    s, d = p[uc] + q[uc], p[uc] - q[uc]
                    p[uc] = s
                    q[uc] = d
        h *= 2


@njit(inline="always")
def _odd(k):
    """Whether k (>= 0) has an odd number of set bits."""
    p = 0
    while k:
        p ^= k & 1
        k >>= 1
    return p == 1


@njit(inline="always")
def _index_order(work, res, n, nb):
    """work[:, :nb] replaced by the sums sum_j H[j, i] work[j, c] taken in index order, j = 0 .. n-1, from +0
    (H[j, i] = -1 where i & j has an odd number of set bits): the definition where a run's sums are inexact."""
    for c in range(nb):
        for i in range(n):
            acc = 0.0
            for j in range(n):
                v = work[j, c]
                acc = acc - v if _odd(i & j) else acc + v
            res[i, c] = acc
    for i in range(n):
        for c in range(nb):
            work[i, c] = res[i, c]


@njit(cache=True)
def rht_f32(x, out, signs, shift, amaxes, finite):
    """out[a, b, r*n + i] = float32(2**-shift * sum_j signs[j] * H[j, i] * x[a, r*n + j, b]) for every run r
    (x read as zero beyond L; the sum in float64, in index order where its sums are inexact: module doc); False
    (out partly written) where a run holds an infinity or NaN.
    Unless amaxes is empty: the largest |out| of each run (out's blocks of n along its last axis) into
    amaxes[(a * B + b) * runs + r] (float64), and the bits of the largest finite |out| into finite[0] (0 if
    none): what ``block_cpu.block_amaxes`` finds in out (no NaN: a run holding one is declined).
    Columns go COLUMNS at a time through RUNS runs, so that out is written as that many sequential streams
    (B rows of out lie a power of two apart in the layers' shapes) while those runs' rows of x, read once from
    memory, stay in cache for every group of columns;
    inner loops use unsigned indices (numba's wraparound check on signed ones keeps them from vectorising)."""
    A, L, B = x.shape
    n = signs.size
    runs = out.shape[2] // n
    scale = np.ldexp(1.0, -shift)
    work = np.empty((n, COLUMNS), dtype=np.float64)
    res = np.empty((n, COLUMNS), dtype=np.float64)  # the index-order sums of a run whose sums are inexact
    bits = x.view(np.uint32)
    emax = np.empty(COLUMNS, dtype=np.uint64)  # largest float64 exponent field per column of this run
    emin = np.empty(COLUMNS, dtype=np.uint64)  # smallest nonzero one (NO_EXP: all zeros)
    spread_max = 29 - 2 * shift  # 29 - log2 n
    total = np.empty(COLUMNS, dtype=np.float64)  # sum of |u| per column of this run (the exact test)
    lsb = np.empty(COLUMNS, dtype=np.float64)  # 2**lsb per column of this run (inf: all zeros)
    scan = amaxes.size != 0
    fin = U32(0)
    for a in range(A):
        for r0 in range(0, runs, RUNS):
            for b0 in range(0, B, COLUMNS):
                nb = min(COLUMNS, B - b0)
                for r in range(r0, min(r0 + RUNS, runs)):
                    for c in range(nb):
                        emax[U64(c)] = U64(0)
                        emin[U64(c)] = U64(NO_EXP)
                    for j in range(n):
                        t = r * n + j
                        w = work[j]
                        if t < L:
                            sj = np.float64(signs[j])
                            xr = x[a, t, b0:b0 + nb]
                            for c in range(nb):
                                uc = U64(c)
                                v = np.float64(xr[uc])
                                e = (v.view(U64) >> U64(52)) & U64(0x7FF)
                                emax[uc] = max(emax[uc], e)
                                emin[uc] = min(emin[uc], e if e != U64(0) else U64(NO_EXP))
                                w[uc] = sj * v
                        else:
                            for c in range(nb):
                                w[U64(c)] = 0.0
                    spread = True
                    for c in range(nb):
                        uc = U64(c)
                        if emax[uc] == U64(2047):  # an infinity or NaN: the caller's path
                            return False
                        spread &= np.int64(emax[uc]) - np.int64(emin[uc]) <= spread_max
                    if not spread and not _exact(x, bits, a, r, n, L, b0, nb, total, lsb):
                        _index_order(work, res, n, nb)
                    else:
                        _butterfly(work, n, nb)
                    base = r * n
                    for c in range(nb):
                        o = out[a, b0 + c]
                        top = U32(0)
                        for i in range(n):
                            f = np.float32((work[i, c] + 0.0) * scale)
                            o[U64(base + i)] = f
                            u = U32(f.view(U32) & U32(0x7FFFFFFF))
                            top = max(top, u)
                            fin = max(fin, u if u < U32(0x7F800000) else U32(0))
                        if scan:
                            amaxes[U64((a * B + b0 + c) * runs + r)] = np.float64(U32(top).view(np.float32))
    finite[0] = fin
    return True
