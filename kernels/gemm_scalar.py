"""Scalar multiply-accumulate cores, shared by the CPU (``gemm_cpu``) and CUDA (``gemm_cuda``) MAD kernels.

Signature-less ``@njit`` functions on float64 values; rounding itself is delegated to the bit-exact cores of
``kernels/scalar/`` (``round_float_bits`` on the binary64 bits, ``round_fixed_value``).

Exactness. Operands are float32-representable (the caller checks), so a product ``a * b`` of two of them is
exact in binary64 (24 + 24 <= 53 significand bits, exponents far inside binary64's range). A sum ``x + y`` is
formed exactly as the pair ``(s, e) = two_sum(x, y)`` and collapsed to ``round_odd(s, e)``, the binary64
round-to-odd of the exact sum (a sticky bit in the last place). Rounding that value to any format with at
most 51 significant bits gives the same result as rounding the exact sum, for every deterministic mode
(Boldo & Melquiond, "Emulation of FMA and correctly rounded sums: proved algorithms using rounding to odd",
IEEE TC 2008). Stochastic rounding and two's-complement wrap are defined on this binary64 value (see
``emunum.mad``).

Format parameter vectors (int64 arrays of length ``NPARAM``) carry one format and its rounding mode:
  P_KIND 0 float / 1 fixed / 8 HiFloat8 (``abi.Kind``; it reads P_OVF and P_MODE only);
  float: P_MAN, P_EMIN, P_SUB, P_MAXBITS (binary64 bits of max), P_OVF, P_NEGZERO;
  fixed: P_FRAC, P_CMIN, P_CMAX, P_SAT; both: P_MODE (rounding-mode code of ``kernels/scalar/common.py``).
Stochastic-rounding streams (index into the ``keys`` array): see ``emunum.mad``.
"""
import math

import numpy as np
from numba import njit

from .scalar import HIF8_MAX_BITS64, STOCHASTIC, random_bits, round_fixed_value, round_float_bits, round_hif8_bits

from .abi import (Kind, NPARAM, P_CMAX, P_CMIN, P_EMIN, P_FRAC, P_KIND, P_MAN, P_MAXBITS, P_MODE,  # noqa: F401
                  P_NEGZERO, P_OVF, P_SAT, P_SUB)

KIND_HIF8 = int(Kind.HIF8)  # a global int: numba freezes it as a constant

# stochastic-rounding streams: index into the keys array
S_MUL, S_ACC, S_CHUNK, S_REDUCE, S_BIAS = 0, 1, 2, 3, 4
NSTREAMS = 5
NAN = float("nan")  # the positive quiet NaN, binary64 0x7FF8000000000000 (a global: numba freezes the constant)



