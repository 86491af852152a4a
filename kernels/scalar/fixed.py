"""Fixed-point rounding core (``FixedFormat``): float64 value -> the rounded, saturated or wrapped code."""
import math

from numba import njit

from .common import DOWN, NEAREST, NEAREST_AWAY, ODD, STOCHASTIC, UP, _floor, _is_odd


@njit(inline="always")
def round_fixed_value(x, frac_bits, code_min, code_max, saturate, mode, rnd, nbits):
    """Round one float64 value to fixed point (integer code * 2**-frac_bits); returns a float64.

    Magnitude rounding as in ``round_float_bits``; then saturate to [code_min, code_max] or wrap modulo
    2**bits. Infinities saturate; NaN stays NaN; zero is +0. Written with selects so that loops vectorise.
    """
    return round_fixed_const(x, fixed_constants(frac_bits, code_min, code_max, saturate, mode, nbits), saturate, mode,
                             rnd)


@njit(inline="always")
def fixed_constants(frac_bits, code_min, code_max, saturate, mode, nbits):
    """(lo, hi, span, period, scale, unscale, two_n) of ``round_fixed_const`` for a format, mode and nbits: the
    powers of two ``round_fixed_value`` uses, made once per loop by a caller that rounds many values
    (math.ldexp is a call that numba cannot hoist out of a loop, and it kept the loop from vectorising); the
    period only where the format wraps and two_n only for stochastic rounding (0.0 otherwise, not read), as
    before, so a caller of ``round_fixed_value`` per value makes no more calls than it did."""
    lo = float(code_min)
    hi = float(code_max)
    span = hi - lo + 1.0  # 2**bits, and lo <= 0 <= hi: every wrap step below is exact
    period = math.ldexp(span, -frac_bits) if saturate == 0 else 0.0
    two_n = math.ldexp(1.0, nbits) if mode == STOCHASTIC else 0.0
    return lo, hi, span, period, math.ldexp(1.0, frac_bits), math.ldexp(1.0, -frac_bits), two_n


@njit(inline="always")
def round_fixed_const(x, c, saturate, mode, rnd):
    """``round_fixed_value`` with its constants c from ``fixed_constants``: the same operations on the same
    values, so the same result."""
    lo, hi, span, period, scale, unscale, two_n = c
    if saturate == 0:
        # reduce modulo the period first, so that scaling cannot overflow (x - trunc(x/P)*P is exact)
        t = x / period
        t = _floor(t) if t >= 0.0 else -_floor(-t)
        x = x - t * period if abs(x) < math.inf else x
    y = x * scale
    neg = x < 0.0
    a = abs(y)
    k = _floor(a)
    r = a - k
    r = 5e-324 if (a == 0.0) & (x != 0.0) else r  # a remainder lost to underflow (frac_bits < 0) is not 0
    odd = _is_odd(k)
    if mode == NEAREST:
        up = (r > 0.5) | ((r == 0.5) & odd)
    elif mode == NEAREST_AWAY:
        up = r >= 0.5
    elif mode == UP:
        up = (r > 0.0) & ~neg
    elif mode == DOWN:
        up = (r > 0.0) & neg
    elif mode == ODD:
        up = (r > 0.0) & ~odd
    elif mode == STOCHASTIC:
        d = r * two_n
        f = _floor(d)
        dd = d - f
        f = f + (1.0 if (dd > 0.5) | ((dd == 0.5) & _is_odd(f)) else 0.0)
        up = f + float(rnd) >= two_n
    else:
        up = False
    k = k + (1.0 if up else 0.0)
    v = (0.0 - k if neg else k) + 0.0
    if saturate != 0:
        v = min(max(v, lo), hi)
    else:
        w = v - _floor(v / span) * span
        v = w - span if w > hi else w
    v = (hi if y > 0.0 else lo) if a == math.inf else v
    v = x if x != x else v
    return v * unscale
