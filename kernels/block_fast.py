"""Float32 fast paths of the block kernel (kernels/block_cpu.py): float32 data, 1-D blocks along the last axis,
a float element, round to nearest. The same bits as ``block_cpu._one_block``'s nearest branch (x / F in
float64, F the full scale, rounded to the element nearest-even and saturated, times F rounded to float32), for
the reasons below; tests/kernels/test_block_fast.py compares them with ``block_serial`` bit for bit.

Arrays are flat: ``src`` float32 and its uint32 view ``bits``, rows of C elements cut into blocks of tc (the last
of a row partial when C % tc != 0); ``scales`` float64, one per block (the same values as before). Every
block is visited with the same arguments on any thread count. The amax-scaled path (``table_*``) also takes 2-D
tiles of tr rows (nvfp4_2d; ``tile_range``): the same per-element compares, the amax over the tile's rows.

**Power-of-two scales (rules floor, ceil, even, rceil), ``pow2_*``: float32 arithmetic, 16 lanes.** F = S = 2**e
with e in [lo, hi] inside [-127, 127] (``pow2_ok``), so S and 1/S are float32 values. Every rule's unclipped
e is at least floor's (rceil's too: amax / max_e > 2**(floor(log2 amax) - emax_e - 1) by a relative margin far
above float32's rounding, as max_e <= (2 - 2**-man) * 2**emax_e), so floor's bounds below hold for all. e
comes off amax's float32 bits (rceil: off the bits of the float32 quotient amax / max_e, one correctly rounded
division, the rule's own ratio). v = x * (1/S) in float32:
- if |x / S| >= 2**-126, v == x / S exactly (a power of two only moves x's exponent, and |x / S| < 2**128:
  below 2**(emax + 1) unless e was clipped to hi); this is the float64 quotient too.
- if |x / S| < 2**-126, v is its float32 rounding, also below 2**-126 and of the same sign; both lie below
  half the element's smallest step (``pow2_ok``: emin - man > -125), so both round to a zero with x's sign.
- Veltkamp's split in float32 (c = v * split, split = 2**(23 - man) + 1; y = c - (c - v); as
  ``round_nearest_fast`` and kernels/gemm_fast.py's binary32 path) is v rounded to man + 1 significant bits,
  ties to even: the same value as the float64 split. Below 2**emin, (v + magic) - magic with magic =
  1.5 * 2**(23 + q) rounds to the quantum 2**q. A v so large that c overflows (only when |v| > 2**(104 + man),
  after clipping e to hi, or v = inf) gives y = NaN: its bits lie above max's, so it saturates, as a finite
  |y| > max does.
- saturation (min of |y|'s bits and max's) and the sign on the bits: x's sign, dropped from a zero where the
  element has no -0 (negzero 0). The result times S in float32 is the float32 rounding of the exact product:
  what the float64 product rounded to float32 gives.

**Amax scales (rule 1) with an element of seven positive values (e2m1: NVFP4; signed int4: NVINT4, below),
``table_*``: no division.** F = S * T (S: a scale-format value, s_man + 1 bits; T: the float32 tensor scale) is
exact in float64. The float64 loop rounds d = fl64(x / F): its result is V[c], c = #{i : d > M_i, or d == M_i where
the tie goes up (to the even neighbour)}, with V the element's positive values and M_i the midpoint below V[i]
(V[-1] = 0); above M_6 everything saturates to V[6] = max. Each M_i * F is exact (M_i's bits, man + 2 for a float
element, + s_man + 1 + 24 <= 53, ``table_ok``), and d compares with M_i as x / F does, so as |x| compares with M_i *
F: rounding is monotone and M_i is a float64, so only d == M_i needs a look; then |x - M_i F| <= 2**-53 M_i F, while
x and M_i F are both multiples of 2**g (g: the lower of their last-place exponents) and 2**-53 M_i F < 2**g (x has
24 bits, M_i F at most 53, M_i F a normal float64: ``table_ok``), so x == M_i F. For float32 |x| with bits a (inf
included), ``|x| > T`` is ``a > bits(RD32(T))`` and ``|x| >= T`` is ``a > bits(RU32(T)) - 1`` (RD32/RU32: the
float32 neighbours of T, no float32 between them; ``_threshold``). So an element is 7 unsigned compares against its
block's thresholds and a select among the bits of float32(V[i] * F) (the float64 loop's product rounded to float32),
with x's sign (kept also where V[i] * F underflows to a zero, as the float64 product's sign is; on a zero result
only where the element has -0). The thresholds and results depend on S alone (T is per call): ``scale_table`` makes
them once per call for every scale value, and a block looks its row up by S's bits.

**Signed int4 elements (NVINT4; ``fixed_table``) on the same path.** The float64 loop rounds y = d * 2**f (exact: no
over- or underflow near a midpoint, ``table_ok``'s range) to the nearest integer, ties to even, on |y| with x's
sign, then saturates to [-8, 7] with a +0 for zero (kernels/scalar/fixed.py; infinities saturate: +inf to 7, -inf to
-8). So V_i = i 2**-f and M_i = (i - 1/2) 2**-f (i = 1..7) with ties up where i is even, compared as above, for
either sign alike up to 7; past that the sign matters: a positive x stays at 7 (x / F >= 6.5 2**-f ... +inf), a
negative one goes to -8 where d <= -7.5 2**-f (the tie to -8, the even code). That is an eighth compare, ``bits(x) >
thr7`` with thr7 = SIGN | ``_threshold(7.5 2**-f F, up)``: unsigned, only a negative x's bits (sign bit set) can
exceed it, and they do exactly where |x| >= 7.5 2**-f F (its result float32(8 2**-f F), x's sign added as for the
others). A symmetric element has thr7 = all ones: never exceeded. It happens only where S lies below amax / (7 2**-f
T) by more than 1/15 of it (never where S is a normal e4m3 value rounded to nearest, off by at most 2**-4): a
subnormal or clipped scale (a block tiny beside the tensor's amax, an inf in the block). M_i has at most 4
significant bits (15 / 2), the bound of ``table_ok`` for every element being the bits of its midpoints, and negzero
is 0 (zero is +0, a product underflowing in float32 keeps x's sign, as the float64 product does). Unsigned and wider
fixed elements take the float64 loops.

**The amax pass, ``amax_*``.** T needs the tensor's largest finite |x| before any block is rounded. One
parallel pass over the bits finds it and keeps each block's largest |x| (from the bits: NaN > inf > finite as
unsigned ints, what the block loop would compute) in ``scales``, as float64; ``table_*`` with ``scanned`` then
starts from those instead of scanning each block again (no buffer of its own: a 4 MB one per call measured a
millisecond of page faults). A block whose max is inf or NaN has its finite max found by a second look at that
block alone.

Speed notes (measured, numba 0.68 / LLVM on AVX-512): array indices are unsigned (U64) so that LLVM sees no
negative-index wraparound, which otherwise turns contiguous loads into gathers (4x slower); the amax loops run
a variable trip count (vectorised max), the element loops of blocks that tile the rows a constant one.
"""
import functools
import math

