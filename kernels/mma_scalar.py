"""Scalar cores of the matrix-instruction datapaths (``emunum.mad.mma``): one instruction step per call.

Signature-less ``@njit`` functions shared by the CPU (``mma_cpu``) and CUDA (``mma_cuda``) kernels. The
datapaths are specified in ``emunum.mad.mma``; the int64 parameter vector ``prm`` holds (slots below):
  KIND 0 NVIDIA fused step / 1 NVIDIA 16-element groups (mxf4nvf4) / 2 AMD two-stage step;
  TERMS products per step; FRAC fraction bits kept below the step exponent; OUT_MAN fraction bits of the
  result (NVIDIA, truncated); EL_EMIN the element format's smallest exponent; SC_EMIN the scale format's;
  BLOCK elements per scale (0: no scales); PAIRS 1: AMD's even/odd split of a step (fp8).

Exactness. Every term is t = sig * 2**e with a short significand (at most 24 bits, or a 16-element group sum
of at most 12 bits times two 4-bit scale significands); ``ldexp(sig, FRAC + e - E)`` is exact (binary64's
range holds every exponent that occurs), and its floor or truncation is an integer below 2**50, so the int64
sums are exact and so is ``ldexp(S, E - FRAC)``.
"""
import math

import numpy as np
from numba import njit

from .abi import X_AMD_TWO_STAGE as AMD_TWO_STAGE, X_BLOCK as BLOCK, X_EL_EMIN as EL_EMIN, X_FRAC as FRAC  # noqa: E402
from .abi import X_KIND as KIND, X_NV_FUSED as NV_FUSED, X_NV_GROUPS as NV_GROUPS, X_OUT_MAN as OUT_MAN  # noqa: E402
from .abi import X_PAIRS as PAIRS, X_SC_EMIN as SC_EMIN, X_TERMS as TERMS  # noqa: E402,F401
ZERO_EXP = -126  # the exponent a zero operand carries into the alignment (MMA-Sim's convention, every format)
FP32_EMIN = -126
GROUP = 16  # mxf4nvf4: elements summed exactly before scaling
LOWEST = -100000  # no term yet
TWO128 = 2.0**128


@njit
def sig_exp(x, emin):
    """(significand, exponent) of a finite x: x = sig * 2**e, e = max(floor(log2|x|), emin); zero: (0, -126)."""
    if x == 0.0:
        return 0.0, ZERO_EXP
    e = math.frexp(x)[1] - 1
    if e < emin:
        e = emin
    return math.ldexp(x, -e), e


@njit
def trunc_int(x):
    """x rounded toward zero, as an int64 (|x| < 2**53)."""
    return np.int64(math.floor(x)) if x >= 0.0 else -np.int64(math.floor(-x))


@njit
def floor_int(x):
    return np.int64(math.floor(x))


@njit
def truncate_fp32(v, out_man):
    """v (finite binary64) truncated toward zero to out_man fraction bits at exponent max(floor(log2|v|), -126);
    a result of 2**128 or more is infinite (the store to fp32 overflows); a zero result is +0."""
    if v == 0.0:
        return 0.0
    e = math.frexp(v)[1] - 1
    if e < FP32_EMIN:
        e = FP32_EMIN
    a = math.ldexp(math.floor(math.ldexp(abs(v), out_man - e)), e - out_man)
    if a == 0.0:  # a value below the smallest subnormal truncates to +0, whatever its sign
        return 0.0
    if a >= TWO128:
        a = math.inf
    return -a if v < 0.0 else a


