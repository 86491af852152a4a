"""Binary floating-point rounding cores (``FloatFormat``): exact integer rounding of IEEE binary32/binary64
bits, the branch-free float32 core, and Veltkamp's split for round-to-nearest."""
import math

import numpy as np
from numba import njit

from .common import (DOWN, NEAREST, NEAREST_AWAY, ODD, ONE, OVF_INF, OVF_NAN, OVF_SAT, STOCHASTIC, TOWARD_ZERO,
                     U64, UP, ZERO, _msb, round_up_decision, stochastic_decision)


@njit(inline="always")
def round_float_bits(u, sign_pos, in_man, in_bias, man, emin, subnormals, max_bits, overflow, negzero,
                     mode, rnd, nbits):
    """Round one IEEE float, given as its bits, to a FloatFormat; returns the bits of the result.

    u: uint64 bits of a binary32 (sign_pos=31, in_man=23, in_bias=127) or binary64 (63, 52, 1023) value.
    man, emin: the target's mantissa bits and smallest normal exponent; subnormals: 0/1.
    max_bits: bits of the target's largest finite magnitude, in the input's own encoding.
    overflow: 0 inf, 1 NaN, 2 saturate; negzero: 0 if the target has no -0.
    rnd: random bits for mode 6 (else ignored), nbits: how many.
    The result is a value of the target format encoded in the input's binary format.
    """
    u = U64(u)
    sign = (u >> U64(sign_pos)) & ONE
    signbit = sign << U64(sign_pos)
    a = u & ((ONE << U64(sign_pos)) - ONE)
    exp_field = a >> U64(in_man)
    exp_all = (ONE << U64(sign_pos - in_man)) - ONE
    inf_bits = exp_all << U64(in_man)
    if exp_field == exp_all:
        if a != inf_bits:
            return u | (ONE << U64(in_man - 1))  # NaN: the same NaN, quietened (IEEE 754)
        if overflow == OVF_SAT:
            return signbit | U64(max_bits)
        if overflow == OVF_INF:
            return u
        return inf_bits | (ONE << U64(in_man - 1))
    if a == ZERO:
        return signbit if negzero != 0 else ZERO

    # exponent of the input's last bit, and its true (unbiased) exponent
    if exp_field == ZERO:
        ulpexp = 1 - in_bias - in_man
        etrue = ulpexp + _msb(a) if emin < 1 - in_bias else 1 - in_bias - 1
    else:
        etrue = np.int64(exp_field) - in_bias
        ulpexp = etrue - in_man
    # exponent of the target's quantum at this magnitude
    if etrue >= emin:
        qe = etrue - man
    elif subnormals != 0:
        qe = emin - man
    else:
        qe = emin
    shift = qe - ulpexp

    if shift <= 0:
        res = a
    elif shift <= in_man:
        mask = (ONE << U64(shift)) - ONE
        rem = a & mask
        if man == 0 and etrue >= emin:  # the code's parity is the biased exponent's
            lsb = U64((etrue - emin + 1) & 1)
        elif shift < in_man:
            lsb = (a >> U64(shift)) & ONE
        else:  # the kept significand is the implicit bit alone
            lsb = ONE if exp_field != ZERO else ZERO
        if mode == STOCHASTIC:
            up = stochastic_decision(rem, shift, rnd, nbits)
        else:
            up = round_up_decision(rem, ONE << U64(shift - 1), lsb, sign, mode)
        res = (a & ~mask) + (U64(1 if up else 0) << U64(shift))
    else:
        # the magnitude is below one quantum: the result is 0 or 2**qe
        sig = (a & ((ONE << U64(in_man)) - ONE)) | ((ONE << U64(in_man)) if exp_field != ZERO else ZERO)
        if mode == STOCHASTIC:
            up = stochastic_decision(sig, shift, rnd, nbits)
        else:
            hs = shift if shift < in_man + 2 else in_man + 2
            up = round_up_decision(sig, ONE << U64(hs - 1), ZERO, sign, mode)
        if up:
            if qe >= 1 - in_bias:
                res = U64(qe + in_bias) << U64(in_man)
            else:
                res = ONE << U64(qe - (1 - in_bias - in_man))
        else:
            res = ZERO

    if res > U64(max_bits):
        if (overflow == OVF_SAT or mode == TOWARD_ZERO or mode == ODD
                or (mode == UP and sign == ONE) or (mode == DOWN and sign == ZERO)):
            res = U64(max_bits)
        elif overflow == OVF_INF:
            res = inf_bits
        else:
            return inf_bits | (ONE << U64(in_man - 1))
    if res == ZERO and negzero == 0:
        return ZERO
    return signbit | res