import numpy as np
from numba import njit

from . import _cache, scalar
from .llvm_inline import inline_in_llvm
from .scalar.block import CEIL, EVEN, FLOOR, RCEIL, block_scale
from .scalar.float import round_nearest_value
from .wide import prefer_wide_vectors

_cache.guard(__file__, scalar.SOURCES)

U32 = np.uint32
U64 = np.uint64
ABS = U32(0x7FFFFFFF)
SIGN = U32(0x80000000)
INF_BITS = U32(0x7F800000)
NAN32 = U32(0x7FC00000)
CHUNK = 256  # blocks per step of the amax-scaled loop (its scales computed together, 8 per vector)
AMAX_CHUNK = 2048  # blocks per task of the amax pass


@njit(inline="always")
def _row_range(b, nbc, tc, C, tiled):
    """(start, size) of block b; ``tiled``: the blocks of tc tile the flat array (C % tc == 0)."""
    if tiled:
        return b * tc, tc
    r = b // nbc
    c0 = (b - r * nbc) * tc
    return r * C + c0, min(tc, C - c0)


@njit(inline="always")
def tile_range(b, nbr, nbc, R, C, tr, tc, full):
    """(start, row, rows, size) of block b of (P, R, C) data cut into (tr, tc) tiles, nbr x nbc per plane: the flat
    index of its first element, the flat row index (p R + r) of its first row, its row count and row length (the
    last tile of a plane's rows or columns partial); ``full``: every tile is full (R % tr == 0, C % tc == 0), so
    tile rows run on across planes and start = b tc + (b // nbc) (tr - 1) C (b tc for 1-D blocks: tr = 1)."""
    if full:
        rb = b // nbc
        return b * tc + rb * (tr - 1) * C, rb * tr, tr, tc
    per = nbr * nbc
    p = b // per
    bi = (b - p * per) // nbc
    r0 = bi * tr
    c0 = (b - p * per - bi * nbc) * tc
    return (p * R + r0) * C + c0, p * R + r0, min(tr, R - r0), min(tc, C - c0)


