"""4/6 selection with the error sums vectorised across blocks (lanes = blocks): the float32 fast path of
kernels/nvfp4_fast.py (``fos_range``, whose module doc gives the element-level reasoning) for blocks of 16 columns,
the same bits (tests/kernels/test_nvfp4_fos_fast.py compares it with the scalar core, kernels/nvfp4_scalar.py).

A unit is a run of up to LANES whole blocks side by side in one row of blocks (1 row for 1-D blocks, up to 16
for 16 x 16 tiles); a call (``fos_lanes_range``) takes consecutive units, a thread one share of them. The last
block of a row of blocks when C % 16 != 0, and a unit where an encode scale is 0, run ``nvfp4_fast``'s block loop. Every
block is computed with the same arguments on any thread count. Each row of a unit is first copied transposed
(``_transpose``: element k of block j at k * LANES + j), so that the loops across blocks read consecutive
addresses; the kernel asks for the CPU's widest vectors (kernels/wide.py).

**Summation order.** The scalar core (as TransformerEngine's reference) adds a block row's 16 float32 error
terms one after another in element order, each sum rounded to float32; float32 addition is not associative, so
that order is kept: lane j holds block j's running sum, and term k is added to every lane at step k
(``err[j] = err[j] + term(x[j * 16 + k])`` for k = 0..15), the same chain per block as the scalar core's,
with the blocks' chains side by side in one vector instead of one after another. The 16 row sums of a tile
are then joined by the scalar core's tree, again lane-wise. (Sums in float64 would not do: 16 float32 terms
need not add exactly in float64, and the reference rounds each partial sum to float32.)

**Values.** Per lane: the candidates' scales S6, S4 and encode scales enc as ``nvfp4_fast._fos_chunk``, the scales
rounded in float32 arithmetic (``_scale32``, the same values for the scale formats ``scale32_ok`` admits; the
others take ``nvfp4_fast``'s block path), so that every per-block loop runs 8 lanes to an AVX2 vector. Per
element |x| once; per candidate q = e2m1(float32(|x| * enc)) by float32 arithmetic (``e2m1_round``: exact
round-to-nearest-even with saturation, no compares), and the scalar core's val = float32(float32(float32(q * S)
* gamax) / denom) as w_m * 2**k for q = m * 2**k (``_dequant``), w_m made per lane (``lane_values``); the error
term is a function of |val - |x|| (``nvfp4_fast`` module doc). enc > 0 is finite here, so float32(|x| * enc) is
never NaN (a block holding a NaN is stored as NaN whatever its errors). A unit where some lane's w_m * 2**k
would leave float32's normal range (tiny amaxes) runs the block loop. The kept candidate's elements are rounded
again in element order the same way, the result float32(+-q * (float64(S) * float64(gds_row))) taken as
float32(m * full) * 2**k (``out_values``; a block where that is not exact rounds element by element), with x's
sign where q != 0 or the element has -0: the scalar core's stores.

**Stochastic rounding** (``sr``; ``nvfp4_cpu.fos_sr_ok``'s conditions). The same loops with q =
``nvfp4_fos_sr.sr_e2m1(float32(|x| * enc), word)`` for both candidates and the store, the word of element k of
block j being ``random_bits(key, its flat index, nbits)``, laid out as the magnitudes (``_words``). A stochastic q
is an e2m1 value too, so ``_dequant`` and ``out_values`` hold as above; the units that fall back take
``nvfp4_fos_sr``'s block loop. The flag is a constant in each of ``fos_lanes_range``'s two copies of the unit.
"""
import math

import numpy as np
from numba import njit

from . import _cache, block_fast, nvfp4_fast, scalar
from .borrow import borrow
from .llvm_inline import inline_in_llvm
from .transpose16 import transpose16
from .wide import prefer_wide_vectors
from .block_fast import ABS, INF_BITS, NAN32, SIGN
from .nvfp4_fast import _fos_chunk, _join, _split_constants
from .nvfp4_fos_sr import _fos_sr_chunk, sr_e2m1
from .scalar.common import random_bits
from .nvfp4_scalar import F32

