"""Scalar cores of the multi-term (tensor-core) datapath and of exact (Kulisch) accumulation.

Signature-less ``@njit`` functions shared by the CPU (``gemm_multiterm``) and CUDA (``gemm_multiterm_cuda``)
kernels. The datapath is specified in ``emunum.mad.unit``; the parameter vector ``prm`` (int64) holds:
  T_KIND 0 multi-term / 1 exact; T_TERMS n; T_P align bits (-1: lossless); T_AMODE alignment rounding code;
  T_FLOOR the lowest step exponent (or NO_FLOOR); T_CARRY carry bits (-1: unlimited); T_PROMOTE products per
  promotion (0: none); T_FUSED 1 exact products / 0 rounded to mul_fmt; T_IN_EMIN, T_C_EMIN, T_MUL_EMIN
  the minimum exponents of operands, accumulator values and rounded products.

Exactness. Operands are float32-representable, so a product is exact in binary64. A term t aligned to the
quantum 2**(E-p) is ldexp(|t|, p-E) (exact: no over- or underflow for p <= 40 and float32 operands), split
into floor and remainder (both exact). A step's aligned sum has at most p + 3 + log2(n + 1) <= 52 bits, so
the float64 sum of the aligned integers is exact, and so is ldexp(S, E-p). Lossless steps and exact
accumulation use a Kulisch accumulator: ``NLIMB`` signed 32-bit digits in int64 over binary64's whole range,
read back as the binary64 round-to-odd of the exact sum (``kul_ro53``), which rounds to any format of
<= 51 bits exactly as the exact sum would (Boldo and Melquiond 2008).
"""
import math

import numpy as np
from numba import njit

from .gemm_scalar import P_EMIN, P_MAN, P_MAXBITS, P_MODE, P_SUB, bits_f64, f64_bits, round_draw, round_odd, round_value, two_sum

from .abi import (NO_FLOOR, NTPARAM, T_AMODE, T_C_EMIN, T_CARRY, T_FLOOR, T_FUSED, T_IN_EMIN, T_KIND,  # noqa: F401
                  T_MUL_EMIN, T_P, T_PROMOTE, T_TERMS)

LIMB = 32
LOW = -1152  # weight of limb 0's least significant bit
NLIMB = 72   # covers 2**-1152 .. 2**1152
RADIX = 4294967296
MASK = 4294967295

# rounding-mode codes (RoundMode's values)
_NEAREST, _NEAREST_AWAY, _TOWARD_ZERO, _UP, _DOWN, _ODD = 0, 1, 2, 3, 4, 5


@njit
def exponent_of(x, emin):
    """floor(log2|x|), at least emin, for finite nonzero x."""
    e = math.frexp(x)[1] - 1
    return e if e > emin else emin


@njit
def kul_clear(limbs):
    for i in range(NLIMB):
        limbs[i] = 0


@njit
def kul_add(limbs, x):
    """limbs += x, exactly (finite binary64 x)."""
    if x == 0.0:
        return
    m, e = math.frexp(x)
    kul_add_int(limbs, np.int64(math.ldexp(m, 53)), e - 53)


@njit
def kul_add_int(limbs, mant, lsb):
    """limbs += mant * 2**lsb, exactly (|mant| < 2**53)."""
    neg = mant < 0
    u = -mant if neg else mant
    pos = lsb - LOW
    idx = pos // LIMB
    off = pos - idx * LIMB
    ml = u & MASK
    mh = u >> 32
    v1 = ml << off
    v2 = mh << off
    d0 = v1 & MASK
    d1 = (v1 >> 32) + (v2 & MASK)
    d2 = v2 >> 32
    if neg:
        limbs[idx] -= d0
        limbs[idx + 1] -= d1
        limbs[idx + 2] -= d2
    else:
        limbs[idx] += d0
        limbs[idx + 1] += d1
        limbs[idx + 2] += d2


@njit
def _propagate(limbs):
    for i in range(NLIMB - 1):
        c = limbs[i] // RADIX
        limbs[i] -= c * RADIX
        limbs[i + 1] += c


@njit
def kul_ro53(limbs):
    """The binary64 round-to-odd of the exact sum held in limbs (destroys limbs' digit form)."""
    _propagate(limbs)
    neg = limbs[NLIMB - 1] < 0
    if neg:
        for i in range(NLIMB):
            limbs[i] = -limbs[i]
        _propagate(limbs)
    h = NLIMB - 1
    while h >= 0 and limbs[h] == 0:
        h -= 1
    if h < 0:
        return 0.0
    t = np.uint64(limbs[h])
    bl = 0
    while (t >> np.uint64(bl)) != np.uint64(0):
        bl += 1
    mid = np.uint64(limbs[h - 1]) if h >= 1 else np.uint64(0)
    low = np.uint64(limbs[h - 2]) if h >= 2 else np.uint64(0)
    w = (t << np.uint64(64 - bl)) | (mid << np.uint64(32 - bl))
    if bl < 32:
        w |= low >> np.uint64(bl)
    sticky = (low & ((np.uint64(1) << np.uint64(bl)) - np.uint64(1))) != np.uint64(0)
    for i in range(h - 2):
        if limbs[i] != 0:
            sticky = True
    keep = w >> np.uint64(11)
    if sticky or (w & np.uint64(2047)) != np.uint64(0):
        keep |= np.uint64(1)
    v = math.ldexp(np.float64(keep), LOW + LIMB * h - 64 + bl + 11)
    return -v if neg else v


