"""Multi-term (tensor-core) GEMM with toward-zero alignment in float64, vectorised across output columns.

The datapath is ``emunum.mad.unit``'s (steps of n products, exponent E, alignment to the quantum 2**(E-p) by
truncation, optional carry wrap, one rounding to acc_fmt per step); this kernel gives ``gemm_multiterm.gemm``'s
bits for fused units with ``align_rounding=toward_zero`` and ``align_bits`` p in 0..40, on operands and C in
the range below (``applies``). Operands come packed by ``gemm_pack`` (A rows, B column tiles of TN columns,
and each operand's 2**ea, ea = max(floor(log2|x|), in_emin), 0 for a zero).

Exactness. Operands are finite float32 values, so for a nonzero operand 2**-149 <= |x| < 2**(ea+1) with
-149 <= ea <= 127, and a product ab is exact in binary64 with 2**-298 <= |ab| < 2**(ea+eb+2).
  1. Step exponent: 2**(ea+eb) = PA*PB is an exact product of powers of two (2**-298 .. 2**254); its maximum
     over the step's products (0 for a zero product: ab != 0 iff PA*PB != 0; taken on the int64 bits, which
     order non-negative binary64 values), then with 2**max(floor(log2|c|), c_emin) (the exponent bits of c, a
     normal binary64 or 0, see below) and 2**align_floor, is 2**E.
  2. Alignment: scale = 2**(p-E), formed on the exponent field (bits (2046 + p) * 2**52 - bits(2**E)), is a
     normal power of two (-1000 <= E - p <= 298 + 40). The term's aligned
     magnitude is t = (ab) * scale: if |t| >= 1 it lies in [1, 2**(p+2)) and the scaling is exact (no
     over- or underflow), so trunc(t) is the truncated integer; if |t| < 1, the computed product (rounded
     only if it underflows) is still below 1 in magnitude, so trunc gives +-0, the right integer. Same for c
     (|c * scale| < 2**(p+1) since E >= floor(log2|c|)).
  3. The sum s of at most n + 1 <= 257 integers below 2**(p+2) <= 2**42 is below 2**51: every float64
     partial sum is exact. s starts at +0 + trunc(c*scale), so an exact zero sum is +0, as in ``fused_step``.
  4. Carry wrap: ``fused_step``'s own float formula on the same s. v = s * 2**(E-p) is exact (2**-338 <=
     2**(E-p), |v| < 2**1012).
  5. Rounding to acc_fmt (a float format with subnormals, toward zero or nearest-even, >= 1 mantissa bit):
     with q = 2**(max(floor(log2|v|), emin) - man) (exponent-field arithmetic on v's bits; q and 1/q normal
     by ``applies``), x = v / q is exact and |x| < 2**(man+1); trunc(x) (toward zero) or rint(x) (nearest,
     ties to even: x's parity is the significand's last bit) times q is the rounded value. A result of 0 or
     above the format's largest value, another mode or format, and a non-finite accumulator (a previous
     step's overflow) go to the bit-exact ``round_value`` instead (``fused_step``'s own calls).
The range conditions (``applies``): C finite with every nonzero |c| in [2**-1000, 2**1000]; acc_fmt's values in
the same range (smallest subnormal >= 2**-1000, largest < 2**1000), so every accumulator value is 0 or a
normal binary64 and E <= 1000; p <= 40 (``MADUnit``'s own bound). Otherwise ``gemm_multiterm`` runs its
integer or general kernel.
Promotion (``promote``) and bias (``add_round``) are the shared scalar cores, per element. Tiles (b, TM rows,
TN columns) run in parallel; every element is computed alone in increasing k, so bits never depend on threads.
"""
import math

import numpy as np
from numba import njit, prange

from . import _cache, gemm_pack, gemm_scalar, multiterm_scalar, scalar

_cache.guard(__file__, [*scalar.SOURCES, gemm_scalar.__file__, multiterm_scalar.__file__, gemm_pack.__file__])

