"""The general MAD GEMM (any rounding mode, stochastic rounding, fused, chunk, lanes, fixed-point accumulator)
with ``gemm_fast``'s structure: output tiles, the K loop outside a contiguous run of output columns whose
accumulators advance together, and inner loops compiled per constant flag combination, branch-free, so that
LLVM vectorises them across columns (int64/float64 lanes; AVX-512 where the CPU has it). The host side (which
units, constants, plan flags) is ``gemm_vec_plan``.

Why the bits equal ``gemm_cpu.gemm_general``'s (the reference; tests compare every variant bit for bit):
- The same operations in the same order per output element: product a*b (exact in binary64), the product's
  rounding (not fused), the sum with the accumulator as TwoSum collapsed to the binary64 round-to-odd, and its
  rounding; chunk closes, the pairwise lane reduction and the bias as in ``gemm_general`` (the last two use the
  scalar cores themselves, they are O(M N) work).
- ``_sum_odd`` is ``gemm_scalar.two_sum`` + ``round_odd`` written with selects: the same float64 operations,
  and the same integer step on the bits of s (+1 / -1 toward e's side when s's last bit is 0, e != 0 and s
  finite). EXACT (``gemm_vec_plan.exact_sums``: every sum provably exact) takes s = x + y alone: e would be 0.
- ``_round_float`` is ``round_float_bits(bits, 63, 52, 1023, ...)`` for binary64 inputs in float arithmetic:
  the target's quantum q at |x| from x's exponent field, t = x / q (an exact power-of-two scaling: nonzero x
  lie on the 2**-298 grid and ``vec_applies`` bounds the quanta, so t stays normal), the mode rounds t to an
  integer r (trunc / ceil / floor of the signed t, trunc(t +- 1/2) for nearest-away, the 2**52 magic constant
  for ties-to-even; odd and stochastic from floor(|t|) and the exact remainder; stochastic is
  ``stochastic_decision``: the remainder times 2**nbits rounded to an integer, ties to even, plus rnd reaches
  2**nbits), and r*q is the result, exact. With man >= 1 the code's last bit is r's, so ties and odd see the
  code's parity; a carry to the next binade and a magnitude below one quantum (0 or q) come out as in the bit
  core. Overflow, NaN, infinities and signed zeros follow ``round_float_bits`` (CHK, dropped where
  ``needs_checks`` proves they cannot occur). Round-to-nearest-even uses ``round_nearest_fast`` (Veltkamp),
  tested equal to the bit core.
- ``_round_fixed`` is ``scalar.round_fixed_value`` with the mode chain replaced by one formula with loop-invariant
  weights (``_mode_weights``; np.floor for ``_floor``: they differ only in the sign of a zero, which never
  reaches a result there); x / period and v / span as products with their exact reciprocals (powers of two:
  the same correctly rounded values), and the wrap or the saturation alone, by the format (a constant).
- Stochastic bits: ``random_bits(key, o*K + k, nbits)``'s generator input key + (index + 1) * GOLDEN is
  (key + (base + 1) * GOLDEN) + j * K * GOLDEN modulo 2**64 for column j of a row: the first term once per row
  and k, the second a table per call (``_bits``), so the only 64-bit multiplies per element are splitmix64's two.
Results do not depend on tiling or thread count (each output element's operations are fixed).
"""
import functools
import math

import numpy as np
from numba import njit

from . import _cache, gemm_scalar, scalar, threads
from .abi import read_only
from .llvm_inline import inline_in_llvm

_cache.guard(__file__, [*scalar.SOURCES, gemm_scalar.__file__])

from .gemm_scalar import (  # noqa: E402
    P_KIND, P_MODE, S_ACC, S_BIAS, S_CHUNK, S_MUL, S_REDUCE, finish_row, tile_of,
)
from .gemm_vec_plan import consts, exact_sums, needs_checks, vec_applies  # noqa: E402,F401
from .scalar import (  # noqa: E402
    GOLDEN, NEAREST, NEAREST_AWAY, ODD, OVF_SAT, STOCHASTIC, TOWARD_ZERO, UP, DOWN, mix64, round_nearest_fast,
)