@njit
def align_term(t, shift, mode):
    """t / 2**-shift rounded to an integer in alignment mode (t finite; result a signed float64 integer)."""
    neg = t < 0.0
    q = math.ldexp(-t if neg else t, shift)
    k = math.floor(q)
    r = q - k
    if r != 0.0:
        up = False
        if mode == _NEAREST:
            up = r > 0.5 or (r == 0.5 and k - 2.0 * math.floor(0.5 * k) == 1.0)
        elif mode == _NEAREST_AWAY:
            up = r >= 0.5
        elif mode == _UP:
            up = not neg
        elif mode == _DOWN:
            up = neg
        elif mode == _ODD:
            up = k - 2.0 * math.floor(0.5 * k) == 0.0
        if up:
            k += 1.0
    return -k if neg else k


@njit
def product(a, b, ea_min, prm, mulp):
    """(value, exponent) of the product a*b as it enters the adder (value 0: skipped)."""
    p = np.float64(a) * np.float64(b)
    if p == 0.0 or not math.isfinite(p):
        return p, 0
    if prm[T_FUSED] == 1:
        return p, exponent_of(np.float64(a), ea_min) + exponent_of(np.float64(b), ea_min)
    r = round_value(p, mulp, np.uint64(0), 32)
    if r == 0.0 or not math.isfinite(r):
        return r, 0
    return r, exponent_of(r, prm[T_MUL_EMIN])


@njit
def fused_step(av, bv, cnt, c, prm, mulp, accp, limbs):
    """One multi-term step: the products av[q]*bv[q], q < cnt, and the accumulator c, aligned, summed and
    rounded to acc_fmt (see module docstring). av, bv: the step's operands (local arrays of the caller)."""
    in_emin = prm[T_IN_EMIN]
    p_bits = prm[T_P]
    # pass 1: the step exponent, and non-finite terms
    E = prm[T_FLOOR]
    special = 0.0
    has_special = False
    nz = False
    if c != 0.0:
        if math.isfinite(c):
            ec = exponent_of(c, prm[T_C_EMIN])
            E = ec if ec > E else E
            nz = True
        else:
            special += c
            has_special = True
    for q in range(cnt):
        t, e = product(av[q], bv[q], in_emin, prm, mulp)
        if t == 0.0:
            continue
        if not math.isfinite(t):
            special += t
            has_special = True
            continue
        nz = True
        E = e if e > E else E
    if has_special:
        return round_value(special, accp, np.uint64(0), 32)
    if not nz:
        return 0.0
    if p_bits < 0:
        kul_clear(limbs)
        kul_add(limbs, c)
        for q in range(cnt):
            t, e = product(av[q], bv[q], in_emin, prm, mulp)
            kul_add(limbs, t)
        return round_value(kul_ro53(limbs), accp, np.uint64(0), 32)
    shift = p_bits - E
    mode = prm[T_AMODE]
    s = 0.0
    if c != 0.0:
        s += align_term(c, shift, mode)
    for q in range(cnt):
        t, e = product(av[q], bv[q], in_emin, prm, mulp)
        if t != 0.0:
            s += align_term(t, shift, mode)
    if prm[T_CARRY] >= 0:
        m = math.ldexp(1.0, 3 + prm[T_CARRY] + p_bits)
        h = 0.5 * m
        s = s + h - m * math.floor((s + h) / m) - h
    return round_value(math.ldexp(s, -shift), accp, np.uint64(0), 32)


@njit
def promote(outer, acc, outerp):
    """round_outer(outer + acc): the exact sum rounded once (binary64 round-to-odd first)."""
    s, e = two_sum(outer, acc)
    return round_value(round_odd(s, e), outerp, np.uint64(0), 32)


@njit
def is_promotion_point(k1, K, prm):
    """Whether the step ending before product k1 closes a promotion block (every P products, and the last)."""
    return prm[T_PROMOTE] > 0 and (k1 % prm[T_PROMOTE] == 0 or k1 == K)


@njit
def exact_accumulate(limbs, t, special, has_special):
    """Kulisch accumulation of a term t (finite: into limbs; non-finite: into the special sum)."""
    if math.isfinite(t):
        kul_add(limbs, t)
        return special, has_special
    return special + t, True


