"""The general MAD GEMM (any rounding mode, stochastic rounding, fused, chunk, lanes, fixed-point accumulator)
with ``gemm_fast``'s structure: output tiles, the K loop outside a contiguous run of output columns whose
accumulators advance together, and inner loops compiled per constant flag combination, branch-free, so that
LLVM vectorises them across columns (int64/float64 lanes; AVX-512 where the CPU has it).

Why the bits equal ``gemm_cpu.gemm_general``'s (the reference; tests compare every variant bit for bit):
- The same operations in the same order per output element: product a*b (exact in binary64), the product's
  rounding (not fused), the sum with the accumulator as TwoSum collapsed to the binary64 round-to-odd, and its
  rounding; chunk closes, the pairwise lane reduction and the bias as in ``gemm_general`` (the last two use the
  scalar cores themselves, they are O(M N) work).
- ``_sum_odd`` is ``gemm_scalar.two_sum`` + ``round_odd`` written with selects: the same float64 operations,
  and the same integer step on the bits of s (+1 / -1 toward e's side when s's last bit is 0, e != 0 and s
  finite).
- ``_round_float`` is ``round_float_bits(bits, 63, 52, 1023, ...)`` for binary64 inputs in float arithmetic:
  the target's quantum q at |x| from x's exponent field, t = x / q (an exact power-of-two scaling: nonzero x
  lie on the 2**-298 grid and ``vec_applies`` bounds the quanta, so t stays normal), the mode rounds t to an
  integer r (floor / ceil / floor(|t| + 1/2) / the 2**52 magic constant for ties-to-even; odd and stochastic
  from floor(t) and the exact remainder; stochastic is ``stochastic_decision``: the remainder times 2**nbits
  rounded to an integer, ties to even, plus rnd reaches 2**nbits), and r*q is the result, exact. With
  man >= 1 the code's last bit is r's, so ties and odd see the code's parity; a carry to the next binade and
  a magnitude below one quantum (0 or q) come out as in the bit core. Overflow, NaN, infinities and signed
  zeros follow ``round_float_bits`` (CHK, dropped where ``needs_checks`` proves they cannot occur).
  Round-to-nearest-even uses ``round_nearest_fast`` (Veltkamp), tested equal to the bit core.
- ``_round_fixed`` is ``scalar.round_fixed_value`` with the mode chain replaced by one formula with loop-invariant
  weights (``_mode_weights``; np.floor for ``_floor``: they differ only in the sign of a zero, which never reaches a result there).
- Stochastic bits: ``random_bits(key, o*K + k, nbits)``, the generator itself; per row the counter is
  base + j*K, which LLVM turns into an induction variable (no 64-bit multiply per element besides the
  generator's own two; computing its input incrementally by hand measured no faster).
Results do not depend on tiling or thread count (each output element's operations are fixed).
"""
import functools
import math

import numpy as np
from numba import njit, prange

from . import _cache, gemm_scalar, scalar

_cache.guard(__file__, [*scalar.SOURCES, gemm_scalar.__file__])

from .gemm_scalar import (  # noqa: E402
    P_CMAX, P_CMIN, P_EMIN, P_FRAC, P_KIND, P_MAN, P_MAXBITS, P_MODE, P_NEGZERO, P_OVF, P_SAT, P_SUB, S_ACC,
    S_BIAS, S_CHUNK, S_MUL, S_REDUCE, add_round, reduce_lanes,
)
from .scalar import (  # noqa: E402
    DOWN, NEAREST, NEAREST_AWAY, ODD, OVF_SAT, STOCHASTIC, TOWARD_ZERO, UP, random_bits, round_nearest_fast,
)

TM, TN = 8, 64  # output tile: rows x columns


@njit(inline="always")
def _sum_odd(x, y):
    """round_odd(two_sum(x, y)): the binary64 round-to-odd of the exact x + y, branch-free."""
    s = x + y
    bb = s - x
    e = (x - (s - bb)) + (y - bb)
    u = np.float64(s).view(np.int64)
    fix = (e != 0.0) & (np.abs(s) < np.inf) & ((u & 1) == 0)
    step = np.int64(1) if (e > 0.0) == (s > 0.0) else np.int64(-1)
    return np.int64(u + (step if fix else np.int64(0))).view(np.float64)