_cache.guard(__file__, [*scalar.SOURCES, block_fast.__file__,
                        __file__.replace("nvfp4_fos_fast.py", "nvfp4_fast.py"),
                        __file__.replace("nvfp4_fos_fast.py", "nvfp4_scalar.py"),
                        __file__.replace("nvfp4_fos_fast.py", "wide.py"),
                        __file__.replace("nvfp4_fos_fast.py", "borrow.py"),
                        __file__.replace("nvfp4_fos_fast.py", "transpose16.py"),
                        __file__.replace("nvfp4_fos_fast.py", "nvfp4_fos_sr.py")])

U32 = np.uint32
U64 = np.uint64
LANES = 64  # blocks side by side in the vector loops
ONE_BITS, EXP_BITS, HALF_BIT, MAGIC_SHIFT = U32(0x3F800000), U32(0x7F800000), U32(0x400000), U32(22 << 23)
MIN_NORMAL = np.float32(2.0**-126)
E2M1 = np.array([0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
MAX_EIGHTH = np.float32(np.finfo(np.float32).max / 8)
MAX_QUARTER = np.float32(np.finfo(np.float32).max / 4)
FLT_MAX = np.finfo(np.float32).max


@njit(inline="always", error_model="numpy")
def e2m1_round(v):
    """e2m1(v) of a float32 v >= 0 or inf (saturating at 6, ties to even) by float32 arithmetic: v + M rounds v
    to a multiple of ulp(M) = the grid's step at v (0.5 below 2, 1 below 4, 2 up to 6; M = 2**(22 + max(e, 0)),
    e = v's exponent), ties to even, and even multiples of the step are e2m1's even codes; - M is exact."""
    vc = F32(min(v, F32(6.0)))
    mb = U32(U32(max(F32(vc).view(U32), ONE_BITS) & EXP_BITS) + MAGIC_SHIFT)
    mg = U32(mb).view(np.float32)
    return F32(F32(vc + mg) - mg)


@njit(inline="always", error_model="numpy")
def encode_scale32(s, g):
    """The scalar core's ``_encode_scale`` (min(float32(1 / float32(s * g)), FLT_MAX)) by one float32 division
    (16 lanes to a vector where float64's take 8): float32's quotient is float64's rounded to float32 (53 >= 2 *
    24 + 2 bits), and a quotient past FLT_MAX is FLT_MAX in both."""
    sg = F32(s * g)
    return FLT_MAX if sg == F32(0.0) else F32(min(F32(F32(1.0) / sg), FLT_MAX))


def scale32_ok(s_man, s_emin, s_sub, s_max) -> bool:
    """Whether ``_scale32`` rounds into the scale format (man s_man, smallest normal 2**s_emin, subnormals if s_sub,
    largest value s_max): its constants and every intermediate are float32 values, normal or 0."""
    q = s_emin - s_man if s_sub else s_emin
    return 1 <= s_man <= 20 and s_emin >= -100 and q >= -100 and 0.0 < s_max <= 2.0**100 \
        and float(np.float32(s_max)) == s_max


@njit(inline="always", error_model="numpy")
def _scale32(v, split, magic, min_normal, smax):
    """``nvfp4_fast._scale`` (v, a float32 >= 0 or inf, clamped to smax and rounded to nearest-even into the scale
    format) in float32 arithmetic, 16 lanes to a vector where float64 takes 8: Veltkamp's split (split = 2**(23 - man)
    + 1) at and above the smallest normal min_normal, (x + magic) - magic below it (magic = 1.5 * 2**(23 + q), q the
    format's smallest quantum's exponent), each exact for float32 operands as for float64 ones where ``scale32_ok``
    holds (x * split stays below 2**100 * 2**23, x + magic is a normal float32), so the same value; a zero stays +0."""
    x = F32(min(v, smax))
    c = F32(x * split)
    y = F32(c - F32(c - x))
    lo = F32(F32(x + magic) - magic)
    return lo if x < min_normal else y


@njit(inline="always", error_model="numpy")
def _dequant(q, w1, w15):
    """float32(float32(float32(q * S) * gamax) / denom) of an e2m1 value q = m * 2**k (m 1 or 1.5, or q = 0) from
    the lane's w1, w15 (``lane_values``: those of q = 1 and 1.5): w_m * 2**k, exact where ``lane_values`` holds."""
    qb = F32(q).view(U32)
    w = w15 if (qb & HALF_BIT) != 0 else w1
    return F32(w * U32(qb & EXP_BITS).view(np.float32))


@njit(inline="always", error_model="numpy")
def lane_values(S, a0, denom):
    """(w1, w15, ok): the dequantised values of q = 1 and 1.5 under scale S, and whether every e2m1 value's is
    w_m * 2**k (``_dequant``): true where S or a0 is 0 (every value 0), and where each float32 step of the chain
    for q = 0.5 and 0.75 is normal and at most FLT_MAX / 8, since float32 rounding commutes with a power of two
    between float32's smallest normal and its overflow (and the steps grow with q)."""
    y1 = F32(F32(0.5) * S)
    z1 = F32(y1 * a0)
    h1 = F32(z1 / denom)
    y15 = F32(F32(0.75) * S)
    z15 = F32(y15 * a0)
    h15 = F32(z15 / denom)
    lo = min(y1, min(z1, h1))
    hi = max(y15, max(z15, h15))
    ok = ((lo >= MIN_NORMAL) & (hi <= MAX_EIGHTH)) | (S == F32(0.0)) | (a0 == F32(0.0))
    return F32(h1 + h1), F32(h15 + h15), ok


def e2m1_values(vl) -> bool:
    """Whether ``nvfp4_fast.e2m1_constants``' values are e2m1's (``e2m1_round`` rounds to no other element)."""
    return np.array_equal(np.asarray(vl, np.float64), E2M1)


@njit(inline="always", error_model="numpy")
def _transpose(bits, rb, n, tb, o):
    """tb[o + k * LANES + j] = the bits of |x| of element k of block j (j < n) of the row from flat index rb: the
    error loop then reads a vector of lanes from consecutive addresses (a stride of 16 would need gathers), and
    this copy takes 16 blocks at a time in vector registers (kernels/transpose16.py), which LLVM's vectorised
    loop did with gathers of one element per lane."""
    j0 = 0
    while j0 + 16 <= n:
        transpose16(bits, U64(rb + 16 * j0), tb, U64(o + j0), LANES)
        j0 += 16
    for j in range(j0, n):
        for k in range(16):
            tb[U64(o + k * LANES + j)] = bits[U64(rb + 16 * j + k)] & ABS


@njit(inline="always", error_model="numpy")
def _errors(tf, o, n, metric, enc6, enc4, vt6, vt4, e6, e4, sr, rw, nbits, mask):
    """``_row_errors`` with the metric a constant in each copy of its loop (a selection by the metric per element
    cost as much as the error terms)."""
    if metric == 0:
        _row_errors(tf, o, n, np.int64(0), enc6, enc4, vt6, vt4, e6, e4, np.bool_(sr), rw, nbits, mask)
    elif metric == 1:
        _row_errors(tf, o, n, np.int64(1), enc6, enc4, vt6, vt4, e6, e4, np.bool_(sr), rw, nbits, mask)
    else:
        _row_errors(tf, o, n, np.int64(2), enc6, enc4, vt6, vt4, e6, e4, np.bool_(sr), rw, nbits, mask)


@njit(nogil=True, error_model="numpy")
def _row_errors(tf, o, n, metric, enc6, enc4, vt6, vt4, e6, e4, sr, rw, nbits, mask):
    """e6[j], e4[j]: the error of the 16 elements of block j (j < n) of a row under each candidate, each a chain
    in element order (module doc), from their magnitudes tf[o + k * LANES + j] (``_transpose``); vt6, vt4: each
    lane's w1 at j and w15 at LANES + j (``lane_values``); sr: rounded stochastically with the
    random words rw[o + k * LANES + j] (``_words``). ``_errors`` passes metric and sr as plain (not literal)
    values: numba types this once per array layout, with every branch, and LLVM inlines it (``llvm_inline``)
    at each call site, where they are constants, and folds the branches away (numba's inliner typed it again at
    each of its 12 call sites; one compile per literal metric and sr took 17 CPU-s)."""
    inline_in_llvm()
    st = U64(LANES)
    for j in range(n):
        e6[U64(j)] = F32(0.0)
        e4[U64(j)] = F32(0.0)
    for k in range(16):
        for j in range(n):
            a = tf[U64(o + k * LANES + j)]
            v6 = _dequant(_e2m1_of(F32(a * enc6[U64(j)]), sr, rw, o + k * LANES + j, nbits, mask), vt6[U64(j)],
                          vt6[U64(j) + st])
            v4 = _dequant(_e2m1_of(F32(a * enc4[U64(j)]), sr, rw, o + k * LANES + j, nbits, mask), vt4[U64(j)],
                          vt4[U64(j) + st])
            d6 = abs(F32(v6 - a))
            d4 = abs(F32(v4 - a))
            t6 = F32(d6 * d6) if metric == 1 else d6
            t4 = F32(d4 * d4) if metric == 1 else d4
            e6[U64(j)] = max(e6[U64(j)], t6) if metric == 2 else F32(e6[U64(j)] + t6)
            e4[U64(j)] = max(e4[U64(j)], t4) if metric == 2 else F32(e4[U64(j)] + t4)


@njit(inline="always", error_model="numpy")
def _e2m1_of(w, sr, rw, i, nbits, mask):
    """e2m1 of a float32 w >= 0 or inf: ``sr_e2m1`` with the word rw[i] where sr (a constant), else
    ``e2m1_round``."""
    if sr:
        return sr_e2m1(w, rw[U64(i)], nbits, mask)
    return e2m1_round(w)


@njit(inline="always", error_model="numpy")
def _words(rw, o, rb, n, key, nbits):
    """rw[o + k * LANES + j] = the random word (``random_bits``) of element k of block j (j < n) of the row from
    flat index rb: laid out as ``_transpose`` lays out the magnitudes."""
    for k in range(16):
        for j in range(n):
            rw[U64(o + k * LANES + j)] = U32(random_bits(key, U64(rb + 16 * j + k), nbits))


@njit(inline="always", error_model="numpy")
def _blocks_one_by_one(src, bits, dbits, sc, nbr, R, C, tr, ges, gds, gamax, denom, metric, m, vl, negzero, sk, b0, b1,
                       fb, sr, srk):
    """Blocks b0..b1-1 (flat) by ``nvfp4_fast``'s block loop, or where sr by ``nvfp4_fos_sr``'s (tc an int64, not the
    literal 16: the compile those paths make for their own callers serves here too)."""
    s_max, s_split, s_magic, s_min_normal = sk[:4]
    q6, q4, t6, t4, w6, w4 = fb[10:]
    key, nbits, mask, rw, rb = srk
    if sr:
        _fos_sr_chunk(bits, dbits, sc.reshape(-1), nbr, sc.shape[1], R, C, tr, np.int64(16), ges, gds, gamax, denom,
                      metric, negzero, s_max, s_split, s_magic, s_min_normal, key, nbits, b0, b1, rb, q6, q4, t6, t4, w6,
                      w4)
    else:
        _fos_chunk(src, bits, dbits, sc.reshape(-1), nbr, sc.shape[1], R, C, tr, np.int64(16), ges, gds, gamax, denom,
                   metric, m, vl, negzero, s_max, s_split, s_magic, s_min_normal, b0, b1, q6, q4, t6, t4, w6, w4)


@njit(nogil=True, error_model="numpy")
def _unit(src, bits, dbits, sc, scf, nbr, R, C, tr, ges, gds, gamax, denom, metric, m, vl, negzero, sk, line, bj0, n,
          mx, ob, tb, tf, fb, sr, srk):
    """Blocks bj0..bj0+n-1 of row of blocks ``line`` (``fos_lanes_range``); sk: the scale format's constants; fb:
    the float32 buffers (grouped: an inlined call takes at most 30 arguments); sr: stochastic rounding with srk =
    (key, nbits, mask, rw, rb) (``_words``). sr comes as a plain bool: numba types the unit once, with both
    branches, and LLVM inlines it (``llvm_inline``) at each of its two call sites, where sr is a constant, and
    folds them; numba's own inliner copied and typed it at both (the first 4/6 call's compiles: 36 -> 24 CPU-s;
    the same code to within 0.3% of its instructions, the same speed: RESULTS.md "Stop 57")."""
    inline_in_llvm()
    prefer_wide_vectors()
    s_max, s_split, s_magic, s_min_normal, f_max, f_split, f_magic, f_min_normal = sk
    s6, s4, enc6, enc4, r6, r4, e6, e4, vt6, vt4, q6, q4, t6, t4, w6, w4 = fb
    key, nbits, mask, rw, rb = srk
    p = line // nbr
    bi = line - p * nbr
    row0 = p * R + bi * tr  # the flat row of the blocks' first row
    rows = min(tr, R - bi * tr)
    c00 = bj0 * 16
    for i in range(rows):
        _transpose(bits, (row0 + i) * C + c00, n, tb, i * 16 * LANES)
        if sr:
            _words(rw, i * 16 * LANES, (row0 + i) * C + c00, n, key, nbits)
    for j in range(n):
        mx[U64(j)] = U32(0)
    for k in range(16 * rows):  # lane-wise: no reduction across a vector
        for j in range(n):
            mx[U64(j)] = max(mx[U64(j)], tb[U64(k * LANES + j)])
    g0, a0, ge0 = gds[U64(row0)], gamax[U64(row0)], ges[U64(row0)]
    for j in range(n):  # simple loops, each vectorised
        s4[U64(j)] = F32(F32(U32(mx[U64(j)]).view(np.float32) / F32(6.0)) * ge0)  # base
    for j in range(n):
        base = s4[U64(j)]
        s6[U64(j)] = _scale32(base, f_split, f_magic, f_min_normal, f_max)
        s4[U64(j)] = _scale32(F32(base * F32(1.5)), f_split, f_magic, f_min_normal, f_max)
    st = U64(LANES)
    for j in range(n):
        enc6[U64(j)] = encode_scale32(s6[U64(j)], g0)
        enc4[U64(j)] = encode_scale32(s4[U64(j)], g0)
    # each lane's flag into ob's third row (free until ``_store_row`` makes it), then their union: a reduction in
    # the loops above ran them 4 lanes to a vector, not 8 (measured)
    for j in range(n):
        w1, w15, ok6 = lane_values(s6[U64(j)], a0, denom)
        vt6[U64(j)], vt6[U64(j) + st] = w1, w15
        w1, w15, ok4 = lane_values(s4[U64(j)], a0, denom)
        vt4[U64(j)], vt4[U64(j) + st] = w1, w15
        zero = (enc6[U64(j)] == F32(0.0)) | (enc4[U64(j)] == F32(0.0))
        ob[U64(j) + 2 * st] = U32(zero | (((not ok6) | (not ok4)) & (mx[U64(j)] <= INF_BITS)))  # NaN: stored NaN
    nz = U32(0)
    for j in range(n):
        nz |= ob[U64(j) + 2 * st]
    if nz != 0:  # S * gds overflowed (|x| * enc may be NaN: module doc), or a dequantised value is not w_m * 2**k
        b0 = line * sc.shape[1] + bj0
        _blocks_one_by_one(src, bits, dbits, sc, nbr, R, C, tr, ges, gds, gamax, denom, metric, m, vl, negzero, sk,
                           b0, b0 + n, fb, sr, srk)
    else:
        if tr == 1:
            _errors(tf, 0, n, metric, enc6, enc4, vt6, vt4, e6, e4, sr, rw, nbits, mask)
        else:
            for i in range(16):
                if i < rows:
                    _errors(tf, i * 16 * LANES, n, metric, enc6, enc4, vt6, vt4, r6[i * LANES:], r4[i * LANES:], sr,
                            rw, nbits, mask)
                else:
                    for j in range(n):
                        r6[U64(i * LANES + j)] = F32(0.0)
                        r4[U64(i * LANES + j)] = F32(0.0)
            for j in range(n):  # the scalar core's tree of the 16 row errors (nvfp4_fast._tree)
                z6 = F32(0.0)
                z4 = F32(0.0)
                for jj in range(2):
                    c6 = F32(0.0)
                    c4 = F32(0.0)
                    for kk in range(2):
                        kq = jj + 2 * kk
                        b6 = F32(0.0)
                        b4 = F32(0.0)
                        for mm in range(2):
                            mi = (kq + 4 * mm) * LANES + j
                            b6 = _join(b6, _join(r6[U64(mi)], r6[U64(mi + 8 * LANES)], metric), metric)
                            b4 = _join(b4, _join(r4[U64(mi)], r4[U64(mi + 8 * LANES)], metric), metric)
                        c6 = _join(c6, b6, metric)
                        c4 = _join(c4, b4, metric)
                    z6 = _join(z6, c6, metric)
                    z4 = _join(z4, c4, metric)
                e6[U64(j)] = z6
                e4[U64(j)] = z4
        for j in range(n):  # selections of loaded values: no branch on the (unpredictable) decision
            keep4 = e4[U64(j)] < e6[U64(j)]  # a tie keeps S6
            a4, a6, c4, c6 = s4[U64(j)], s6[U64(j)], enc4[U64(j)], enc6[U64(j)]
            s6[U64(j)] = a4 if keep4 else a6  # the kept scale, and its enc for gds[row0]
            enc6[U64(j)] = c4 if keep4 else c6
        o = U64(line * sc.shape[1] + bj0)
        for j in range(n):  # flat: sc[line, bj0 + j] (a 2-D store checks its indices and does not vectorise)
            scf[o + U64(j)] = np.float64(s6[U64(j)]) if mx[U64(j)] <= INF_BITS else math.nan
        for i in range(rows):
            g = gds[U64(row0 + i)]
            _store_row(src, bits, dbits, row0 + i, C, c00, n, g, g != g0, (i == 0) | (g != g0), m, vl, negzero, mx,
                       s6, enc6, ob, sr, rw, i * 16 * LANES, nbits, mask)
            g0 = g  # enc6 and ob now hold this row's


@njit(inline="always", error_model="numpy")
def out_values(full):
    """(o1, o15, ok): float32(full) and float32(1.5 * full) of a float64 full >= 0, and whether float32(q * full)
    is o_m * 2**k for every e2m1 value q = m * 2**k (``_dequant``): where full is 0, or 0.5 * full and 6 * full
    stay within float32's normal range (rounding then commutes with the power of two)."""
    o15 = np.float32(1.5 * full)
    return np.float32(full), o15, ((np.float32(0.5 * full) >= MIN_NORMAL) & (o15 <= MAX_QUARTER)) | (full == 0.0)


@njit(inline="always", error_model="numpy")
def _store_row(src, bits, dbits, r, C, c00, n, g, new_enc, new_tab, m, vl, negzero, mx, s, enc, ob, sr, rw, orw, nbits,
               mask):
    """Row r of the blocks: each element float32(+-q * (float64(S) * float64(g))), q = e2m1(|x| * enc) with S
    the kept scale (``e2m1_round``), as float32(m * full) * 2**k for q = m * 2**k (``_dequant``; ob: per block j
    those of m = 1 and 1.5 at j and LANES + j, and at 2 * LANES + j whether that is exact: full = 0, or 0.5 * full
    and 6 * full within float32's normal range); new_enc, new_tab: whether enc and ob must be made for this g, or
    hold it from the previous row. A block whose enc is 0 (S * g overflowed float32: |x| * enc is NaN for an
    infinite x), or whose products are not exact so, is rounded element by element as ``nvfp4_fast``. sr (a
    constant): q rounded stochastically with the words rw[orw + k * LANES + j] (``_words``), as the errors were."""
    st = U64(LANES)
    if new_enc:
        for j in range(n):
            enc[U64(j)] = encode_scale32(s[U64(j)], g)
    if new_tab:
        for j in range(n):
            o1, o15, ok = out_values(np.float64(s[U64(j)]) * np.float64(g))
            ob[U64(j)] = F32(o1).view(U32)
            ob[U64(j) + st] = F32(o15).view(U32)
            ob[U64(j) + 2 * st] = U32(ok)
    rb = r * C + c00
    nzs = SIGN if negzero != 0 else U32(0)  # keeps x's sign on zero results too
    for j in range(n):
        e = enc[U64(j)]
        o = U64(j)
        if mx[o] > INF_BITS:
            for k in range(16):
                dbits[U64(rb + 16 * j + k)] = NAN32
        elif (e == 0) | (ob[o + 2 * st] == 0):
            full = np.float64(s[o]) * np.float64(g)
            for k in range(16):
                x = U64(rb + 16 * j + k)
                if sr:
                    q = sr_e2m1(F32(abs(src[x]) * e), rw[U64(orw + k * LANES + j)], nbits, mask)
                else:
                    q = nvfp4_fast._e2m1(F32(abs(src[x]) * e), m, vl)
                res = np.float32(np.float64(q) * full).view(U32)
                dbits[x] = res | (bits[x] & SIGN if (q != 0.0) | (negzero != 0) else U32(0))
        else:
            o1, o15 = U32(ob[o]).view(np.float32), U32(ob[o + st]).view(np.float32)
            for k in range(16):  # x's sign where q != 0 (then q's bits + ABS have the sign bit) or nzs has it
                x = U64(rb + 16 * j + k)
                u = bits[x]
                q = _e2m1_of(F32(U32(u & ABS).view(np.float32) * e), sr, rw, orw + k * LANES + j, nbits, mask)
                res = F32(_dequant(q, o1, o15)).view(U32)
                dbits[x] = res | (u & (U32(F32(q).view(U32) + ABS) | nzs) & SIGN)


@njit(cache=True, nogil=True, error_model="numpy")
def fos_lanes_range(u0, u1, src, bits, dbits, scales, R, C, tr, ges, gds, gamax, denom, metric, m, vl, negzero, s_man,
                    s_emin, s_sub, s_max, key, nbits, sr):
    """4/6 selection, units u0..u1-1 (``units``; module doc) of blocks of tr x 16 (tr 1 or 16) of (P, R, C) data,
    with the partial last block of a row of blocks by ``_fos_chunk``; arguments as ``nvfp4_fast.fos_range``, then
    key, nbits and sr (rounded stochastically with nbits random bits under key where sr, module doc; else to
    nearest); the scale format must pass ``scale32_ok``. One kernel for the serial call and for each thread's share
    (``threads.launch``; its buffers made once per call): a block's operations depend on its index only."""
    s_split, s_magic, s_min_normal = _split_constants(s_man, s_emin, s_sub)
    nbr, nbc = scales.shape[1], scales.shape[2]
    sc = scales.reshape(scales.shape[0] * nbr, nbc)
    whole = C // 16
    per = -(-whole // LANES) if whole > 0 else 1
    # the buffers carved from one allocation (pieces of whole 64-byte lines; 21 allocations per task measured
    # 3-5% of the serial kernel)
    L, E = LANES, 16 * tr
    buf = np.empty(46 * L + 4 * E + 32 + E * L + (E * L + E if sr else 0), np.float32)
    mx, ob = buf[0:L].view(U32), buf[L:4 * L].view(U32)
    vt6, vt4, s6, s4 = buf[4 * L:6 * L], buf[6 * L:8 * L], buf[8 * L:9 * L], buf[9 * L:10 * L]
    enc6, enc4, e6, e4 = buf[10 * L:11 * L], buf[11 * L:12 * L], buf[12 * L:13 * L], buf[13 * L:14 * L]
    r6, r4 = buf[14 * L:30 * L], buf[30 * L:46 * L]
    o = 46 * L
    q6, q4, t6, t4 = buf[o:o + E], buf[o + E:o + 2 * E], buf[o + 2 * E:o + 3 * E], buf[o + 3 * E:o + 4 * E]
    o += 4 * E
    w6, w4 = buf[o:o + 16], buf[o + 16:o + 32]
    w6[:] = 0
    w4[:] = 0
    tb = buf[o + 32:o + 32 + E * L].view(U32)
    o += 32 + E * L
    rw, rb = buf[o:o + E * L].view(U32), buf[o + E * L:o + E * L + E].view(U32)  # empty unless sr
    prefer_wide_vectors()  # the loops below are across blocks or along one, 16 float32 lanes fit either
    # every array borrowed (kernels/borrow.py) once per task: each unit binds them all again as the arguments of
    # its inlined calls, which with owned arrays cost more than the unit's error loops (measured)
    src, bits, dbits, sc, ges, gds, gamax, vl = (borrow(src), borrow(bits), borrow(dbits), borrow(sc), borrow(ges),
                                                 borrow(gds), borrow(gamax), borrow(vl))
    mx, ob, tb, s6, s4, enc6, enc4, r6, r4 = (borrow(mx), borrow(ob), borrow(tb), borrow(s6), borrow(s4),
                                              borrow(enc6), borrow(enc4), borrow(r6), borrow(r4))
    e6, e4, vt6, vt4, q6, q4, t6, t4, w6, w4 = (borrow(e6), borrow(e4), borrow(vt6), borrow(vt4), borrow(q6),
                                                borrow(q4), borrow(t6), borrow(t4), borrow(w6), borrow(w4))
    scf = borrow(sc.reshape(-1))
    rw, rb = borrow(rw), borrow(rb)
    srk = (U64(key), nbits, U32((1 << nbits) - 1), rw, rb)
    # the scale rounding in float32 (``_scale32``; the dispatch checks ``scale32_ok``)
    sk = (s_max, s_split, s_magic, s_min_normal, F32(s_max), F32((s_split - 1.0) * 2.0**-29 + 1.0),
          F32(s_magic * 2.0**-29), F32(s_min_normal))
    for u in range(u0, u1):
        line = u // per
        bj0 = (u - line * per) * LANES
        n = min(LANES, whole - bj0)
        fb = (s6, s4, enc6, enc4, r6, r4, e6, e4, vt6, vt4, q6, q4, t6, t4, w6, w4)
        if n > 0 and sr:  # two copies of the unit, sr a constant in each
            _unit(src, bits, dbits, sc, scf, nbr, R, C, tr, ges, gds, gamax, denom, metric, m, vl, negzero,
                  sk, line, bj0, n, mx, ob, tb, tb.view(np.float32), fb, np.bool_(True), srk)
        elif n > 0:
            _unit(src, bits, dbits, sc, scf, nbr, R, C, tr, ges, gds, gamax, denom, metric, m, vl, negzero,
                  sk, line, bj0, n, mx, ob, tb, tb.view(np.float32), fb, np.bool_(False), srk)
        if C % 16 != 0 and bj0 + LANES >= whole:  # the partial last block
            b = line * sc.shape[1] + sc.shape[1] - 1
            _blocks_one_by_one(src, bits, dbits, sc, nbr, R, C, tr, ges, gds, gamax, denom, metric, m, vl, negzero,
                               sk, b, b + 1, fb, sr, srk)


def units(scales, C: int) -> int:
    """The number of units (``fos_lanes_range``'s work items) of a scales array (P, nbr, nbc) over C columns."""
    whole = C // 16
    return (-(-whole // LANES) if whole > 0 else 1) * scales.shape[0] * scales.shape[1]
