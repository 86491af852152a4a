"""4/6 selection rounded stochastically: the float32 fast path of the NVFP4-family CPU kernel (kernels/nvfp4_cpu.py)
for float32 data with an e2m1 element, the same bits as the scalar core (kernels/nvfp4_scalar.py's ``fos_block``,
tests/kernels/test_nvfp4_fos_sr.py compares them). Arrays and block order as kernels/nvfp4_fast.py's ``fos_range``.
Blocks of 16 columns whose scale format passes ``nvfp4_fos_fast.scale32_ok`` take that module's lanes kernel
instead (the same bits, blocks side by side); this block loop serves the rest and its fallbacks.

**One random word per element.** The scalar core draws ``random_bits(key, flat index, nbits)`` for an element
three times (each candidate's error term, and the store), the same word each time; here it is drawn once into a
block buffer and used for both candidates, and the kept candidate's rounded values are stored without rounding
again (a row of a tile whose gds differs from the first row's, which rounded the errors, is rounded again with
its own encode scale and the buffered words).

**Stochastic e2m1 by integer steps (``sr_e2m1``).** The scalar core rounds v = float64(float32(x * enc)) by
``round_float_value_sat`` (e2m1: man 1, emin 0, subnormals, max 6): with e = v's exponent, the quantum is
h = 2**(max(e, 0) - 1), k = floor(|v| / h), r = |v| / h - k, and k + 1 is taken iff RNE(r * 2**nbits) + rnd
>= 2**nbits (``round_fixed_value``'s stochastic branch; every step exact in float64), then +-(k or k + 1) * h
saturated to 6. For a float32 w = |v| = M * 2**(E - 23) (M its 24-bit significand, E >= -126) that is: h =
2**(E - 1) for E >= 0, else 0.5; |v| / h = M / 2**s with s = 22 for E >= 0, else 22 - E (<= 148); so k * h is w
with its low s significand bits cleared (0 where s >= 24), rem = M mod 2**s, and RNE(r * 2**nbits) = D =
rem << (nbits - s) where s <= nbits, else rem >> (s - nbits) rounded to nearest-even (0 where s - nbits > 24,
as rem < 2**24: the shift is clamped to 31). D + rnd >= 2**nbits is D > (2**nbits - 1) ^ rnd (rnd < 2**nbits).
w >= 6 (inf too) gives 6 either way: k * h + h is at least 6 there, and the sum is clamped to 6. Rounding is
symmetric in sign, so (as for round to nearest, kernels/nvfp4_fast.py's module doc) the error terms are
functions of |x| and the word alone, and the stored value takes x's sign where q != 0 or the element has -0.

The encode scales must be positive (every F32(S * gds) finite: ``nvfp4_cpu.fos_sr_ok``), so that |x| * enc is
never NaN. The dequantised values and error terms are the scalar core's float32 expressions.
"""

import numpy as np
from numba import njit

from . import _cache, block_fast, nvfp4_fast, scalar
from .block_fast import ABS
from .nvfp4_fast import CHUNK, _join, _split_constants, _tree, block_candidates, store_row
from .nvfp4_scalar import F32, _encode_scale
from .scalar.common import random_bits

_cache.guard(__file__, [*scalar.SOURCES, block_fast.__file__,
                        __file__.replace("nvfp4_fos_sr.py", "nvfp4_fast.py"),
                        __file__.replace("nvfp4_fos_sr.py", "nvfp4_scalar.py")])

U32 = np.uint32
U64 = np.uint64


@njit(inline="always", error_model="numpy")
def sr_e2m1(w, rnd, nbits, mask):
    """Stochastic e2m1 of a float32 w >= 0 or inf with the word rnd < 2**nbits (uint32; mask = 2**nbits - 1,
    uint32): the scalar core's ``round_float_value_sat(float64(w), 1, 0, 1, 6, ..., STOCHASTIC, rnd, nbits)``
    (module doc). Every step in uint32 (each result cut to 32 bits, which numba's uint64 arithmetic would not
    be), so that a vector holds 8 lanes."""
    one = U32(1)
    nb = U32(nbits)
    u = F32(w).view(U32)
    eb = U32(u >> U32(23))
    s = U32(22) if eb >= U32(127) else U32(U32(149) - U32(max(eb, one)))
    mm = U32(U32(u & U32(0x7FFFFF)) | (U32(0x800000) if eb > U32(0) else U32(0)))
    low = U32(U32(one << U32(min(s, U32(31)))) - one)
    rem = U32(mm & low)
    qlow = U32(u & U32(low ^ U32(0xFFFFFFFF))) if s < U32(24) else U32(0)
    h = U32(U32(eb - one) << U32(23)) if eb >= U32(127) else U32(0x3F000000)
    rs = U32(min(U32(s - nb), U32(31))) if s > nb else one
    qq = U32(rem >> rs)
    rr = U32(rem & U32(U32(one << rs) - one))
    hh = U32(one << U32(rs - one))
    dn = U32(qq + (one if (rr > hh) | ((rr == hh) & (U32(qq & one) != U32(0))) else U32(0)))
    d = U32(rem << U32(nb - s)) if s <= nb else dn
    up = d > U32(mask ^ rnd)
    q = F32(U32(qlow).view(np.float32) + (U32(h).view(np.float32) if up else F32(0.0)))
    return min(q, F32(6.0))