TM, TN = 8, 64  # output tile: rows x columns
EXP_FIELD = np.int64(0x7FF0000000000000)
BIAS2046 = np.int64(2046 << 52)
U0, U1 = np.uint64(0), np.uint64(1)


@njit(inline="always")
def _sum_odd(x, y):
    """round_odd(two_sum(x, y)): the binary64 round-to-odd of the exact x + y, branch-free; the tests of s and e
    on their bits (e != 0, s finite, s's last bit 0; e's side of s: their sign bits, as s != 0 when e != 0)."""
    s = x + y
    bb = s - x
    e = (x - (s - bb)) + (y - bb)
    us = np.float64(s).view(np.uint64)
    ue = np.float64(e).view(np.uint64)
    fix = ((ue << U1) != U0) & ((us << U1) < np.uint64(0xFFE0000000000000)) & ((us & U1) == U0)
    step = np.uint64(np.int64(ue ^ us) >> np.int64(63)) | U1  # +1 where e and s share a sign, else -1
    return np.uint64(us + (step if fix else U0)).view(np.float64)


@njit(inline="always")
def _sum(x, y, EXACT):
    return x + y if EXACT else _sum_odd(x, y)


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
def _up_stochastic(rem, rnd, two_n, lim):
    """``stochastic_decision``: d = rem * 2**nbits rounded to an integer, ties to even, plus rnd reaches 2**nbits.
    d + 2**52 is that integer plus 2**52 (0 <= d <= 2**32: the sum is in [2**52, 2**53), spacing 1), so its bits
    are 2**52's plus the integer, and the test is bits + rnd >= lim = 2**52's bits + 2**nbits (int64, exact)."""
    return np.float64(rem * two_n + 4503599627370496.0).view(np.int64) + np.int64(rnd) >= lim


