"""The host side of ``gemm_vec``: which units it runs (``vec_applies``), the loop-invariant constants of its
roundings (``consts``), and the two plan flags that drop work which provably cannot change a result for the
operands of a call (``needs_checks``: overflow and non-finite handling; ``exact_sums``: TwoSum and the binary64
round-to-odd of each sum). Pure numpy; nothing here is compiled."""
import numpy as np

from .gemm_scalar import (
    P_CMAX, P_CMIN, P_EMIN, P_FRAC, P_KIND, P_MAN, P_MAXBITS, P_MODE, P_NEGZERO, P_OVF, P_SAT, P_SUB,
)
from .gemm_fast_plan import accumulator_depth
from .scalar import DOWN, NEAREST, NEAREST_AWAY, ODD, TOWARD_ZERO, UP

MAGIC_BITS = 0x4330000000000000  # the bits of 2.0**52


def _max_value(p) -> float:
    return float(np.array(p[P_MAXBITS], dtype=np.int64).view(np.float64))


def _mode_weights(mode: int) -> tuple:
    """(nearest, away, rounds positive away, rounds negative away, rounds an even lower neighbour away)."""
    return tuple(np.int64(v) for v in (mode in (NEAREST, NEAREST_AWAY), mode == NEAREST_AWAY, mode == UP,
                                        mode == DOWN, mode == ODD))


def consts(p, nbits: int = 1) -> tuple:
    """(int constants, float constants, mode weights) of a format parameter vector, for the inner loops.

    Float formats: ints (man, emin + 1023, the smallest quantum's biased exponent: emin + 1023 - man with
    subnormals, emin + 1023 without), each shifted left by 52 (exponent-field units), then (overflow policy,
    -0 exists, toward-zero-or-odd, up, down, the stochastic limit 2**52's bits + 2**nbits); floats (max,
    ``round_nearest_fast``'s split, magic and min_normal, the overflow value, the zero to add (-0.0 keeps a -0),
    2**nbits, 0, 0). Fixed formats: ints (saturate, 0 x 7, the stochastic limit); floats (lowest and highest
    code, span = 2**bits, period = span * 2**-frac, 2**frac, 2**-frac, 2**nbits, 1 / period, 1 / span: powers
    of two, so the reciprocals are exact, see ``vec_applies``)."""
    p = [int(v) for v in p]
    mode = p[P_MODE]
    w = _mode_weights(mode)
    lim = MAGIC_BITS + (1 << nbits)
    two_n = 2.0**nbits
    if p[P_KIND] == 0:
        man, emin, sub, ovf = p[P_MAN], p[P_EMIN], p[P_SUB], p[P_OVF]
        emin_b = emin + 1023
        ci = (man << 52, emin_b << 52, (emin_b - man if sub else emin_b) << 52, ovf, p[P_NEGZERO],
              mode in (TOWARD_ZERO, ODD), mode == UP, mode == DOWN, lim)
        q = emin - man if sub else emin  # round_nearest_fast's (split, magic, min_normal, overflow value)
        max_value = _max_value(p)
        cf = (max_value, 2.0 ** (52 - man) + 1.0, 1.5 * 2.0 ** (52 + q), 2.0**emin, (np.inf, np.nan, max_value)[ovf],
              -0.0 if p[P_NEGZERO] else 0.0, two_n, 0.0, 0.0)
    else:
        frac, lo, hi = p[P_FRAC], float(p[P_CMIN]), float(p[P_CMAX])
        span = hi - lo + 1.0
        period = float(np.ldexp(span, -frac))
        ci = (p[P_SAT],) + (0,) * 7 + (lim,)
        cf = (lo, hi, span, period, float(np.ldexp(1.0, frac)), float(np.ldexp(1.0, -frac)), two_n, 1.0 / period,
              1.0 / span)
    return tuple(np.int64(v) for v in ci), tuple(np.float64(v) for v in cf), w


def _is_pow2(x: float) -> bool:
    m, _ = np.frexp(x)
    return bool(np.isfinite(x) and x > 0 and m == 0.5)


def vec_applies(fused: int, mulp, accp) -> bool:
    """Whether ``gemm_vec`` runs this unit's datapath exactly (``gemm_vec``'s docstring): float products (or
    fused), a float or fixed accumulator; float formats with 1 <= man <= 51 (man = 0: the code's parity is the
    exponent's), smallest quantum >= 2**-1022 and max < 2**700. Then every scaling t = |x| / q is exact: a
    nonzero x is on the 2**-298 grid (products of float32 values and their sums), so 2**-1022 <= t < 2**53.
    Fixed formats: span = 2**bits (so dividing by span and by the period is multiplying by an exact
    reciprocal: the same correctly rounded quotient) with 2**-1000 < period, 1 / period < 2**1000, and
    frac >= -700 (x * 2**frac of a nonzero x >= 2**-298 never underflows to 0)."""
    def float_ok(p):
        man, emin = int(p[P_MAN]), int(p[P_EMIN])
        q = emin - man if p[P_SUB] else emin
        return 1 <= man <= 51 and q >= -1022 and _max_value(p) < 2.0**700

    def fixed_ok(p):
        frac, span = int(p[P_FRAC]), float(p[P_CMAX]) - float(p[P_CMIN]) + 1.0
        period = float(np.ldexp(span, -frac))
        return _is_pow2(span) and 2.0**-1000 < period < 2.0**1000 and frac >= -700

    mul_ok = bool(fused) or (mulp[P_KIND] == 0 and float_ok(mulp))
    acc_ok = (accp[P_KIND] == 1 and fixed_ok(accp)) or (accp[P_KIND] == 0 and float_ok(accp))
    return bool(mul_ok and acc_ok)