@njit(inline="always")
def _up(rem, odd, neg, w):
    """Whether a magnitude k + rem (k integer, rem in [0, 1), odd: k is odd) rounds to k + 1 in a deterministic
    mode with weights ``w`` (``_mode_weights``): ``round_up_decision`` as one formula."""
    wh, waway, wpos, wneg, weven = w[0], w[1], w[2], w[3], w[4]
    zero_ok = ((wpos != 0) & ~neg) | ((wneg != 0) & neg) | ((weven != 0) & ~odd)
    thr = 0.5 if wh != 0 else (0.0 if zero_ok else 1.0)
    tie = (wh != 0) & ((waway != 0) | odd)
    return (rem > thr) | ((rem == thr) & tie)


@njit(inline="always")
def _up_stochastic(rem, rnd, two_n):
    """``stochastic_decision``: rem * 2**nbits rounded to an integer, ties to even (the magic constant 2**52;
    exact: 0 <= rem * 2**nbits <= 2**32), plus rnd reaches 2**nbits."""
    d = rem * two_n
    drnd = (d + 4503599627370496.0) - 4503599627370496.0
    return drnd + float(rnd) >= two_n


@njit(inline="always")
def _round_float(x, rnd, c, f, MODE, CHK):
    """``round_float_bits`` of a binary64 value to the FloatFormat of ``c``/``f`` (``consts``), as float64.

    Float arithmetic: q = 2**(qe) the target's quantum at |x| (from x's exponent field: max(E, emin) - man, or
    emin without subnormals), t = |x| / q (exact: a power-of-two scaling that stays normal, see
    ``vec_applies``), and the mode (a compile-time constant) rounds t to an integer r with one operation where
    it can (floor for toward-zero, floor(|t| + 1/2) for nearest-away, ceil/floor of the signed t for up/down; odd
    and stochastic from k = floor(t) and rem = t - k, exact); r is the code (man >= 1: its last bit is r's), and
    r*q the result (a carry to 2**(man+1) is the next binade's first value, and |x| below
    one quantum gives 0 or q, as in ``round_float_bits``). A zero keeps x's sign where the format has -0: adding
    zadd = -0.0 changes nothing, +0.0 turns -0 into +0. CHK: overflow and non-finite x by the same rules
    (dropped where ``plan`` proves that no sum or product can reach them)."""
    man, emin_b, sub, ovf, to_all, to_neg, to_pos = c[0], c[1], c[2], c[3], c[5], c[6], c[7]
    max_value, zadd, two_n = f[0], f[5], f[6]
    ax = np.abs(x)
    ex = np.float64(ax).view(np.int64) >> 52
    eq = max(ex, emin_b) - man if sub != 0 else (ex - man if ex >= emin_b else emin_b)
    q = np.int64(eq << 52).view(np.float64)
    iq = np.int64((2046 - eq) << 52).view(np.float64)
    neg = x < 0.0
    if MODE == STOCHASTIC:
        t = ax * iq
        k = np.floor(t)
        r = k + (1.0 if _up_stochastic(t - k, rnd, two_n) else 0.0)
    elif MODE == ODD:
        t = ax * iq
        k = np.floor(t)
        r = k + (1.0 if (t != k) & ((np.int64(k) & 1) == 0) else 0.0)
    elif MODE == NEAREST_AWAY:
        r = np.floor(ax * iq + 0.5)  # |t| + 0.5 rounds only past the next integer's binade: same floor
    elif MODE == TOWARD_ZERO:
        r = np.floor(ax * iq)
    elif MODE == UP:
        r = np.abs(np.ceil(x * iq))  # signed scaling: the ceiling of a negative t is its truncation
    elif MODE == DOWN:
        r = np.abs(np.floor(x * iq))
    else:  # nearest-even: 0 <= t < 2**52, the magic constant rounds to an integer, ties to even
        r = (ax * iq + 4503599627370496.0) - 4503599627370496.0
    res = r * q
    if not CHK:
        return math.copysign(res, x) + zadd
    over = res > max_value
    to_max = (to_all != 0) | ((to_neg != 0) & neg) | ((to_pos != 0) & ~neg)
    big = max_value if to_max | (ovf == OVF_SAT) else (np.inf if ovf == 0 else np.nan)
    out = math.copysign(big if over else res, x) + zadd
    out = np.nan if over & ~to_max & (ovf == 1) else out
    inf_out = math.copysign(max_value, x) if ovf == OVF_SAT else (x if ovf == 0 else np.nan)
    return (inf_out if ax == np.inf else x + 0.0) if ex == 2047 else out