@njit(inline="always")
def _amax_bits(bits, start, size):
    m = U32(0)
    for k in range(size):
        m = max(m, U32(bits[U64(start + k)] & ABS))
    return m


@njit(inline="always")
def finite_max_bits(bits, start, size):
    """The largest finite |x| bits among bits[start:start + size] (0 if none)."""
    m = U32(0)
    for k in range(size):
        a = U32(bits[U64(start + k)] & ABS)
        m = max(m, a if a < INF_BITS else U32(0))
    return m


# ---- OCP (power-of-two) scales -----------------------------------------------------------------------------

@njit(inline="always")
def _pow2_scale(m, rule, emax_e, max_e, mbits, lo, hi, s_man, s_emin, s_sub, s_max, s_min):
    """``block_scale`` (a power-of-two rule) of a block whose largest |v| has float32 bits m: the exponent read
    off the bits for a normal amax (and, for rceil, a normal float32 ratio amax / max_e, divided in float32:
    one rounding of the exact quotient), block_scale itself otherwise (zero, subnormal, inf, NaN)."""
    e_field = np.int64(m >> U32(23))
    frac = m & U32(0x7FFFFF)
    ok = 0 < e_field < 255
    e = e_field - 127 - emax_e  # floor(log2 amax) - emax_e
    if rule == CEIL:
        e += np.int64(frac != U32(0))
    elif rule == EVEN:
        e += np.int64(frac >= U32((1 << 23) - (1 << (22 - mbits))))  # the significand rounded to mbits carries
    elif rule == RCEIL:
        r = np.float32(np.float32(U32(m).view(np.float32)) / np.float32(max_e)).view(U32)
        r_field = np.int64(r >> U32(23))
        ok = ok and 0 < r_field < 255
        e = r_field - 127 + np.int64((r & U32(0x7FFFFF)) != U32(0))
    if ok:
        e = min(max(e, lo), hi)
        return np.int64((e + 1023) << 52).view(np.float64)
    amax = np.float64(U32(m).view(np.float32))
    return block_scale(amax, m > INF_BITS, rule, emax_e, max_e, lo, hi, s_man, s_emin, s_sub, s_max, s_min, 1.0,
                       mbits)


@njit(inline="always")
def pow2_block(src, bits, dst, start, size, s, split, magic, min_normal, max_bits, negzero):
    """One block's elements: src[start:start+size] / s rounded to nearest on the element grid, times s, into dst
    (dst may be src; bits: src's uint32 view)."""
    inv = np.float32(1.0 / s)  # exact: s is a power of two in [2**-127, 2**127]
    full = np.float32(s)
    for k in range(size):
        u = bits[U64(start + k)]
        v = src[U64(start + k)] * inv
        c = v * split
        y = c - (c - v)
        low = (v + magic) - magic
        y = low if abs(v) < min_normal else y
        a = min(U32(np.float32(y).view(U32) & ABS), max_bits)  # NaN (c overflowed, or x was inf) -> max
        sign = u & SIGN if (a != 0) | (negzero != 0) else U32(0)
        dst[U64(start + k)] = U32(a | sign).view(np.float32) * full


@njit(inline="always")
def _pow2_blocks(b0, b1, src, bits, dst, dbits, scales, C, tc, tiled, split, magic, min_normal, max_bits, negzero,
                 emax_e, max_e, lo, hi, s_man, s_emin, s_sub, s_max, s_min, rule, mbits):
    nbc = scales.size // (src.size // C)
    for b in range(b0, b1):
        start, size = _row_range(b, nbc, tc, C, tiled)
        m = _amax_bits(bits, start, min(size, bits.size - start))  # (= size) not a constant: it vectorises
        s = _pow2_scale(m, rule, emax_e, max_e, mbits, lo, hi, s_man, s_emin, s_sub, s_max, s_min)
        scales[U64(b)] = s
        if m > INF_BITS:
            for k in range(size):
                dbits[U64(start + k)] = NAN32
        else:
            pow2_block(src, bits, dst, start, size, s, split, magic, min_normal, max_bits, negzero)