@njit
def exact_result(limbs, special, has_special, outp, key, index, nbits):
    """The exact sum rounded once to outp's format and mode (stochastic bits at counter index)."""
    if has_special:
        return round_draw(special, outp, key, index, nbits)
    return round_draw(kul_ro53(limbs), outp, key, index, nbits)


# ---- integer fast path (CPU): operands as significand x 2**(exponent - 23) -------------------------------

@njit
def decompose(x, emin):
    """(m, e, ok): x = m * 2**(e - 23) with e = max(floor(log2|x|), emin) and m an integer (|m| < 2**24);
    ok False when x is not finite or m would not be an integer (x below the operand format's grid)."""
    if x == 0.0:
        return np.int64(0), emin, True
    if not math.isfinite(x):
        return np.int64(0), emin, False
    e = exponent_of(x, emin)
    y = math.ldexp(x, 23 - e)
    m = math.floor(y)
    if m != y:
        return np.int64(0), emin, False
    return np.int64(m), e, True


@njit
def round_int_scaled(s, base, accp):
    """round_acc(s * 2**base) for an int64 s (|s| < 2**53): integer rounding for toward_zero and nearest-even
    to a float format with subnormals, else (and on overflow) the bit-exact core. Same bits either way."""
    if s == 0:
        return 0.0
    mode = accp[P_MODE]
    if accp[P_SUB] == 0 or (mode != _TOWARD_ZERO and mode != _NEAREST):
        return round_value(math.ldexp(np.float64(s), base), accp, np.uint64(0), 32)
    neg = s < 0
    u = -s if neg else s
    e = base + np.int64((f64_bits(np.float64(u)) >> np.uint64(52)) & np.uint64(2047)) - 1023  # u < 2**53: exact
    q = (e if e > accp[P_EMIN] else accp[P_EMIN]) - accp[P_MAN]
    r = q - base
    if r > 0:
        k = u >> r if r < 63 else np.int64(0)
        if mode == _NEAREST and r < 64:
            rem = u - (k << r) if r < 63 else u
            half = np.int64(1) << (r - 1)
            if rem > half or (rem == half and (k & 1) == 1):
                k += 1
        v = math.ldexp(np.float64(k), q)
    else:
        v = math.ldexp(np.float64(u), base)
    if v > bits_f64(np.uint64(accp[P_MAXBITS])):
        return round_value(math.ldexp(np.float64(s), base), accp, np.uint64(0), 32)
    return -v if neg else v


@njit
def fast_step(MA, EA, ia, MB, EB, ib, k0, k1, c, prm, accp):
    """``fused_step`` for exact products and toward-zero alignment on integer operands: row ia of (MA, EA),
    row ib of (MB, EB) (from ``decompose``), products k0..k1-1. Same bits as ``fused_step``."""
    E = prm[T_FLOOR]
    nz = False
    cm = np.int64(0)
    ce = 0
    if c != 0.0:
        if not math.isfinite(c):
            return round_value(c, accp, np.uint64(0), 32)
        cb = f64_bits(c)  # c is a normal binary64 (an fp32-range value): c = +-cm * 2**ce
        be = np.int64((cb >> np.uint64(52)) & np.uint64(2047))
        cm = np.int64(cb & np.uint64(4503599627370495)) | (np.int64(1) << 52)
        if c < 0.0:
            cm = -cm
        ce = be - 1075
        ec = be - 1023
        ec = ec if ec > prm[T_C_EMIN] else prm[T_C_EMIN]
        E = ec if ec > E else E
        nz = True
    emax = NO_FLOOR
    for k in range(k0, k1):
        e = EA[ia, k] + EB[ib, k] if MA[ia, k] * MB[ib, k] != 0 else NO_FLOOR
        emax = max(emax, e)
    if emax > NO_FLOOR:
        nz = True
        E = max(E, emax)
    if not nz:
        return 0.0
    p_bits = prm[T_P]
    base = E - p_bits
    s = np.int64(0)
    if cm != 0:
        sh = min(base - ce, 63)
        sgn = cm >> 63
        s += (((cm ^ sgn) - sgn) >> sh ^ sgn) - sgn
    for k in range(k0, k1):  # branch-free: |prod| >> sh with prod's sign (truncation toward zero)
        prod = MA[ia, k] * MB[ib, k]
        sh = min(base - (EA[ia, k] + EB[ib, k]) + 46, 63)
        sgn = prod >> 63
        s += (((prod ^ sgn) - sgn) >> sh ^ sgn) - sgn
    if prm[T_CARRY] >= 0:
        w = 3 + prm[T_CARRY] + p_bits
        h = np.int64(1) << (w - 1)
        s = ((s + h) & ((np.int64(1) << w) - 1)) - h
    return round_int_scaled(s, base, accp)