@njit(inline="always")
def _round_nearest(x, f, CHK):
    """Round-to-nearest-even products: ``scalar.round_nearest_fast`` (Veltkamp; tested equal to
    ``round_float_bits`` for man >= 1) with ``round_nearest_value``'s conventions (NaN, the sign of zero)."""
    y = round_nearest_fast(x, f[1], f[2], f[3], f[0], f[4], True, CHK)
    if CHK:
        y = np.abs(y) if (y != y) & (x == x) else y
        y = x + 0.0 if x != x else y
    return math.copysign(0.0, x) + f[5] if y == 0.0 else y


@njit(inline="always")
def _is_odd(k):
    return k - 2.0 * np.floor(k * 0.5) == 1.0


@njit(inline="always")
def _round_fixed(x, rnd, c, f, w, STO):
    """``round_fixed_value`` with the mode weights (module docstring). c: (saturate,); f: (lo, hi, span,
    period, scale, inv_scale, 2**nbits) as float64."""
    saturate = c[0]
    lo, hi, span, period, scale, inv, two_n = f[0], f[1], f[2], f[3], f[4], f[5], f[6]
    t = x / period
    t = np.floor(t) if t >= 0.0 else -np.floor(-t)
    xw = x - t * period if np.abs(x) < np.inf else x
    x = x if saturate != 0 else xw
    y = x * scale
    neg = x < 0.0
    a = np.abs(y)
    k = np.floor(a)
    r = a - k
    r = 5e-324 if (a == 0.0) & (x != 0.0) else r
    odd = _is_odd(k)
    up = _up_stochastic(r, rnd, two_n) if STO else _up(r, odd, neg, w)
    k = k + (1.0 if up else 0.0)
    v = (0.0 - k if neg else k) + 0.0
    vs = min(max(v, lo), hi)
    ww = v - np.floor(v / span) * span
    vw = ww - span if ww > hi else ww
    v = vs if saturate != 0 else vw
    v = (hi if y > 0.0 else lo) if a == np.inf else v
    v = x if x != x else v
    return v * inv


@njit(inline="always")
def _round(x, rnd, ci, cf, w, MODE, FIX, CHK):
    """Round x to the format of (ci, cf, w) in MODE (a constant; for fixed point only STOCHASTIC matters)."""
    if FIX:
        return _round_fixed(x, rnd, ci, cf, w, MODE == STOCHASTIC)
    if MODE == NEAREST:
        return _round_nearest(x, cf, CHK)
    return _round_float(x, rnd, ci, cf, MODE, CHK)


@njit(inline="always")
def _mac_row(acc, brow, a, mi, mf, mw, ai, af, aw, kmul, kacc, base, stride, nbits, FUSED, MMODE, AMODE, AFIX, CHK):
    """acc[j] <- round_acc(round_mul(a * brow[j]) + acc[j]) (or the fused step), counter base + j*stride."""
    for jj in range(acc.size):
        idx = base + jj * stride
        p = a * brow[jj]
        if not FUSED:
            rm = random_bits(kmul, idx, nbits) if MMODE == STOCHASTIC else np.uint64(0)
            p = _round(p, rm, mi, mf, mw, MMODE, False, CHK)
        ra = random_bits(kacc, idx, nbits) if AMODE == STOCHASTIC else np.uint64(0)
        acc[jj] = _round(_sum_odd(p, acc[jj]), ra, ai, af, aw, AMODE, AFIX, CHK)


@njit(inline="always")
def _add_row(dst, src, ai, af, aw, key, base, stride, nbits, AMODE, AFIX, CHK):
    """dst[j] <- round_acc(dst[j] + src[j]); src[j] <- 0 (a chunk close), counter base + j*stride."""
    for jj in range(dst.size):
        ra = random_bits(key, base + jj * stride, nbits) if AMODE == STOCHASTIC else np.uint64(0)
        dst[jj] = _round(_sum_odd(dst[jj], src[jj]), ra, ai, af, aw, AMODE, AFIX, CHK)
        src[jj] = 0.0


