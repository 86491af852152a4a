"""Approximate products for MAD units (``emunum.mad.multiplier``), shared by the CPU and CUDA kernels.

Signature-less ``@njit`` functions on binary64 values; integer bit manipulation on the binary64 encoding so
every result is exact (operands are float32-representable: normal in binary64, significands of <= 24 bits).
Parameter tuple ``prm`` (``Multiplier.kernel_args``):
  M_KIND (0 exact, 1 table, 2 mitchell, 3 truncated, 4 drum, 5 function), M_BITS (t, k or table bits),
  M_OKIND (drum operand format: 0 float / 1 fixed), M_MAN, M_EMIN (float), M_FRAC (fixed),
  unused, M_WIDTH (table: 2**k).
Table kind: the operands a and b are their codes (``Multiplier.encode_operands``, exact in float32; NaN for a
NaN operand) and ``lut`` holds the flat 2**k x 2**k products; other kinds ignore ``lut``.
"""
import math

import numpy as np
from numba import njit

from .gemm_scalar import add_round, round_draw

from .abi import M_BITS, M_EMIN, M_FRAC, M_KIND, M_MAN, M_OKIND, M_UNUSED, M_WIDTH  # noqa: F401
K_EXACT, K_TABLE, K_MITCHELL, K_TRUNCATED, K_DRUM, K_FUNCTION = range(6)
FRAC_MASK = np.int64((1 << 52) - 1)
HIDDEN = np.int64(1 << 52)


@njit
def _split(x):
    """|x| = 2**e * (1 + F / 2**52) for a finite nonzero x that is normal in binary64: (e, F)."""
    u = np.float64(x).view(np.int64) & np.int64(0x7FFFFFFFFFFFFFFF)
    return (u >> np.int64(52)) - np.int64(1023), u & FRAC_MASK


@njit
def _pow2(e):
    """2.0**e for -1022 <= e <= 1023, built from its bits (numba's math.ldexp calls libm, which CPU caching and
    CUDA do not take)."""
    return np.int64((np.int64(e) + np.int64(1023)) << np.int64(52)).view(np.float64)


@njit
def _truncated(x, t):
    e, f = _split(x)
    if t < 52:
        f = f & ~((np.int64(1) << np.int64(52 - t)) - np.int64(1))
    return np.float64(HIDDEN | f) * _pow2(e - 52)


@njit
def _drum(x, k, prm):
    """DRUM's operand: the k bits from the leading one of the integer x / quantum, last kept bit set to 1."""
    e, f = _split(x)
    if prm[M_OKIND] == 0:
        qe = max(e, np.int64(prm[M_EMIN])) - prm[M_MAN]
    else:
        qe = np.int64(-prm[M_FRAC])
    if e - qe + 1 <= k:  # the integer has at most k bits: used as is
        return x
    s = (HIDDEN | f) >> np.int64(53 - k)
    return np.float64(s | np.int64(1)) * _pow2(e - k + 1)


@njit
def approx_product(a, b, prm, lut, fn):
    """The product of a and b (binary64 values of float32 operands) by the multiplier of ``prm``; fn: the user
    function (kind function), else None."""
    a = np.float64(a)
    b = np.float64(b)
    kind = prm[M_KIND]
    if kind == K_EXACT:
        return a * b
    if kind == K_FUNCTION:
        if fn is None:  # fn None: kernels for the other kinds (numba prunes this branch; no function object)
            return math.nan
        return np.float64(fn(a, b))
    if kind == K_TABLE:
        if a != a or b != b:
            return a * b  # NaN
        return lut[np.int64(a) * prm[M_WIDTH] + np.int64(b)]
    if a == 0.0 or b == 0.0 or not (math.isfinite(a) and math.isfinite(b)):
        return a * b
    neg = (a < 0.0) != (b < 0.0)
    if kind == K_MITCHELL:
        ea, fa = _split(a)
        eb, fb = _split(b)
        s = fa + fb
        if s < HIDDEN:
            r = np.float64(HIDDEN + s) * _pow2(ea + eb - 52)
        else:
            r = np.float64(s) * _pow2(ea + eb - 51)
    elif kind == K_TRUNCATED:
        r = _truncated(a, prm[M_BITS]) * _truncated(b, prm[M_BITS])
    else:  # K_DRUM
        r = _drum(abs(a), prm[M_BITS], prm) * _drum(abs(b), prm[M_BITS], prm)
    return -r if neg else r


@njit
def mac_product(prod, acc, fused, mulp, accp, key_mul, key_acc, index, nbits):
    """``gemm_scalar.mac`` with the product given: round_acc(p + acc) if fused, else round_acc(round_mul(p) + acc)."""
    if fused == 0:
        prod = round_draw(prod, mulp, key_mul, index, nbits)
    return add_round(prod, acc, accp, key_acc, index, nbits)