from .gemm_pack import TN  # noqa: E402
from .gemm_scalar import (  # noqa: E402
    P_EMIN, P_KIND, P_MAN, P_MAXBITS, P_MODE, P_SUB, S_BIAS, add_round, bits_f64, f64_bits, round_value,
)
from .multiterm_scalar import (  # noqa: E402
    NO_FLOOR, T_AMODE, T_C_EMIN, T_CARRY, T_FLOOR, T_FUSED, T_KIND, T_P, T_PROMOTE, T_TERMS, is_promotion_point,
    promote,
)

TM = 16         # rows per tile: they share the tile's B block while it is in L1/L2
KB_TARGET = 64  # products per K block (a multiple of n): the block of B and 2**eb (2 x KB x TN x 8 bytes) stays in L2
EXP = np.uint64(0x7FF0000000000000)
_TOWARD_ZERO, _NEAREST = 2, 0
LIMIT = 2.0**1000


def applies(prm, accp, C) -> bool:
    """Whether this kernel reproduces ``gemm_multiterm.gemm``'s bits (module docstring): fused multi-term,
    toward-zero alignment, 0 <= p <= 40, acc_fmt a float format within 2**+-1000, C finite within 2**+-1000."""
    if prm[T_KIND] != 0 or prm[T_FUSED] != 1 or prm[T_AMODE] != _TOWARD_ZERO or not 0 <= prm[T_P] <= 40:
        return False
    if accp[P_KIND] != 0 or accp[P_EMIN] - accp[P_MAN] < -1000 or bits_f64(np.uint64(accp[P_MAXBITS])) >= LIMIT:
        return False
    a = np.abs(C)
    return bool(np.all(np.isfinite(C)) and np.all((a == 0) | ((a >= 2.0**-1000) & (a <= LIMIT))))


def fast_rounding(accp) -> bool:
    """Whether acc_fmt takes the vector rounding of step 5 (else ``round_value`` per element)."""
    return accp[P_SUB] != 0 and accp[P_MODE] in (_TOWARD_ZERO, _NEAREST) and accp[P_MAN] >= 1