@njit(inline="always")
def _round_float(x, rnd, c, f, MODE, CHK):
    """``round_float_bits`` of a binary64 value to the FloatFormat of ``c``/``f`` (``consts``), as float64.

    Float arithmetic in exponent-field units (int64 values shifted left by 52): the target's quantum q at |x|
    from x's exponent field E (E - man where E >= emin, else the smallest quantum's), 1/q, and t = x / q (exact:
    a power-of-two scaling that stays normal, see ``vec_applies``); the mode (a compile-time constant) rounds t
    to an integer r with one operation where it can: trunc / ceil / floor of the signed t for toward-zero / up
    / down (the ceiling of a negative t is its truncation: magnitudes round toward zero there), trunc(t +- 1/2)
    for nearest-away (|t| + 1/2 rounds only past the next integer's binade: same truncation), odd and
    stochastic from k = floor(|t|) and rem = |t| - k, exact; r is the code (man >= 1: its last bit is r's), and
    r*q the result, with x's sign (a signed t keeps it, zeros included: trunc(-0.3) = -0). A carry to
    2**(man+1) is the next binade's first value, and |x| below one quantum gives 0 or q, as in
    ``round_float_bits``. A zero keeps x's sign where the format has -0: adding zadd = -0.0 changes nothing,
    +0.0 turns -0 into +0. CHK: overflow and non-finite x by the same rules (dropped where ``needs_checks``
    proves that no sum or product can reach them)."""
    man52, emin52, lo52, ovf, to_all, to_neg, to_pos, lim = c[0], c[1], c[2], c[3], c[5], c[6], c[7], c[8]
    max_value, zadd, two_n = f[0], f[5], f[6]
    ex52 = np.float64(x).view(np.int64) & EXP_FIELD
    eq52 = ex52 - man52 if ex52 >= emin52 else lo52
    q = np.int64(eq52).view(np.float64)
    iq = np.int64(BIAS2046 - eq52).view(np.float64)
    if MODE == STOCHASTIC:
        t = np.abs(x) * iq
        k = np.floor(t)
        res = math.copysign((k + 1.0 if _up_stochastic(t - k, rnd, two_n, lim) else k) * q, x)
    elif MODE == ODD:
        t = np.abs(x) * iq
        k = np.floor(t)
        res = math.copysign((k + 1.0 if (t != k) & ((np.int64(k) & 1) == 0) else k) * q, x)
    elif MODE == NEAREST_AWAY:
        t = x * iq
        res = np.trunc(t + math.copysign(0.5, t)) * q
    elif MODE == TOWARD_ZERO:
        res = np.trunc(x * iq) * q
    elif MODE == UP:
        res = np.ceil(x * iq) * q
    elif MODE == DOWN:
        res = np.floor(x * iq) * q
    else:  # nearest-even: 0 <= t < 2**52, the magic constant rounds to an integer, ties to even
        res = math.copysign(((np.abs(x) * iq + 4503599627370496.0) - 4503599627370496.0) * q, x)
    if not CHK:
        return res + zadd
    neg = x < 0.0
    over = np.abs(res) > max_value
    to_max = (to_all != 0) | ((to_neg != 0) & neg) | ((to_pos != 0) & ~neg)
    big = max_value if to_max | (ovf == OVF_SAT) else (np.inf if ovf == 0 else np.nan)
    out = (math.copysign(big, x) if over else res) + zadd
    out = np.nan if over & ~to_max & (ovf == 1) else out
    inf_out = math.copysign(max_value, x) if ovf == OVF_SAT else (x if ovf == 0 else np.nan)
    return (inf_out if np.abs(x) == np.inf else x + 0.0) if ex52 == EXP_FIELD else out


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
def _round_fixed(x, rnd, c, f, w, STO, WRAP, CHK):
    """``round_fixed_value`` with the mode weights (module docstring). c: ``consts``' ints (the stochastic
    limit in c[8]); f: (lo, hi, span, period, scale, inv_scale, 2**nbits, 1/period, 1/span) as float64. WRAP:
    the format wraps (else it saturates); CHK: x may be infinite or NaN."""
    lo, hi, span, period, scale, inv, two_n, inv_period, inv_span = f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8]
    if WRAP:
        t = np.trunc(x * inv_period)  # x / period, truncated: period is a power of two
        x = x - t * period if np.abs(x) < np.inf else x
    y = x * scale
    neg = x < 0.0
    a = np.abs(y)
    k = np.floor(a)
    r = a - k  # a == 0 only where x == 0 (vec_applies: x * 2**frac cannot underflow)
    up = _up_stochastic(r, rnd, two_n, c[8]) if STO else _up(r, _is_odd(k), neg, w)
    k = k + 1.0 if up else k
    v = (0.0 - k if neg else k) + 0.0
    if WRAP:
        ww = v - np.floor(v * inv_span) * span
        v = ww - span if ww > hi else ww
    else:
        v = min(max(v, lo), hi)
    v = (hi if y > 0.0 else lo) if a == np.inf else v
    if CHK:
        v = x if x != x else v
    return v * inv


@njit
def _round(x, rnd, ci, cf, w, MODE, FIX, CHK):
    """Round x to the format of (ci, cf, w) in MODE (for fixed point only STOCHASTIC matters). FIX: 0 float, 1
    saturating fixed point, 2 wrapping fixed point. The callers pass MODE, FIX and CHK as plain (not literal)
    values: numba compiles this once, with every branch, and LLVM inlines it (``llvm_inline``) where they are
    constants and folds the branches away (per literal combination, numba compiled it 18 times in the tests:
    21 CPU-s)."""
    inline_in_llvm()
    if FIX:
        return _round_fixed(x, rnd, ci, cf, w, MODE == STOCHASTIC, FIX == 2, CHK)
    if MODE == NEAREST:
        return _round_nearest(x, cf, CHK)
    return _round_float(x, rnd, ci, cf, MODE, CHK)