@njit(inline="always")
def _pow2_rows(b0, b1, src, bits, dst, dbits, scales, C, tc, man, emin, sub, emax_e, max_e, negzero, lo, hi, s_man,
               s_emin, s_sub, s_max, s_min, rule):
    f32 = np.float32
    split = f32(math.ldexp(1.0, 23 - man) + 1.0)
    magic = f32(1.5 * math.ldexp(1.0, 23 + (emin - man if sub != 0 else emin)))
    min_normal = f32(math.ldexp(1.0, emin))
    max_bits = f32(max_e).view(U32)
    if tc == 32 and C % 32 == 0:  # a constant trip count for the element loop: LLVM unrolls it
        _pow2_blocks(b0, b1, src, bits, dst, dbits, scales, C, 32, True, split, magic, min_normal, max_bits, negzero,
                     emax_e, max_e, lo, hi, s_man, s_emin, s_sub, s_max, s_min, rule, man)
    elif tc == 16 and C % 16 == 0:
        _pow2_blocks(b0, b1, src, bits, dst, dbits, scales, C, 16, True, split, magic, min_normal, max_bits, negzero,
                     emax_e, max_e, lo, hi, s_man, s_emin, s_sub, s_max, s_min, rule, man)
    else:
        _pow2_blocks(b0, b1, src, bits, dst, dbits, scales, C, tc, False, split, magic, min_normal, max_bits, negzero,
                     emax_e, max_e, lo, hi, s_man, s_emin, s_sub, s_max, s_min, rule, man)


@njit(cache=True, nogil=True)
def pow2_range(b0, b1, src, bits, dst, dbits, scales, C, tc, man, emin, sub, emax_e, max_e, negzero, lo, hi, s_man,
               s_emin, s_sub, s_max, s_min, rule):
    """Power-of-two scales, float32 arithmetic (module doc), blocks b0..b1-1 of ``scales.size``; dbits: dst's
    uint32 view."""
    prefer_wide_vectors()
    _pow2_rows(b0, b1, src, bits, dst, dbits, scales, C, tc, man, emin, sub, emax_e, max_e, negzero, lo, hi, s_man,
               s_emin, s_sub, s_max, s_min, rule)


def pow2_ok(args: tuple) -> bool:
    """Whether ``pow2_*`` holds for ``block_args`` (a power-of-two rule, float element): S and 1/S are float32
    values, and the element's half step lies above float32's normal range (module doc)."""
    kind, man, emin, sub, emax_e, max_e, negzero, rule, lo, hi = args[:10]
    return kind == 0 and rule in (FLOOR, CEIL, EVEN, RCEIL) and -127 <= lo and hi <= 127 and 1 <= man <= 20 and \
        emin - man > -125 and emax_e + 25 - man < 127 and float(np.float32(max_e)) == max_e


# ---- amax scales, an element of seven positive values: compares against per-block thresholds ---------------

@njit(inline="always")
def _threshold(T, up):
    """The bits h with ``a > h`` <=> ``|x| > T`` (up false) or ``|x| >= T`` (up true) for a float32 |x| of bits
    a, T > 0 (module doc)."""
    f = np.float32(T)
    h = f.view(U32)
    fd = np.float64(f)
    if up:
        return h + U32(fd < T) - U32(1)  # RU32(T) - 1
    return h - U32(fd > T)  # RD32(T)


@njit(cache=True)
def scale_table(mids, ups, vals, t, s_man, s_min, s_max):
    """(thr, val, k0): for every float64 q in [s_min, s_max] with s_man mantissa bits (the scale values, and a
    few more), at row key = (bits(q) >> (52 - s_man)) - k0, the 7 thresholds (``_threshold`` of M_i * q * t)
    and the 7 results (bits of float32(V_i * q * t)), 8 columns per row; column 7 is the negative end (an
    eighth M, V of ``table_of``): its threshold with the sign bit set, so that only a negative x's bits exceed
    it, or all ones (no x's do) where the element is symmetric."""
    sh = 52 - s_man
    k0 = np.float64(s_min).view(np.int64) >> sh
    nk = (np.float64(s_max).view(np.int64) >> sh) - k0 + 1
    thr = np.zeros(nk * 8, U32)
    val = np.zeros(nk * 8, U32)
    for k in range(nk):
        full = np.int64((k + k0) << sh).view(np.float64) * t  # exact (table_ok)
        thr[k * 8 + 7] = U32(0xFFFFFFFF)
        for i in range(mids.size):
            h = _threshold(mids[i] * full, ups[i])
            thr[k * 8 + i] = h | SIGN if i == 7 else h
            val[k * 8 + i] = np.float32(vals[i] * full).view(U32)
    return thr, val, k0


