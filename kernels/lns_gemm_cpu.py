"""Numba CPU GEMM for logarithmic numbers (``emunum.mad.lns_matmul``): exact LNS products, accumulation in
k order with an exact-rounded or a Mitchell LNS addition. CPU only (``prange`` over output rows; each output
element is one serial loop over k, so the bits never depend on the thread count).

Operands come as (cls, k) pairs: cls 0 zero, 1 positive, 2 negative, 3 NaN; k the exponent code (used when
cls is 1 or 2). ``vtab`` is ``LogFormat.to_kernel_args().table``; ``mtab[d]`` the Mitchell term
round(F * 2**(-d/F)) for d < dtie = F*(frac_bits+1) (d = dtie is the one tie, F*2**-d/F = 1/2)."""
import math

import numpy as np
from numba import njit, prange

from . import _cache, parallel as _parallel, scalar
from .abi import read_only

_cache.guard(__file__, scalar.SOURCES)

from .scalar import NEAREST, round_log_value  # noqa: E402

EXACT, MITCHELL = 0, 1


@njit(inline="always")
def _value(k, vtab, frac_bits):
    F = 1 << frac_bits
    return math.ldexp(vtab[2 * F + (k & (F - 1))], int(k >> frac_bits))


@njit(inline="always")
def _mitchell(acck, accneg, kp, pneg, mtab, dtie, kmin, kmax):
    """(zero, k, neg) of the Mitchell sum of nonzero +-2**(acck/F) and +-2**(kp/F)."""
    hi = max(acck, kp)
    d = hi - min(acck, kp)
    same = accneg == pneg
    if not same and d == 0:
        return True, 0, False
    neg = accneg if acck >= kp else pneg
    if d == dtie:  # F*t = 1/2: ties to the even exponent
        if (hi & 1) == 0:
            r = hi
        else:
            r = hi + 1 if same else hi - 1
    else:
        n = mtab[d] if d < dtie else 0
        r = hi + n if same else hi - n
    if r > kmax:
        r = kmax
    if r < kmin:
        return True, 0, False
    return False, r, neg


@njit(cache=True, parallel=True)
def lns_gemm(ca, ka, cb, kb, out, vtab, frac_bits, kmin, kmax, signed, add, mtab, dtie):
    M, K = ca.shape
    N = cb.shape[1]
    for i in prange(M):
        for j in range(N):
            nan = False
            accv = 0.0  # exact: the accumulator's float64 value
            accz, acck, accneg = True, np.int64(0), False  # mitchell: zero flag, exponent, sign
            for k in range(K):
                c1, c2 = ca[i, k], cb[k, j]
                if c1 == 3 or c2 == 3:
                    nan = True
                    break
                if c1 == 0 or c2 == 0:
                    continue
                kp = min(ka[i, k] + kb[k, j], kmax)
                if kp < kmin:
                    continue
                pneg = (c1 == 2) != (c2 == 2)
                if add == EXACT:
                    pv = _value(kp, vtab, frac_bits)
                    accv = round_log_value(accv + (-pv if pneg else pv), vtab, frac_bits, kmin, kmax, signed,
                                           0, NEAREST, np.uint64(0), 0)
                elif accz:
                    accz, acck, accneg = False, kp, pneg
                else:
                    accz, acck, accneg = _mitchell(acck, accneg, kp, pneg, mtab, dtie, kmin, kmax)
            if nan:
                out[i, j] = np.nan
            elif add == EXACT:
                out[i, j] = accv
            elif accz:
                out[i, j] = 0.0
            else:
                v = _value(acck, vtab, frac_bits)
                out[i, j] = -v if accneg else v


def run(ca, ka, cb, kb, out, vtab, frac_bits, kmin, kmax, signed, add, mtab, dtie):
    """``lns_gemm`` under the process-wide parallel lock (``kernels.parallel.exclusive``)."""
    with _parallel.exclusive():
        lns_gemm(ca, ka, cb, kb, out, vtab, np.int64(frac_bits), np.int64(kmin), np.int64(kmax), np.int64(signed),
                 np.int64(add), read_only(mtab), np.int64(dtie))