def _finite_max_abs(x) -> float:
    a = np.abs(np.asarray(x, dtype=np.float64))
    a = a[np.isfinite(a)]
    return float(a.max()) if a.size else 0.0


def _bounds(A, B, fused, mulp, accp, lanes=None, chunk=None):
    """(P, log2 S): bounds on every finite |round_mul(a*b)| and on every finite partial sum (exact, before its
    rounding) of the datapath, from the finite operands. |round_mul(a*b)| <= P = top (1 + 2**-mm) + qm (top =
    max|a| max|b|; rounding a magnitude away from zero adds at most one quantum: 2**-man of it in the normal
    range, the smallest quantum qm below); a sum adds at most K products through at most N = 2K + 2w + 8
    roundings (K into the inner accumulators, at most K + w chunk closes, w - 1 lane sums, the bias; w the lanes,
    at most 64), at most R = ``gemm_fast_plan.accumulator_depth(K, lanes, chunk)`` of them on any one path, each
    growing a magnitude by a factor 1 + 2**-am plus qa (fixed point: plus one quantum), so
    S = (K P + N qa) (1 + 2**-am)**R. A non-finite product only makes non-finite sums."""
    K = A.shape[2]
    top = _finite_max_abs(A) * _finite_max_abs(B)
    prod = top
    if not fused:
        mm, emin = int(mulp[P_MAN]), int(mulp[P_EMIN])
        prod = top * (1.0 + 2.0**-mm) + 2.0 ** (emin - (mm if mulp[P_SUB] else 0))
    R = accumulator_depth(K, lanes, chunk)
    N = 2 * K + 2 * (64 if lanes is None else int(lanes)) + 8
    if accp[P_KIND] == 1:
        return prod, np.log2(K * prod + N * 2.0 ** -int(accp[P_FRAC]))
    am, emin = int(accp[P_MAN]), int(accp[P_EMIN])
    qa = 2.0 ** (emin - (am if accp[P_SUB] else 0))
    return prod, np.log2(K * prod + N * qa) + R * np.log2(1.0 + 2.0**-am)


def needs_checks(A, B, fused, mulp, accp, lanes=None, chunk=None) -> bool:
    """False where no product or partial sum can overflow or be non-finite, so that ``_round_float`` may drop that
    work (CHK): the operands are finite, P (``_bounds``) stays below the product format's max, and S below the
    accumulator's (fixed point: saturation and wrap are part of its rounding; only P matters). lanes, chunk: the
    unit's (None: not known, then S holds for every datapath)."""
    a, b = np.asarray(A, dtype=np.float64), np.asarray(B, dtype=np.float64)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return True
    prod, log_s = _bounds(A, B, fused, mulp, accp, lanes, chunk)
    if not fused and not prod < _max_value(mulp):
        return True
    if accp[P_KIND] == 1:
        return False
    return not log_s < np.log2(_max_value(accp)) - 1e-9


def exact_sums(A, B, fused, mulp, accp, lanes=None, chunk=None) -> bool:
    """True where every sum of the datapath (product + accumulator, chunk close) is exact in binary64, so that
    TwoSum and the round-to-odd can be dropped (EXACT: a sum that is exact has error e = 0, and round_odd(s, 0)
    is s; a non-finite sum is left as it is by both).

    Not fused: every finite product is a multiple of 2**gm, gm = emin - man of the product format (its
    smallest quantum; a result is x itself or a multiple of a coarser quantum, max included). Every accumulator
    value is then a multiple of 2**g, g = min(gm, ga), by induction: a sum of multiples is one, and rounding a
    nonzero multiple of 2**g gives x itself (representable where the quantum is finer) or a multiple of a quantum
    above 2**g (or the max, a multiple of its binade's quantum 2**ga; fixed point: codes times 2**-frac,
    ga = -frac, wrap subtracts multiples of the period). A multiple of 2**g with magnitude below 2**(g + 53) is
    a binary64 value, so each sum is exact when every |x + y| < 2**(g + 53): bounded by the formats
    (max product + max accumulator, or twice the accumulator's max) or, when smaller, by ``_bounds``'s S."""
    if fused:
        return False
    gm = int(mulp[P_EMIN]) - int(mulp[P_MAN])
    max_mul = _max_value(mulp)
    if accp[P_KIND] == 1:
        frac = int(accp[P_FRAC])
        ga = -frac
        max_acc = max(abs(float(accp[P_CMIN])), abs(float(accp[P_CMAX]))) * 2.0**-frac
    else:
        max_acc = _max_value(accp)
        ga = int(np.frexp(max_acc)[1]) - 1 - int(accp[P_MAN])
    g = min(gm, ga)
    if g < -1074:
        return False
    bound = max(max_mul + max_acc, 2.0 * max_acc)
    _, log_s = _bounds(A, B, fused, mulp, accp, lanes, chunk)
    return bool(bound < 2.0 ** (g + 53) or log_s < g + 53 - 1e-9)