@njit
def special_sum(arow, brow, sarow, sbrow, k0, k1, c, prm):
    """The binary64 sum of the step's scaled products and c (a non-finite value flags a special step)."""
    s = np.float64(c)
    blk = prm[BLOCK]
    for k in range(k0, k1):
        p = np.float64(arow[k]) * np.float64(brow[k])
        if blk > 0:
            p = p * np.float64(sarow[k // blk]) * np.float64(sbrow[k // blk])
        s += p
    return s


@njit
def nv_fused(arow, brow, sarow, sbrow, k0, k1, c, prm):
    """One NVIDIA fused step: terms c and a_k*b_k (times the step's scales, as exponents only), aligned to the
    largest exponent, each truncated to FRAC bits below it, summed exactly, truncated to OUT_MAN bits."""
    sp = special_sum(arow, brow, sarow, sbrow, k0, k1, c, prm)
    if not math.isfinite(sp):
        return sp
    emin = prm[EL_EMIN]
    frac = prm[FRAC]
    blk = prm[BLOCK]
    sc, E = sig_exp(np.float64(c), FP32_EMIN)
    ec = E
    for k in range(k0, k1):
        e = sig_exp(np.float64(arow[k]), emin)[1] + sig_exp(np.float64(brow[k]), emin)[1]
        if blk > 0:
            e += sig_exp(np.float64(sarow[k // blk]), prm[SC_EMIN])[1] + sig_exp(np.float64(sbrow[k // blk]),
                                                                                 prm[SC_EMIN])[1]
        E = e if e > E else E
    S = trunc_int(math.ldexp(sc, frac + ec - E))
    for k in range(k0, k1):
        sa, ea = sig_exp(np.float64(arow[k]), emin)
        sb, eb = sig_exp(np.float64(brow[k]), emin)
        e = ea + eb
        if blk > 0:
            e += sig_exp(np.float64(sarow[k // blk]), prm[SC_EMIN])[1] + sig_exp(np.float64(sbrow[k // blk]),
                                                                                 prm[SC_EMIN])[1]
        S += trunc_int(math.ldexp(sa * sb, frac + e - E))
    return truncate_fp32(math.ldexp(np.float64(S), E - frac), prm[OUT_MAN])


@njit
def nv_groups(arow, brow, sarow, sbrow, k0, k1, c, prm):
    """One mxf4nvf4 step: each 16-element group's exact sum G times its scales' significands, at the exponent
    of its scales (sum of the two scale exponents); c and the groups aligned to the largest exponent, each
    truncated to FRAC bits below it, summed exactly, truncated to OUT_MAN bits."""
    blk = prm[BLOCK]
    if c != c:
        return np.float64(c)
    for k in range(k0, k1, blk):
        if sarow[k // blk] != sarow[k // blk] or sbrow[k // blk] != sbrow[k // blk]:
            return math.nan
    if not math.isfinite(c):
        return np.float64(c)
    frac = prm[FRAC]
    semin = prm[SC_EMIN]
    sc, E = sig_exp(np.float64(c), FP32_EMIN)
    ec = E
    for g in range(k0, k1, GROUP):
        e = sig_exp(np.float64(sarow[g // blk]), semin)[1] + sig_exp(np.float64(sbrow[g // blk]), semin)[1]
        E = e if e > E else E
    S = trunc_int(math.ldexp(sc, frac + ec - E))
    for g in range(k0, k1, GROUP):
        G = 0.0
        for k in range(g, min(g + GROUP, k1)):
            G += np.float64(arow[k]) * np.float64(brow[k])  # exact: multiples of 1/4 below 2**12
        s0, e0 = sig_exp(np.float64(sarow[g // blk]), semin)
        s1, e1 = sig_exp(np.float64(sbrow[g // blk]), semin)
        S += trunc_int(math.ldexp(G * s0 * s1, frac + e0 + e1 - E))
    return truncate_fp32(math.ldexp(np.float64(S), E - frac), prm[OUT_MAN])


@njit
def _amd_part(arow, brow, k0, k1, stride, emin, frac):
    """(S, E): products k0, k0+stride, ... < k1 aligned to their largest exponent E and truncated to frac
    bits below it, summed (S in units of 2**(E - frac)); (0, LOWEST) for no products."""
    E = LOWEST
    for k in range(k0, k1, stride):
        e = sig_exp(np.float64(arow[k]), emin)[1] + sig_exp(np.float64(brow[k]), emin)[1]
        E = e if e > E else E
    S = np.int64(0)
    for k in range(k0, k1, stride):
        sa, ea = sig_exp(np.float64(arow[k]), emin)
        sb, eb = sig_exp(np.float64(brow[k]), emin)
        S += trunc_int(math.ldexp(sa * sb, frac + ea + eb - E))
    return S, E


@njit
def amd_two_stage(arow, brow, sarow, sbrow, k0, k1, c, prm):
    """One AMD CDNA3 step (``emunum.mad.mma``'s AMD datapath): products truncated and summed (in two
    interleaved halves for fp8, floored onto a common exponent), the sum floored to 31 bits and c to 24
    bits below the larger of the two exponents, added, rounded to fp32 to nearest-even."""
    sp = special_sum(arow, brow, sarow, sbrow, k0, k1, c, prm)
    if not math.isfinite(sp):
        return sp
    pinf = False
    ninf = False
    for k in range(k0, k1):
        p = np.float64(arow[k]) * np.float64(brow[k])
        if p >= TWO128:
            pinf = True
        elif p <= -TWO128:
            ninf = True
    if pinf or ninf:
        return math.nan if (pinf and ninf) else (math.inf if pinf else -math.inf)
    emin = prm[EL_EMIN]
    frac = prm[FRAC]
    if prm[PAIRS] == 1:
        S0, E0 = _amd_part(arow, brow, k0, k1, 2, emin, frac)
        S1, E1 = _amd_part(arow, brow, k0 + 1, k1, 2, emin, frac)
        E = E0 if E0 > E1 else E1
        S = (floor_int(math.ldexp(np.float64(S0), E0 - E)) if E0 > LOWEST else 0) + \
            (floor_int(math.ldexp(np.float64(S1), E1 - E)) if E1 > LOWEST else 0)
    else:
        S, E = _amd_part(arow, brow, k0, k1, 1, emin, frac)
    sc, ec = sig_exp(np.float64(c), FP32_EMIN)
    M = E if E > ec else ec
    # S is in units of 2**(E - frac); floor it to 31 fraction bits at M (frac <= 31)
    s = floor_int(math.ldexp(np.float64(S), 31 - frac + E - M)) if E > LOWEST else np.int64(0)
    if prm[PAIRS] == 1 and ec < M - 25:
        cs = np.int64(0)
    else:
        cs = floor_int(math.ldexp(sc, 24 + ec - M))
    v = math.ldexp(np.float64(s), M - 31) + math.ldexp(np.float64(cs), M - 24)  # exact: < 2**40 units
    return np.float64(np.float32(v))


@njit
def step(arow, brow, sarow, sbrow, k0, k1, c, prm):
    """One instruction step on products k0..k1-1 of row arow / column brow with accumulator c."""
    kind = prm[KIND]
    if kind == NV_FUSED:
        return nv_fused(arow, brow, sarow, sbrow, k0, k1, c, prm)
    if kind == NV_GROUPS:
        return nv_groups(arow, brow, sarow, sbrow, k0, k1, c, prm)
    return amd_two_stage(arow, brow, sarow, sbrow, k0, k1, c, prm)


@njit
def dot(arow, brow, sarow, sbrow, K, c, prm):
    """The instruction applied along K in steps of TERMS products, each step's result the next step's c."""
    n = prm[TERMS]
    acc = np.float64(c)
    for k0 in range(0, K, n):
        acc = step(arow, brow, sarow, sbrow, k0, min(K, k0 + n), acc, prm)
    return acc