@functools.lru_cache(maxsize=None)
def kernel(FUSED: bool, MMODE: int, AMODE: int, AFIX: bool, CHK: bool):
    """The kernel for one combination of flags: fused, the product and accumulator rounding modes (MMODE -1 when
    fused; AMODE -1 for a deterministic fixed-point accumulator, whose mode is a runtime weight), fixed
    accumulator (AFIX), overflow/non-finite checks (CHK). They are closure constants, so each inner loop compiles branch-free; numba caches each
    closure on disk under its own key (the closure's values are part of it)."""

    @njit(cache=True, parallel=True)
    def gemm_vec(A, B, bias, has_bias, out, mulp, accp, mi, mf, mw, ai, af, aw, lanes, chunk, keys, nbits):
        """A (bA, M, K), B (bB, K, N) float64 arrays of float32 values; mi/mf/mw, ai/af/aw: ``consts`` of the
        product and accumulator formats; mulp/accp: their parameter tuples (for the scalar cores).
        """
        nb, M, N = out.shape
        K = A.shape[2]
        bA, bB = A.shape[0], B.shape[0]
        ti, tj = (M + TM - 1) // TM, (N + TN - 1) // TN
        span = chunk * lanes if chunk > 0 else max(K, 1)
        k_mul, k_acc, k_chunk, k_red, k_bias = keys[S_MUL], keys[S_ACC], keys[S_CHUNK], keys[S_REDUCE], keys[S_BIAS]
        for t in prange(nb * ti * tj):
            b = t // (ti * tj)
            r = t % (ti * tj)
            i0, j0 = (r // tj) * TM, (r % tj) * TN
            i1, nj = min(i0 + TM, M), min(j0 + TN, N) - j0
            ab, bbi = b % bA, b % bB
            inner = np.zeros((lanes, TN))
            outer = np.zeros((lanes, TN))
            v = np.empty(lanes)
            for i in range(i0, i1):
                inner[:, :] = 0.0
                outer[:, :] = 0.0
                obase = (b * M + i) * N + j0
                arow = A[ab, i]
                for kk in range(0, K, span):
                    for k in range(kk, min(K, kk + span)):
                        _mac_row(inner[k % lanes, :nj], B[bbi, k, j0:j0 + nj], arow[k], mi, mf, mw, ai, af, aw, k_mul,
                                 k_acc, obase * K + k, K, nbits, FUSED, MMODE, AMODE, AFIX, CHK)
                    if chunk > 0:
                        for lane in range(lanes):
                            _add_row(outer[lane, :nj], inner[lane, :nj], ai, af, aw, k_chunk, obase * K + kk + lane, K,
                                     nbits, AMODE, AFIX, CHK)
                src = outer if chunk > 0 else inner
                for jj in range(nj):
                    for lane in range(lanes):
                        v[lane] = src[lane, jj]
                    y = reduce_lanes(v, lanes, accp, k_red, obase + jj, nbits)
                    if has_bias:
                        y = add_round(y, bias[b, i, j0 + jj], accp, k_bias, obase + jj, nbits)
                    out[b, i, j0 + jj] = y

    return gemm_vec


def _mode_weights(mode: int) -> tuple:
    """(nearest, away, rounds positive away, rounds negative away, rounds an even lower neighbour away)."""
    return tuple(np.int64(v) for v in (mode in (NEAREST, NEAREST_AWAY), mode == NEAREST_AWAY, mode == UP,
                                        mode == DOWN, mode == ODD))


def consts(p) -> tuple:
    """(int constants, float constants, mode weights) of a format parameter vector, for the inner loops."""
    p = [int(v) for v in p]
    mode = p[P_MODE]
    w = _mode_weights(mode)
    if p[P_KIND] == 0:
        ovf = p[P_OVF]
        ci = (p[P_MAN], p[P_EMIN] + 1023, p[P_SUB], ovf, p[P_NEGZERO], mode in (TOWARD_ZERO, ODD), mode == UP,
              mode == DOWN, 0)
        man, emin, sub = p[P_MAN], p[P_EMIN], p[P_SUB]
        max_value = float(np.array(p[P_MAXBITS], dtype=np.int64).view(np.float64))
        q = emin - man if sub else emin  # round_nearest_fast's (split, magic, min_normal, overflow value)
        cf = (max_value, 2.0 ** (52 - man) + 1.0, 1.5 * 2.0 ** (52 + q), 2.0**emin, (np.inf, np.nan, max_value)[ovf],
              -0.0 if p[P_NEGZERO] else 0.0, 0.0)
    else:
        frac, lo, hi = p[P_FRAC], float(p[P_CMIN]), float(p[P_CMAX])
        span = hi - lo + 1.0
        ci = (p[P_SAT],) + (0,) * 8
        cf = (lo, hi, span, float(np.ldexp(span, -frac)), float(np.ldexp(1.0, frac)), float(np.ldexp(1.0, -frac)),
              0.0)
    return tuple(np.int64(v) for v in ci), tuple(np.float64(v) for v in cf), w


def vec_applies(fused: int, mulp, accp) -> bool:
    """Whether ``gemm_vec`` runs this unit's datapath exactly (module docstring): float products (or fused), a
    float or fixed accumulator; float formats with 1 <= man <= 51 (man = 0: the code's parity is the
    exponent's), smallest quantum >= 2**-1022 and max < 2**700. Then every scaling t = |x| / q is exact: a
    nonzero x is on the 2**-298 grid (products of float32 values and their sums), so 2**-1022 <= t < 2**53."""
    def float_ok(p):
        man, emin = int(p[P_MAN]), int(p[P_EMIN])
        q = emin - man if p[P_SUB] else emin
        max_value = float(np.array(p[P_MAXBITS], dtype=np.int64).view(np.float64))
        return 1 <= man <= 51 and q >= -1022 and max_value < 2.0**700
    mul_ok = bool(fused) or (mulp[P_KIND] == 0 and float_ok(mulp))
    acc_ok = accp[P_KIND] == 1 or (accp[P_KIND] == 0 and float_ok(accp))
    return bool(mul_ok and acc_ok)


def needs_checks(A, B, fused, mulp, accp) -> bool:
    """False where no product or partial sum can overflow or be non-finite, so that ``_round_float`` may drop that
    work (CHK): the operands are finite, |round_mul(a*b)| <= P = top (1 + 2**-mm) + qm (top = max|a| max|b|;
    rounding a magnitude away from zero adds at most one quantum: 2**-man of it in the normal range, the smallest
    quantum qm below) stays below the product format's max, and every partial sum stays below the accumulator's:
    K terms, and on any path at most R = 2K + 8 roundings, each growing a magnitude by a factor 1 + 2**-am plus
    qa, bound all sums by (K P + R qa) (1 + 2**-am)**R."""
    a = np.abs(np.asarray(A, dtype=np.float64))
    b = np.abs(np.asarray(B, dtype=np.float64))
    amax = float(a.max()) if a.size else 0.0
    bmax = float(b.max()) if b.size else 0.0
    if not (np.isfinite(amax) and np.isfinite(bmax)):
        return True
    K = A.shape[2]
    top = amax * bmax
    mi, mf, _ = consts(mulp)
    ai, af, _ = consts(accp)
    if fused:
        prod = top
    else:
        mm, qm = int(mi[0]), 2.0 ** (int(mi[1]) - 1023 - (int(mi[0]) if mi[2] else 0))
        prod = top * (1.0 + 2.0**-mm) + qm
        if not prod < mf[0]:
            return True
    if accp[P_KIND] == 1:
        return False  # fixed point: saturation and wrap are part of its rounding
    am, qa = int(ai[0]), 2.0 ** (int(ai[1]) - 1023 - (int(ai[0]) if ai[2] else 0))
    R = 2 * K + 8
    log_bound = np.log2(K * prod + R * qa) + R * np.log2(1.0 + 2.0**-am)
    return not log_bound < np.log2(af[0]) - 1e-9


def run(A, B, bias, has_bias, out, fused, mulp, accp, lanes, chunk, keys, nbits, checks=None):
    """``gemm_cpu._gemm``'s call into ``gemm_vec`` (caller holds the parallel lock); checks: None plans
    (``needs_checks``), True forces them on (tests)."""
    mi, mf, mw = consts(mulp)
    ai, af, aw = consts(accp)
    af = af[:6] + (np.float64(2.0**nbits),)
    mf = mf[:6] + (np.float64(2.0**nbits),)
    chk = needs_checks(A, B, fused, mulp, accp) if checks is None else bool(checks)
    afix = bool(accp[P_KIND] == 1)
    amode = int(accp[P_MODE])
    k = kernel(bool(fused), -1 if fused else int(mulp[P_MODE]),
               amode if not afix or amode == STOCHASTIC else -1, afix, chk)
    k(np.ascontiguousarray(A, dtype=np.float64), np.ascontiguousarray(B, dtype=np.float64), bias, has_bias, out,
      tuple(int(v) for v in mulp), tuple(int(v) for v in accp), mi, mf, mw, ai, af, aw, lanes, chunk,
      tuple(np.uint64(k) for k in keys), nbits)