@njit(inline="always")
def _bits(z, colz, jj, nbits, STO):
    """``random_bits`` for counter index base + jj*K, given z = key + (base + 1) * GOLDEN and colz[jj] = jj * K *
    GOLDEN (all modulo 2**64): the generator's input key + (index + 1) * GOLDEN, without a multiply."""
    return mix64(z + colz[jj]) >> np.uint64(64 - nbits) if STO else U0


@njit(inline="always")
def _mac_row(acc, brow, a, mi, mf, mw, ai, af, aw, colz, zmul, zacc, nbits, FUSED, MMODE, AMODE, AFIX, CHK, EXACT):
    """acc[j] <- round_acc(round_mul(a * brow[j]) + acc[j]) (or the fused step); stochastic bits at counter
    base + j*K (``_bits``: zmul, zacc carry the stream keys and the base)."""
    for jj in range(acc.size):
        p = a * brow[jj]
        if not FUSED:
            p = _round(p, _bits(zmul, colz, jj, nbits, MMODE == STOCHASTIC), mi, mf, mw, MMODE, np.int64(0),
                       CHK)
        acc[jj] = _round(_sum(p, acc[jj], EXACT), _bits(zacc, colz, jj, nbits, AMODE == STOCHASTIC), ai, af, aw,
                         AMODE, AFIX, CHK)


@njit(inline="always")
def _add_row(dst, src, ai, af, aw, colz, z, nbits, AMODE, AFIX, CHK, EXACT):
    """dst[j] <- round_acc(dst[j] + src[j]); src[j] <- 0 (a chunk close), counter base + j*K."""
    for jj in range(dst.size):
        dst[jj] = _round(_sum(dst[jj], src[jj], EXACT), _bits(z, colz, jj, nbits, AMODE == STOCHASTIC), ai, af, aw,
                         AMODE, AFIX, CHK)
        src[jj] = 0.0


@njit(cache=True, nogil=True)
def _tiles(t0, t1, A, B, bias, has_bias, out, mulp, accp, mi, mf, mw, ai, af, aw, lanes, chunk, keys, nbits, FUSED,
           MMODE, AMODE, AFIX, CHK, EXACT):
    """Output tiles t0..t1-1 (``tile_of``); A (bA, M, K), B (bB, K, N) float64 arrays of float32 values;
    mi/mf/mw, ai/af/aw: ``consts`` of the product and accumulator formats; mulp/accp: their parameter tuples
    (for the scalar cores); the flags as in ``kernel``, plain values: numba compiles this once for every flag
    combination and LLVM inlines it (``llvm_inline``) into each ``kernel``, where they are constants."""
    inline_in_llvm()
    nb, M, N = out.shape
    K = A.shape[2]
    bA, bB = A.shape[0], B.shape[0]
    span = chunk * lanes if chunk > 0 else max(K, 1)
    k_mul, k_acc, k_chunk, k_red, k_bias = keys[S_MUL], keys[S_ACC], keys[S_CHUNK], keys[S_REDUCE], keys[S_BIAS]
    colz = np.empty(TN, np.uint64)
    for jj in range(TN):
        colz[jj] = np.uint64(jj) * np.uint64(K) * GOLDEN
    inner = np.zeros((lanes, TN))
    outer = np.zeros((lanes, TN))
    v = np.empty(lanes)
    for t in range(t0, t1):
        b, i0, i1, j0, nj, ab, bbi = tile_of(t, M, N, bA, bB, TM, TN)
        for i in range(i0, i1):
            inner[:, :] = 0.0
            outer[:, :] = 0.0
            obase = (b * M + i) * N + j0
            arow = A[ab, i]
            for kk in range(0, K, span):
                for k in range(kk, min(K, kk + span)):
                    zb = np.uint64(obase * K + k + 1) * GOLDEN
                    _mac_row(inner[k % lanes, :nj], B[bbi, k, j0:j0 + nj], arow[k], mi, mf, mw, ai, af, aw, colz,
                             k_mul + zb, k_acc + zb, nbits, FUSED, MMODE, AMODE, AFIX, CHK, EXACT)
                if chunk > 0:
                    for lane in range(lanes):
                        zb = np.uint64(obase * K + kk + lane + 1) * GOLDEN
                        _add_row(outer[lane, :nj], inner[lane, :nj], ai, af, aw, colz, k_chunk + zb, nbits, AMODE,
                                 AFIX, CHK, EXACT)
            src = outer if chunk > 0 else inner
            finish_row(out, src, v, b, i, j0, nj, lanes, accp, k_red, bias, has_bias, k_bias, obase, nbits)