@njit(inline="always", error_model="numpy")
def _terms(bits, start, size, off, enc6, enc4, s6, s4, a0, denom, metric, nbits, mask, rb, q6, q4, e6, e4):
    """For elements start..start+size-1 at off..: rb their words, q6/q4 e2m1 of |x| * enc under each candidate,
    e6/e4 the error terms (|d|, or d * d for MSE)."""
    for k in range(size):
        a = U32(bits[U64(start + k)] & ABS).view(np.float32)
        rnd = rb[U64(off + k)]
        v6 = sr_e2m1(F32(a * enc6), rnd, nbits, mask)
        v4 = sr_e2m1(F32(a * enc4), rnd, nbits, mask)
        d6 = abs(F32(F32(F32(F32(v6 * s6) * a0) / denom) - a))
        d4 = abs(F32(F32(F32(F32(v4 * s4) * a0) / denom) - a))
        q6[U64(off + k)] = v6
        q4[U64(off + k)] = v4
        e6[U64(off + k)] = F32(d6 * d6) if metric == 1 else d6
        e4[U64(off + k)] = F32(d4 * d4) if metric == 1 else d4


@njit(inline="always", error_model="numpy")
def _sums(e6, e4, off, size, metric):
    """Both candidates' errors of size terms from off, each added in element order (or their max): the two
    chains in one loop, so that each one's latency hides the other's."""
    err6 = F32(0.0)
    err4 = F32(0.0)
    for k in range(size):
        err6 = _join(err6, e6[U64(off + k)], metric)
        err4 = _join(err4, e4[U64(off + k)], metric)
    return err6, err4


@njit(error_model="numpy")
def _fos_sr_chunk(bits, dbits, sc, nbr, nbc, R, C, tr, tc, ges, gds, gamax, denom, metric, negzero, s_max,
                  s_split, s_magic, s_min_normal, key, nbits, b0, b1, rb, q6, q4, e6, e4, r6, r4):
    """Blocks b0..b1-1 (module doc); rb: uint32, q6, q4, e6, e4: float32 buffers of tr * tc; r6, r4 of 16."""
    mask = U32((1 << nbits) - 1)
    for b in range(b0, b1):
        row0, rows, c0, size, nan, s6, s4, g0, a0 = block_candidates(b, bits, dbits, sc, nbr, nbc, R, C, tr, tc, ges,
                                                                     gds, gamax, s_max, s_split, s_magic, s_min_normal)
        if nan:
            continue
        enc6 = _encode_scale(s6, g0)
        enc4 = _encode_scale(s4, g0)
        for i in range(rows):
            start = (row0 + i) * C + c0
            for k in range(size):
                rb[U64(i * tc + k)] = U32(random_bits(key, U64(start + k), nbits))
            _terms(bits, start, size, i * tc, enc6, enc4, s6, s4, a0, denom, metric, nbits, mask, rb, q6, q4, e6,
                   e4)
        if tr == 1:
            err6, err4 = _sums(e6, e4, 0, size, metric)
        else:
            for i in range(16):
                r6[i], r4[i] = _sums(e6, e4, i * tc, size, metric) if i < rows else (F32(0.0), F32(0.0))
            err6 = _tree(r6, metric)
            err4 = _tree(r4, metric)
        keep4 = err4 < err6  # a tie keeps S6
        s = s4 if keep4 else s6
        sc[U64(b)] = s
        qb = q4 if keep4 else q6
        for i in range(rows):
            g = gds[U64(row0 + i)]
            full = np.float64(s) * np.float64(g)
            start = (row0 + i) * C + c0
            if g != g0:  # the row's own encode scale, as the scalar core's (no preset makes gds vary in a tile)
                enc = _encode_scale(s, g)
                for k in range(size):
                    a = U32(bits[U64(start + k)] & ABS).view(np.float32)
                    qb[U64(i * tc + k)] = sr_e2m1(F32(a * enc), rb[U64(i * tc + k)], nbits, mask)
            store_row(bits, dbits, qb, i * tc, start, size, full, negzero)


@njit(cache=True, nogil=True, error_model="numpy")
def fos_sr_range(c0, c1, bits, dbits, scales, R, C, tr, tc, ges, gds, gamax, denom, metric, negzero, s_man, s_emin,
                 s_sub, s_max, key, nbits):
    """4/6 selection rounded stochastically, chunks c0..c1-1 of CHUNK blocks (``chunks``) of tr x tc (tr 1 or 16)
    of (P, R, C) float32 data (module doc): bits, dbits the uint32 views of src and dst (flat); scales (P, nbr,
    nbc) float64; key uint64. One kernel for the serial call and for each thread's share (``threads.launch``):
    a block's operations depend on its index only."""
    s_split, s_magic, s_min_normal = _split_constants(s_man, s_emin, s_sub)
    nbr, nbc, nb = scales.shape[1], scales.shape[2], scales.size
    rb = np.empty(tr * tc, np.uint32)
    q6, q4 = np.empty(tr * tc, np.float32), np.empty(tr * tc, np.float32)
    e6, e4 = np.empty(tr * tc, np.float32), np.empty(tr * tc, np.float32)
    r6, r4 = np.zeros(16, np.float32), np.zeros(16, np.float32)
    sc = scales.reshape(-1)
    for ch in range(c0, c1):
        _fos_sr_chunk(bits, dbits, sc, nbr, nbc, R, C, tr, tc, ges, gds, gamax, denom, metric, negzero, s_max,
                      s_split, s_magic, s_min_normal, key, nbits, ch * CHUNK, min(ch * CHUNK + CHUNK, nb), rb, q6,
                      q4, e6, e4, r6, r4)


def chunks(scales) -> int:
    """The number of chunks of CHUNK blocks (``fos_sr_range``'s work items) of a scales array."""
    return nvfp4_fast.chunks(scales.size)