@njit(inline="always")
def _table_block(bits, dbits, start, size, thr, val, o, negzero):
    """Block [start, start + size) with the thresholds and results of table row offset o (``scale_table``)."""
    t0, t1, t2, t3, t4, t5, t6, t7 = thr[o], thr[o + U64(1)], thr[o + U64(2)], thr[o + U64(3)], thr[o + U64(4)], \
        thr[o + U64(5)], thr[o + U64(6)], thr[o + U64(7)]
    v0, v1, v2, v3, v4, v5, v6, v7 = val[o], val[o + U64(1)], val[o + U64(2)], val[o + U64(3)], val[o + U64(4)], \
        val[o + U64(5)], val[o + U64(6)], val[o + U64(7)]
    for k in range(size):
        u = bits[U64(start + k)]
        a = u & ABS
        r = v0 if a > t0 else U32(0)  # c = #{i : a > t_i} (a prefix of i), r = V[c - 1] * F
        r = v1 if a > t1 else r
        r = v2 if a > t2 else r
        r = v3 if a > t3 else r
        r = v4 if a > t4 else r
        r = v5 if a > t5 else r
        r = v6 if a > t6 else r
        r = v7 if u > t7 else r  # the negative end: x < 0 and |x| past M_7 (t7 carries the sign bit)
        dbits[U64(start + k)] = r | (u & SIGN if (a > t0) | (negzero != 0) else U32(0))