@njit(cache=True, parallel=True)
def gemm(A, PA, B, PB, bA, bB, C, bias, has_bias, out, prm, accp, outerp, keys, nbits, fast):
    """out[b, i, j] = the multi-term datapath's d for row A[(b % bA)*M + i] and column j of tile B[b % bB]
    (``gemm_pack`` layouts), c = C[b, i, j], + bias last; fast: ``fast_rounding(accp)``."""
    nb, M, N = out.shape
    K = A.shape[1]
    n = prm[T_TERMS]
    p = prm[T_P]
    carry = prm[T_CARRY]
    floorpow = math.ldexp(1.0, prm[T_FLOOR]) if prm[T_FLOOR] != NO_FLOOR else 0.0
    cminpow = math.ldexp(1.0, prm[T_C_EMIN])
    twomp = math.ldexp(1.0, -p)
    wm = math.ldexp(1.0, 3 + carry + p) if carry >= 0 else 0.0
    man = accp[P_MAN]
    eminb = np.uint64(accp[P_EMIN] + 1023) << np.uint64(52)
    manb = np.uint64(man) << np.uint64(52)
    invb = np.uint64(2046) << np.uint64(52)
    scb = np.uint64(2046 + p) << np.uint64(52)
    maxv = bits_f64(np.uint64(accp[P_MAXBITS]))
    nearest = accp[P_MODE] == _NEAREST
    slow = not fast
    kb = n * max(1, KB_TARGET // n)
    tj = B.shape[1]
    ti = (M + TM - 1) // TM
    for t in prange(nb * ti * tj):
        b = t // (ti * tj)
        it = (t // tj) % ti
        jt = t % tj
        i0 = it * TM
        mi = min(TM, M - i0)
        j0 = jt * TN
        nj = min(TN, N - j0)
        bb = b % bB
        acc = np.zeros((TM, TN))
        outer = np.zeros((TM, TN))
        mxi = np.empty(TN, np.int64)
        sc = np.empty(TN)
        inv = np.empty(TN)
        s = np.empty(TN)
        cold = np.empty(TN)
        nz = np.empty(TN, np.bool_)
        bad = np.empty(TN, np.bool_)
        for ii in range(mi):
            for jj in range(nj):
                acc[ii, jj] = C[b, i0 + ii, j0 + jj]
        for kb0 in range(0, K, kb):
            kb1 = min(K, kb0 + kb)
            for ii in range(mi):
                ia = (b % bA) * M + i0 + ii
                x = acc[ii]
                for k0 in range(kb0, kb1, n):
                    k1 = min(kb1, k0 + n)
                    # 1. step exponent 2**E per column (mxi: bits of the largest 2**(ea+eb) of a nonzero product)
                    # (on the bits: non-negative binary64 values are ordered as their int64 bits; this
                    # arithmetic max vectorises where a compare-and-select does not)
                    for jj in range(TN):
                        mxi[jj] = 0
                    for k in range(k0, k1):
                        pa = PA[ia, k]
                        if pa == 0.0:
                            continue
                        for jj in range(TN):
                            d = np.int64(f64_bits(pa * PB[bb, jt, k, jj])) - mxi[jj]
                            mxi[jj] += d & ~(d >> 63)
                    # 2. scale 2**(p-E) and c's aligned integer (branch-free: selects)
                    for jj in range(TN):
                        c = x[jj]
                        cold[jj] = c
                        cnz = c != 0.0
                        cp = bits_f64(f64_bits(c) & EXP)
                        cp = cp if cp > cminpow else cminpow
                        cp = cp if cnz else 0.0
                        mp = bits_f64(np.uint64(mxi[jj]))
                        m = mp if mp > cp else cp
                        m = m if m > floorpow else floorpow
                        z = (mp > 0.0) | cnz
                        nz[jj] = z
                        m = m if z else 1.0
                        sc[jj] = bits_f64(scb - f64_bits(m))  # 2**p / m on the exponent field
                        inv[jj] = m * twomp
                        s[jj] = 0.0 + np.trunc(c * sc[jj])
                    # 3. the aligned products, truncated, summed exactly
                    for k in range(k0, k1):
                        a = A[ia, k]
                        if a == 0.0:
                            continue
                        for jj in range(TN):
                            s[jj] += np.trunc(a * B[bb, jt, k, jj] * sc[jj])
                    # 4.-5. carry wrap, v = s * 2**(E-p), rounding to acc_fmt
                    if wm != 0.0:
                        h = 0.5 * wm
                        for jj in range(TN):
                            sv = s[jj]
                            s[jj] = sv + h - wm * math.floor((sv + h) / wm) - h
                    nbad = 0
                    for jj in range(TN):
                        v = s[jj] * inv[jj]
                        qb = f64_bits(v) & EXP
                        qb = (qb if qb > eminb else eminb) - manb
                        y = v * bits_f64(invb - qb)
                        y = np.rint(y) if nearest else np.trunc(y)
                        r = y * bits_f64(qb)
                        c = cold[jj]
                        z = nz[jj]
                        bd = z & ((r == 0.0) | (abs(r) > maxv) | (c - c != 0.0) | slow)
                        bad[jj] = bd
                        nbad += bd
                        x[jj] = r if z else 0.0
                    if nbad > 0:
                        for jj in range(TN):
                            if bad[jj]:  # fused_step's own roundings (c non-finite: round_acc(c))
                                c = cold[jj]
                                x[jj] = round_value(s[jj] * inv[jj] if c - c == 0.0 else c, accp, np.uint64(0), 32)
                    if is_promotion_point(k1, K, prm):
                        for jj in range(TN):
                            outer[ii, jj] = promote(outer[ii, jj], x[jj], outerp)
                            x[jj] = 0.0
        for ii in range(mi):
            for jj in range(nj):
                i = i0 + ii
                o = (b * M + i) * N + j0 + jj
                if prm[T_PROMOTE] > 0:
                    y = outer[ii, jj]
                    if has_bias:
                        y = add_round(y, bias[b, i, j0 + jj], outerp, keys[S_BIAS], o, nbits)
                elif has_bias:
                    y = add_round(acc[ii, jj], bias[b, i, j0 + jj], accp, keys[S_BIAS], o, nbits)
                else:
                    y = acc[ii, jj]
                out[b, i, j0 + jj] = y