@njit(inline="always")
def tile_of(t, M, N, bA, bB, tm, tn):
    """Tile t of the GEMM kernels' (nb, ceil(M/tm), ceil(N/tn)) output tiles in C order: (b, i0, i1, j0, nj,
    b % bA, b % bB), its batch, rows i0..i1-1, nj columns from j0, and the batches of A and B it reads."""
    ti, tj = (M + tm - 1) // tm, (N + tn - 1) // tn
    b = t // (ti * tj)
    r = t % (ti * tj)
    i0, j0 = (r // tj) * tm, (r % tj) * tn
    return b, i0, min(i0 + tm, M), j0, min(j0 + tn, N) - j0, b % bA, b % bB


@njit
def f64_bits(x):
    return np.float64(x).view(np.uint64)


@njit
def bits_f64(u):
    return np.uint64(u).view(np.float64)


@njit
def canonical_nan(y):
    """y, or the positive quiet NaN without payload when y is a NaN (of any sign and payload): the one NaN the
    MAD datapath returns (``emunum.mad``), as the hardware's NaNs differ (x86 makes -NaN of inf - inf and
    inf * 0 and propagates an operand's payload; CUDA makes a canonical NaN). A select, no arithmetic."""
    return y if y == y else NAN


@njit
def two_sum(a, b):
    """Knuth's TwoSum: s = fl(a + b) and the exact error e = (a + b) - s (binary64, no overflow)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@njit
def round_odd(s, e):
    """The binary64 round-to-odd of the exact value s + e, where s = fl(s + e) and |e| <= ulp(s)/2.

    Exact (e == 0): s. Otherwise the one of s and its neighbour on e's side whose last bit is 1.
    Non-finite s (an infinite or NaN operand) passes through.
    """
    if e == 0.0 or not math.isfinite(s):
        return s
    u = f64_bits(s)
    if (u & np.uint64(1)) == np.uint64(0):
        if (e > 0.0) == (s > 0.0):
            u += np.uint64(1)  # away from zero
        else:
            u -= np.uint64(1)  # toward zero
    return bits_f64(u)


@njit
def round_value(x, p, rnd, nbits):
    """Round the binary64 value ``x`` to the format in parameter vector ``p`` with its mode; returns float64."""
    if p[P_KIND] == 0:
        r = round_float_bits(f64_bits(x), 63, 52, 1023, p[P_MAN], p[P_EMIN], p[P_SUB], np.uint64(p[P_MAXBITS]),
                             p[P_OVF], p[P_NEGZERO], p[P_MODE], rnd, nbits)
        return bits_f64(r)
    if p[P_KIND] == KIND_HIF8:
        return bits_f64(round_hif8_bits(f64_bits(x), 63, 52, 1023, np.uint64(HIF8_MAX_BITS64), p[P_OVF], p[P_MODE],
                                        rnd, nbits))
    return round_fixed_value(x, p[P_FRAC], p[P_CMIN], p[P_CMAX], p[P_SAT], p[P_MODE], rnd, nbits)


@njit
def round_draw(x, p, key, index, nbits):
    """``round_value`` with the random bits of counter ``index`` under ``key`` when the mode is stochastic."""
    rnd = random_bits(key, index, nbits) if p[P_MODE] == STOCHASTIC else np.uint64(0)
    return round_value(x, p, rnd, nbits)


@njit
def add_round(x, y, p, key, index, nbits):
    """round(x + y): the exact sum, rounded once to the format of ``p`` (through binary64 round-to-odd)."""
    s, e = two_sum(x, y)
    return round_draw(round_odd(s, e), p, key, index, nbits)


@njit
def mac(a, b, acc, fused, mulp, accp, key_mul, key_acc, index, nbits):
    """One multiply-accumulate step: round_acc(a*b + acc) if fused, else round_acc(round_mul(a*b) + acc).

    a, b: float32-representable (their binary64 product is exact); acc: the running value (float64).
    """
    prod = np.float64(a) * np.float64(b)
    if fused == 0:
        prod = round_draw(prod, mulp, key_mul, index, nbits)
    return add_round(prod, acc, accp, key_acc, index, nbits)


@njit
def reduce_lanes(v, lanes, accp, key, o, nbits):
    """Pairwise reduction of the lane accumulators v[0..lanes-1] in place; returns the total.

    Level by level: v[q] = round(v[2q] + v[2q+1]) for q = 0, 1, ...; an odd last lane passes up unchanged.
    The n-th addition performed (n = 0, 1, ...) draws stochastic bits at counter o * lanes + n.
    """
    n = lanes
    node = 0
    while n > 1:
        h = n // 2
        for q in range(h):
            v[q] = add_round(v[2 * q], v[2 * q + 1], accp, key, o * lanes + node, nbits)
            node += 1
        if n % 2 == 1:
            v[h] = v[n - 1]
            n = h + 1
        else:
            n = h
    return v[0]


@njit(inline="always")
def finish_row(out, src, v, b, i, j0, nj, lanes, accp, k_red, bias, has_bias, k_bias, obase, nbits):
    """out[b, i, j0 + jj] for jj < nj: the lane accumulators src[:, jj] reduced (``reduce_lanes`` at counter
    obase + jj, in the scratch array v of ``lanes``), plus bias[b, i, j0 + jj] (``add_round``) where has_bias,
    NaN as ``canonical_nan``: the last step of an output row in the tiled GEMM kernels."""
    for jj in range(nj):
        for lane in range(lanes):
            v[lane] = src[lane, jj]
        y = reduce_lanes(v, lanes, accp, k_red, obase + jj, nbits)
        if has_bias:
            y = add_round(y, bias[b, i, j0 + jj], accp, k_bias, obase + jj, nbits)
        out[b, i, j0 + jj] = canonical_nan(y)