@njit(nogil=True)
def _table_blocks(c0, c1, bits, dbits, scales, scanned, R, C, tr, tc, full, thr, val, k0, negzero, max_e, s_man, s_max,
                  s_min, t, s_split, s_magic, s_min_normal):
    """In chunks of CHUNK blocks ((tr, tc) tiles, ``tile_range``): the amaxes (into ``scales``, unless the amax pass
    put them there: ``scanned``), then the scales and table rows in one vectorised loop (``block_scale``'s
    expression with Veltkamp's split, as the old fast path), then the elements, row by row."""
    inline_in_llvm()
    prefer_wide_vectors()
    nb = scales.size
    nbr = -(-R // tr)
    nbc = -(-C // tc)
    sh = 52 - s_man
    rows = np.empty(CHUNK, np.uint64)
    for ch in range(c0, c1):
        b0 = ch * CHUNK
        b1 = min(b0 + CHUNK, nb)
        if not scanned:
            for b in range(b0, b1):
                start, _, nr, size = tile_range(b, nbr, nbc, R, C, tr, tc, full)
                m = U32(0)
                for r in range(nr):
                    at = start + r * C
                    m = max(m, _amax_bits(bits, at, min(size, bits.size - at)))  # (= size) not a constant: vectorises
                scales[U64(b)] = np.float64(U32(m).view(np.float32))  # NaN where the block holds one
        for b in range(b0, b1):
            amax = scales[U64(b)]
            want = min(amax / max_e / t, s_max)
            q = max(round_nearest_value(want, s_split, s_magic, s_min_normal, s_max, s_max, 0), s_min)
            ok = amax == amax
            scales[U64(b)] = q if ok else math.nan
            rows[U64(b - b0)] = U64(((np.float64(q).view(np.int64) >> sh) - k0) * 8) if ok else U64(0)
        for b in range(b0, b1):
            start, _, nr, size = tile_range(b, nbr, nbc, R, C, tr, tc, full)
            for r in range(nr):
                if scales[U64(b)] != scales[U64(b)]:
                    for k in range(size):
                        dbits[U64(start + r * C + k)] = NAN32
                else:
                    _table_block(bits, dbits, start + r * C, size, thr, val, rows[U64(b - b0)], negzero)


@njit(inline="always")
def _table_rows(c0, c1, bits, dbits, scales, scanned, R, C, tr, tc, thr, val, k0, negzero, max_e, s_man, s_emin, s_sub,
                s_max, s_min, t):
    s_split = math.ldexp(1.0, 52 - s_man) + 1.0
    s_magic = 1.5 * math.ldexp(1.0, 52 + (s_emin - s_man if s_sub != 0 else s_emin))
    s_min_normal = math.ldexp(1.0, s_emin)
    if tr == 1 and tc == 16 and C % 16 == 0:  # a constant trip count for the element loop (~12% faster, measured)
        _table_blocks(c0, c1, bits, dbits, scales, scanned, R, C, 1, 16, True, thr, val, k0, negzero, max_e, s_man,
                      s_max, s_min, t, s_split, s_magic, s_min_normal)
    elif tr == 1 and tc == 32 and C % 32 == 0:  # NVFP4 with blocks of 32
        _table_blocks(c0, c1, bits, dbits, scales, scanned, R, C, 1, 32, True, thr, val, k0, negzero, max_e, s_man,
                      s_max, s_min, t, s_split, s_magic, s_min_normal)
    elif tr == 1 and C % tc == 0:
        _table_blocks(c0, c1, bits, dbits, scales, scanned, R, C, 1, tc, True, thr, val, k0, negzero, max_e, s_man,
                      s_max, s_min, t, s_split, s_magic, s_min_normal)
    else:  # partial 1-D blocks and every 2-D tile: the general tile loop
        _table_blocks(c0, c1, bits, dbits, scales, scanned, R, C, tr, tc, False, thr, val, k0, negzero, max_e, s_man,
                      s_max, s_min, t, s_split, s_magic, s_min_normal)


@njit(cache=True, nogil=True)
def table_range(c0, c1, bits, dbits, scales, scanned, R, C, tr, tc, thr, val, k0, negzero, max_e, s_man, s_emin, s_sub,
                s_max, s_min, t):
    """Amax scales, an element of seven positive values (module doc), on (P, R, C) data in (tr, tc) tiles (1-D
    blocks: tr = 1), scales in (P, nbr, nbc) order, chunks c0..c1-1 of CHUNK blocks (``table_chunks``);
    bits/dbits: src/dst as flat uint32; thr, val, k0: ``scale_table``; scanned: ``scales`` holds each block's amax
    (``amax_range``'s, 1-D) (else the blocks are scanned here)."""
    _table_rows(c0, c1, bits, dbits, scales, scanned, R, C, tr, tc, thr, val, k0, negzero, max_e, s_man, s_emin, s_sub,
                s_max, s_min, t)


def table_chunks(nb: int) -> int:
    """The chunks of ``table_range`` for nb blocks."""
    return -(-nb // CHUNK)


@njit(inline="always")
def _amax_blocks(c0, c1, bits, amaxes, part, C, tc, tiled):
    """Each block's largest |x| into ``amaxes`` (float64); each task's largest finite |x| bits into ``part``."""
    nb = amaxes.size
    nbc = nb // (bits.size // C)
    for ch in range(c0, c1):
        fin = U32(0)
        for b in range(ch * AMAX_CHUNK, min(ch * AMAX_CHUNK + AMAX_CHUNK, nb)):
            start, size = _row_range(b, nbc, tc, C, tiled)
            m = _amax_bits(bits, start, min(size, bits.size - start))
            amaxes[U64(b)] = np.float64(U32(m).view(np.float32))
            fin = max(fin, finite_max_bits(bits, start, size) if m >= INF_BITS else m)
        part[U64(ch)] = fin


@njit(cache=True, nogil=True)
def amax_range(c0, c1, bits, amaxes, part, C, tc):
    """Tasks c0..c1-1 of AMAX_CHUNK blocks (``part.size`` of them, ``amax_tasks``): fills ``amaxes`` (float64, one
    per block of rows of C in blocks of tc: the scales array) with each block's largest |x| (NaN where the block
    holds one) and part[c] with the bits of task c's largest finite |x| (0 if none) (module doc); the tensor's is
    part's max."""
    prefer_wide_vectors()
    if tc == 16 and C % 16 == 0:
        _amax_blocks(c0, c1, bits, amaxes, part, C, 16, True)
    elif tc == 32 and C % 32 == 0:
        _amax_blocks(c0, c1, bits, amaxes, part, C, 32, True)
    elif C % tc == 0:
        _amax_blocks(c0, c1, bits, amaxes, part, C, tc, True)
    else:
        _amax_blocks(c0, c1, bits, amaxes, part, C, tc, False)


def amax_tasks(nb: int) -> int:
    """The tasks of ``amax_range`` for nb blocks."""
    return -(-nb // AMAX_CHUNK)


@functools.lru_cache(maxsize=64)
def element_table(args: tuple):
    """(mids, ups, vals) for ``block_args[:6]`` of a float element with exactly seven positive values: the values
    V (ascending, the last one max), the midpoints M_i = (V[i-1] + V[i]) / 2 (V[-1] = 0) and whether a tie at
    M_i goes up: to the even neighbour, V[i] an even multiple of the step V[i] - V[i-1] (as Veltkamp's split and
    the subnormal magic round); None for any other element."""
    kind, man, emin, sub, emax_e, max_e = args[:6]
    if kind != 0:
        return None
    v = [k * math.ldexp(1.0, emin - man) for k in range(1, 1 << man)] if sub else []
    e = emin
    while len(v) <= 8 and e <= emax_e:
        v += [math.ldexp(1.0 + k / (1 << man), e) for k in range(1 << man)]
        e += 1
    v = [x for x in v if x <= max_e]
    if len(v) != 7 or v[-1] != max_e:
        return None
    lower = [0.0] + v[:-1]
    mids = np.array([(a + b) / 2 for a, b in zip(lower, v)])
    ups = np.array([(b / (b - a)) % 2 == 0 for a, b in zip(lower, v)])  # V[i] an even multiple of the step
    return mids, ups, np.array(v)


@functools.lru_cache(maxsize=64)
def fixed_table(args: tuple):
    """(mids, ups, vals) for ``block_args[:6]`` of a signed 4-bit fixed element (codes -8..7 times 2**-f: the only
    fixed element whose positive values are seven, 1..7 times a power of two), eight entries each: V_i = i 2**-f
    and M_i = (i - 1/2) 2**-f for i = 1..8, a tie going up where i is even (``round_fixed_value``: the magnitude
    to nearest, ties to the even code); entry 8 is the negative end, as saturation is to [-8, 7]: x / F <= -7.5
    2**-f (the tie to -8, even) gives -8 2**-f, while x / F >= 6.5 2**-f ... up to +inf gives 7 2**-f (6.5 itself
    6). None for any other element (unsigned ones: every x < 0 gives +0; other widths: not seven values)."""
    kind, frac, code_min, code_max = args[:4]
    if kind != 1 or code_min != -8 or code_max != 7:
        return None
    step = math.ldexp(1.0, -frac)
    i = np.arange(1, 9)
    return (i - 0.5) * step, i % 2 == 0, i * step


def table_of(args: tuple):
    """``table_*``'s element table for ``block_args[:6]``: ``element_table`` (float, symmetric: 7 entries) or
    ``fixed_table`` (signed int4: 7 entries and the negative end); None if neither holds."""
    return element_table(args[:6]) or fixed_table(args[:6])


def _significant_bits(v: float) -> int:
    """The significant bits of a finite float v != 0 (its odd integer part times a power of two)."""
    m = int(abs(math.frexp(v)[0]) * 2**53)
    return 53 - ((m & -m).bit_length() - 1)


def table_ok(args: tuple) -> bool:
    """Whether ``table_*`` holds for ``block_args``: amax scales into a float scale format (at most 4096 rows of
    ``scale_table``), an element of seven positive values (``table_of``), a float32 tensor scale t > 0, and every
    M_i * S * T exact and normal in float64: the bits of M_i, S and T (24) at most 53, M_0 s_min T >= 2**-1022,
    max(M, V) s_max T < 2**1023 (module doc)."""
    kind, man, emin, sub, emax_e, max_e, negzero, rule, lo, hi, s_man, s_emin, s_sub, s_max, s_min, t = args
    table = table_of(args[:6])
    if table is None or not (rule == 1 and 1 <= s_man and 0.0 < t < math.inf and float(np.float32(t)) == t
                             and 2.0**-1000 < s_min <= s_max < 2.0**1000):
        return False
    mids, ups, vals = table
    m_bits = max(_significant_bits(float(m)) for m in mids)
    if not (m_bits + s_man + 1 + 24 <= 53 and 2.0**-1022 <= mids[0] * s_min * t
            and max(mids[-1], vals[-1]) * s_max * t < 2.0**1023):
        return False
    sh = 52 - s_man
    rows = (int(np.float64(s_max).view(np.int64)) >> sh) - (int(np.float64(s_min).view(np.int64)) >> sh) + 1
    return rows <= 4096