@njit(inline="always")  # numba-IR inlining: the per-mode loops each vectorise
def round_f32_fast(u, man, emin, subnormals, max_bits, overflow, negzero, mode, rnd, nbits):
    """``round_float_bits`` for binary32 input bits, written branch-free so that loops over it vectorise.

    Same arguments and result as ``round_float_bits(u, 31, 23, 127, ...)`` (as int64), for targets with
    emin >= -126 (every format whose normal range lies inside float32's); callers check that.
    The significand of every finite input is ``sig = a - ((max(E, 1) - 1) << 23)`` with the quantum of the
    target at this exponent 2**shift units of the input's last place; the result re-encodes linearly
    (a carry into the exponent field is the correct next binade) while shift <= 24, and is 0 or 2**qe beyond.
    """
    u = np.int64(u)
    sign = u & 0x80000000
    a = u & 0x7FFFFFFF
    e_field = a >> 23
    ep = max(e_field, 1)
    et = ep - 127
    # a float32-subnormal input (e_field 0, value below 2**-126) is below the normal range of a target without
    # subnormals even when emin == -126: its quantum is then 2**emin, not the normal binade's
    in_normal = (et >= emin) & ((e_field != 0) | (subnormals != 0))
    qe = et - man if in_normal else (emin - man if subnormals != 0 else emin)
    shift = qe - et + 23
    sig = a - ((ep - 1) << 23)
    s = min(shift, 31)
    kept = sig >> s
    rem = sig & ((np.int64(1) << s) - 1)
    half = (np.int64(1) << s) >> 1
    # the lower neighbour's code parity; with no mantissa bits it is the biased exponent's, and 0 (even) for zero
    odd = ((kept & 1) == 1) if man > 0 else ((kept != 0) & (((et - emin + 1) & 1) == 1))
    inexact = rem != 0
    if mode == NEAREST:
        up = inexact & ((rem > half) | ((rem == half) & odd))
    elif mode == NEAREST_AWAY:
        up = inexact & (rem >= half)
    elif mode == UP:
        up = inexact & (sign == 0)
    elif mode == DOWN:
        up = inexact & (sign != 0)
    elif mode == ODD:
        up = inexact & ~odd
    elif mode == STOCHASTIC:
        d = shift - nbits  # the true shift: beyond 31 all of sig is remainder
        if d <= 0:
            drnd = rem << (-d)
        else:
            d = min(d, 62)
            q = rem >> d
            r = rem & ((np.int64(1) << d) - 1)
            h = np.int64(1) << (d - 1)
            drnd = q + np.int64((r > h) | ((r == h) & ((q & 1) == 1)))
        up = drnd + np.int64(rnd) >= (np.int64(1) << nbits)
    else:
        up = False
    k2 = kept + np.int64(up)
    pow2 = ((qe + 127) << 23) if qe >= -126 else (np.int64(1) << (qe + 149))
    res = (((ep - 1) << 23) + (k2 << s) if k2 != 0 else np.int64(0)) if shift <= 24 else (pow2 if up else np.int64(0))

    over = res > max_bits
    to_max = ((overflow == OVF_SAT) | (mode == TOWARD_ZERO) | (mode == ODD)
              | ((mode == UP) & (sign != 0)) | ((mode == DOWN) & (sign == 0)))
    nan_out = np.int64(0x7FC00000)
    big = max_bits if to_max else (np.int64(0x7F800000) if overflow == OVF_INF else nan_out)
    res = big if over else res
    out = sign | res
    out = np.int64(0) if (res == 0) & (negzero == 0) else out
    out = nan_out if over & (~to_max) & (overflow == OVF_NAN) else out
    # non-finite inputs
    inf_out = (sign | max_bits) if overflow == OVF_SAT else (u if overflow == OVF_INF else nan_out)
    out = ((u | 0x400000) if a > 0x7F800000 else inf_out) if e_field == 255 else out
    return out


@njit(inline="always")
def round_nearest_fast(x, split, magic, min_normal, max_value, ovf_value, sub, checks):
    """Round-to-nearest-even of ``x`` (float32 or float64 arithmetic, by x's type) to a FloatFormat.

    Normal range: Veltkamp's split (c = x * split, split = 2**(t-1-man) + 1 for t-bit significands;
    c - (c - x)) leaves x rounded to man+1 bits, ties to even. ``sub``: below min_normal use
    (x + magic) - magic, magic = 1.5 * 2**(t-1+q), which rounds x to a multiple of the quantum 2**q (the
    subnormal quantum, or min_normal itself without subnormals). ``checks``: a result above max_value (or
    an infinite x) becomes +-ovf_value (inf, NaN or max, by the format's overflow policy) and NaN stays NaN.
    Callers drop ``sub``/``checks`` only where they cannot matter. The subnormal branch drops the sign of a zero
    result (it gives +0); callers that need quantize's -0 restore it (``round_nearest_value``, and
    ``gemm_fast._signed``). Needs IEEE arithmetic without FMA contraction (numba's CPU default).
    Branch-free when inlined into a loop with constant flags, so it vectorises.
    """
    c = x * split
    y = c - (c - x)
    if sub:
        lo = (x + magic) - magic
        y = lo if abs(x) < min_normal else y
    if checks:
        bad = x if x != x else math.copysign(ovf_value, x)
        y = y if abs(y) <= max_value else bad
    return y


@njit(inline="always")
def round_nearest_value(x, split, magic, min_normal, max_value, ovf_value, negzero):
    """Round-to-nearest-even of a float64 ``x`` to a FloatFormat with man >= 1: ``round_nearest_fast`` with
    the bit-level cores' conventions, so that the bits agree with ``round_float_bits``: a zero keeps x's sign
    when the format has -0 (``negzero``), a NaN made by overflow is the positive quiet NaN, and an input NaN
    comes back quietened. (With man = 0, ties go to the even code, which this path does not see.)"""
    y = round_nearest_fast(x, split, magic, min_normal, max_value, ovf_value, True, True)
    y = abs(y) if (y != y) & (x == x) else y
    y = x + 0.0 if x != x else y
    zero = math.copysign(0.0, x) if negzero != 0 else 0.0
    return zero if y == 0.0 else y