@functools.lru_cache(maxsize=None)
def kernel(FUSED: bool, MMODE: int, AMODE: int, AFIX: int, CHK: bool, EXACT: bool):
    """The kernel for one combination of flags: fused, the product and accumulator rounding modes (MMODE -1 when
    fused; AMODE -1 for a deterministic fixed-point accumulator, whose mode is a runtime weight), the
    accumulator's kind (AFIX: 0 float, 1 saturating fixed point, 2 wrapping), overflow/non-finite checks (CHK),
    exact sums (EXACT, ``exact_sums``). They are closure constants, passed on to ``_tiles`` as plain values:
    LLVM folds them there, so each inner loop compiles branch-free; numba caches each closure on disk under its
    own key (the closure's values are part of it). The kernel is serial over the output tiles t0..t1-1 and
    releases the GIL: ``run`` spreads the tiles over threads (``threads.launch``), so each variant compiles
    once, with no parfor body."""

    @njit(cache=True, nogil=True)
    def gemm_vec(t0, t1, A, B, bias, has_bias, out, mulp, accp, mi, mf, mw, ai, af, aw, lanes, chunk, keys, nbits):
        """``_tiles`` with this variant's flags."""
        _tiles(t0, t1, A, B, bias, has_bias, out, mulp, accp, mi, mf, mw, ai, af, aw, lanes, chunk, keys, nbits,
               np.bool_(FUSED), np.int64(MMODE), np.int64(AMODE), np.int64(AFIX), np.bool_(CHK), np.bool_(EXACT))

    return gemm_vec


# A launch on threads costs ~25 us more than numba's prange did (kernels/threads.py): GEMMs below this many
# products (~40 us on one thread) run on the calling thread alone.
PAR_MIN_MACS = 1 << 20


def run(A, B, bias, has_bias, out, fused, mulp, accp, lanes, chunk, keys, nbits, checks=None, exact=None,
        n_threads=None):
    """``gemm_cpu._gemm``'s call into ``gemm_vec``, its output tiles spread over threads (``threads.launch``:
    n_threads, default numba's thread count from ``PAR_MIN_MACS`` products on, else 1); checks / exact: None
    plans (``needs_checks``, ``exact_sums``), a bool forces (tests: checks on, or exact off, only add work)."""
    mi, mf, mw = consts(mulp, nbits)
    ai, af, aw = consts(accp, nbits)
    chk = needs_checks(A, B, fused, mulp, accp, lanes, chunk) if checks is None else bool(checks)
    ex = exact_sums(A, B, fused, mulp, accp, lanes, chunk) if exact is None else bool(exact)
    afix = 0 if accp[P_KIND] == 0 else (1 if accp[gemm_scalar.P_SAT] else 2)
    amode = int(accp[P_MODE])
    k = kernel(bool(fused), -1 if fused else int(mulp[P_MODE]),
               amode if not afix or amode == STOCHASTIC else -1, afix, chk, ex)
    nb, M, N = out.shape
    if n_threads is None and nb * M * N * A.shape[2] < PAR_MIN_MACS:
        n_threads = 1
    threads.launch(k, nb * ((M + TM - 1) // TM) * ((N + TN - 1) // TN), np.ascontiguousarray(A, dtype=np.float64),
                   np.ascontiguousarray(B, dtype=np.float64), read_only(bias), has_bias, out,
                   tuple(int(v) for v in mulp), tuple(int(v) for v in accp), mi, mf, mw, ai, af, aw, lanes, chunk,
                   tuple(np.uint64(k) for k in keys), nbits, threads=n_threads)
