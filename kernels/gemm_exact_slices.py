"""Exact (Kulisch) accumulation of exact products by fixed error-free slices, vectorised across output columns.

Gives ``gemm_multiterm.gemm``'s bits for exact units with exact products (``fused``): each output is the exact
sum c + bias + sum_k a_k b_k rounded once by ``exact_result`` (C and bias enter the Kulisch limbs as there,
non-finite ones included). Here the products are first summed without error in L float64 accumulators per
output (slices), which then enter the limbs: the exact sum is the same, so the bits are.

Slices (``plan``). Operands are finite float32 values, so every product ab is exact in binary64; over the
GEMM, |ab| < 2**T with T = msb(A) + msb(B) + 2 and ab is an integer multiple of 2**lsb, lsb = lsb(A) + lsb(B)
(msb: the largest floor(log2|x|), lsb: the smallest exponent of a set significand bit, ``gemm_pack.span``).
Let 2**g >= K. With a bound |r| <= 2**U on what is left of every product (U = T first), slice s takes
    q = (sigma_s + r) - sigma_s,  r <- r - q,   sigma_s = 1.5 * 2**(b_s + 52),  b_s = max(U - 51, U + g - 53)
(Rump, Ogita and Oishi's extraction): |r| <= 2**(b_s + 51) puts sigma_s + r in [2**(b_s+52), 2**(b_s+53)],
where binary64's spacing is 2**b_s, so q is r rounded to a multiple of 2**b_s, the subtraction is exact, and
r - q is exact with |r - q| <= 2**(b_s - 1) (the next U). Slice s sums K such q, multiples of 2**b_s with
|q| <= 2**U: every partial sum is a multiple of 2**b_s below 2**(U+g) <= 2**(b_s+53), hence exact. Slices are
added while U + g > lsb + 53; the last one sums the remainders themselves, multiples of 2**lsb below 2**U,
exactly because U + g <= lsb + 53. Each slice spans 53 - g - 1 bits of the products' range T - lsb (about 43
bits for K = 512); ``plan`` gives up (None: the integer kernel runs) beyond LMAX slices. Every sigma_s and
every value is a normal binary64 (|ab| in [2**-298, 2**256)).

Flush. Where c, bias and the slices hold at most two nonzero values x, y (finite, below 2**1000), the binary64
round-to-odd of x + y is ``round_odd(two_sum(x, y))`` (TwoSum is exact without overflow; round-to-odd at 53
bits is one function of the exact value, so it equals ``kul_ro53``'s), rounded by the same ``round_draw``
``exact_result`` calls. Otherwise all of them enter the Kulisch limbs and ``exact_result``.
"""
import numpy as np
from numba import njit, prange

from . import _cache, gemm_pack, gemm_scalar, multiterm_scalar, scalar

_cache.guard(__file__, [*scalar.SOURCES, gemm_scalar.__file__, multiterm_scalar.__file__, gemm_pack.__file__])

from .gemm_pack import TN  # noqa: E402
from .gemm_scalar import S_ACC, round_draw, round_odd, two_sum  # noqa: E402
from .multiterm_scalar import NLIMB, exact_accumulate, exact_result, kul_add, kul_clear  # noqa: E402

TM = 8           # rows per tile (they share the tile's B block)
KB = 256         # products per K block: the B block (KB x TN x 8 bytes) stays in L1/L2 across the tile's rows
LMAX = 6
LIMIT = 2.0**1000  # C and bias below this take the two-term flush (no overflow in two_sum)


def plan(K, msb_a, lsb_a, msb_b, lsb_b):
    """The extraction constants sigma_s (float64 array, L - 1 of them) for K products of operands with these
    exponent spans (module docstring), or None when more than LMAX slices would be needed."""
    if msb_a < lsb_a or msb_b < lsb_b:  # an all-zero operand: every product is 0
        return np.zeros(0)
    T, lsb = msb_a + msb_b + 2, lsb_a + lsb_b
    g = max(K - 1, 0).bit_length()
    sig, U = [], T
    while U + g > lsb + 53:
        if len(sig) == LMAX - 1:
            return None
        b = max(U - 51, U + g - 53)
        sig.append(1.5 * 2.0 ** (b + 52))
        U = b - 1
    return np.array(sig, np.float64)


@njit(cache=True, parallel=True)
def gemm(A, B, bA, bB, C, bias, has_bias, out, sig, accp, keys, nbits):
    """out[b, i, j] = round_out(C[b, i, j] + bias[b, i, j] + sum_k A[(b % bA)*M + i, k] * column j of B[b % bB])
    (``gemm_pack`` layouts; bias only if has_bias), through the slices of ``plan`` (sig)."""
    nb, M, N = out.shape
    K = A.shape[1]
    L = sig.shape[0] + 1
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
        S = np.zeros((TM, L, TN))
        r = np.empty(TN)
        for kb0 in range(0, K, KB):
            kb1 = min(K, kb0 + KB)
            for ii in range(mi):
                ia = (b % bA) * M + i0 + ii
                Si = S[ii]
                for k in range(kb0, kb1):
                    a = A[ia, k]
                    if a == 0.0:
                        continue
                    if L == 1:
                        for jj in range(TN):
                            Si[0, jj] += a * B[bb, jt, k, jj]
                    elif L == 2:
                        sg = sig[0]
                        for jj in range(TN):
                            p = a * B[bb, jt, k, jj]
                            q = (sg + p) - sg
                            Si[0, jj] += q
                            Si[1, jj] += p - q
                    else:
                        for jj in range(TN):
                            r[jj] = a * B[bb, jt, k, jj]
                        for s in range(L - 1):
                            sg = sig[s]
                            for jj in range(TN):
                                q = (sg + r[jj]) - sg
                                Si[s, jj] += q
                                r[jj] -= q
                        for jj in range(TN):
                            Si[L - 1, jj] += r[jj]
        limbs = np.zeros(NLIMB, np.int64)
        for ii in range(mi):
            i = i0 + ii
            for jj in range(nj):
                o = (b * M + i) * N + j0 + jj
                c = C[b, i, j0 + jj]
                bi = bias[b, i, j0 + jj] if has_bias else 0.0
                if abs(c) < LIMIT and abs(bi) < LIMIT:  # at most two nonzero terms: two_sum, round_odd
                    x, y, cnt = 0.0, 0.0, 0
                    for s in range(-2, L):
                        v = c if s == -2 else (bi if s == -1 else S[ii, s, jj])
                        if v != 0.0:
                            if cnt == 0:
                                x = v
                            else:
                                y = v
                            cnt += 1
                    if cnt <= 2:
                        hi, lo = two_sum(x, y)
                        out[b, i, j0 + jj] = round_draw(round_odd(hi, lo), accp, keys[S_ACC], o, nbits)
                        continue
                kul_clear(limbs)
                sp, has = exact_accumulate(limbs, C[b, i, j0 + jj], 0.0, False)
                if has_bias:
                    sp, has = exact_accumulate(limbs, bias[b, i, j0 + jj], sp, has)
                for s in range(L):
                    kul_add(limbs, S[ii, s, jj])
                out[b, i, j0 + jj] = exact_result(limbs, sp, has, accp, keys[S_ACC], o, nbits)
