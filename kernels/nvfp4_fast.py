"""Float32 fast paths of the NVFP4-family CPU kernel (kernels/nvfp4_cpu.py): float32 data, round to nearest, an
element of seven positive values (e2m1). The same bits as the scalar cores of kernels/nvfp4_scalar.py
(tests/kernels/test_nvfp4_fast.py compares them over random and adversarial tensors), for the reasons below.

Arrays are flat: ``bits`` (src's uint32 view) and ``dbits`` (dst's), rows of C elements, the row of flat index
r = p * R + i; ``scales`` float64, one per block in (P, nbr, nbc) order. Blocks are visited in chunks of CHUNK,
in contiguous shares of chunks on threads (``threads.launch``), every block with the same arguments on any thread
count.

**Per-row outer scales (``row_*``).** T_r is computed here from the row's bits as emunum/nvfp4_quantize.py states it:
float32(amax_r / (element max * scale max)) with amax_r the row's largest finite |x| (exact in float64), raised to
2**-149 if it rounds to 0, 1 if amax_r is 0. A block then is ``row_block``'s with T_r: its scale is the amax rule's (the
expression and rounding of kernels/block_fast.py's table path), and its elements are compared with the seven thresholds
of M_i * S * T_r and replaced by the bits of float32(V_i * S * T_r), as block_fast.py proves for one tensor scale (its
``_threshold`` holds for any T > 0, subnormal products included). The thresholds are made per block (S and T_r vary).

**4/6 selection (``fos_range``).** Per candidate S the scalar core rounds v = float32(x * enc) (enc > 0) and sums
a function of d = float32(val - x), val = float32(float32(float32(q * S) * gamax) / denom). Rounding to nearest
is symmetric in sign, so with a = |x|: |v| = float32(a * enc), q = +-e2m1(|v|) with x's sign (or +0 where the
element has no -0), val = +-float32(...(|q|)...), and |d| = |float32(|val| - a)| (also where q is a zero: d =
-x). The error terms (|d|, float32(d * d), or |d| for the max) are therefore functions of a alone; they are
computed in a vector loop and added in element order afterwards, as the scalar core adds them. e2m1(|v|) of a
float32 |v| is V[c - 1], c = #{i : |v| > M_i, or |v| == M_i where the tie goes up} (M_i float32 values, exact
compares; |v| = inf saturates to 6 as the scalar core does). The kept candidate's rounded magnitudes are kept
from the error pass, not rounded again (a row of a tile whose gds differs from the first row's, which rounded
the errors, is rounded again with its own); the result is float32(+-q * (float64(S) * float64(gds))), as the
scalar core stores it. kernels/nvfp4_fos_fast.py runs the same steps with blocks side by side.
"""
import math

import numpy as np
from numba import njit

from . import _cache, block_fast, scalar
from .block_fast import ABS, INF_BITS, NAN32, SIGN, _threshold, finite_max_bits
from .nvfp4_scalar import F32, _encode_scale
from .scalar.float import round_nearest_value
from .wide import prefer_wide_vectors

_cache.guard(__file__, [*scalar.SOURCES, block_fast.__file__,
                        __file__.replace("nvfp4_fast.py", "nvfp4_scalar.py")])

U32 = np.uint32
U64 = np.uint64
CHUNK = 256  # blocks per step


@njit(inline="always", error_model="numpy")
def _split_constants(s_man, s_emin, s_sub):
    """Veltkamp split, subnormal magic and min normal of the scale format (man >= 1)."""
    return (math.ldexp(1.0, 52 - s_man) + 1.0, 1.5 * math.ldexp(1.0, 52 + (s_emin - s_man if s_sub != 0 else s_emin)),
            math.ldexp(1.0, s_emin))


# ---- per-row outer scales -----------------------------------------------------------------------------------

@njit(error_model="numpy")
def _row_scale(bits, sc, r, C, nbc, tc, prod):
    """T_r of row r, its blocks' largest |x| (NaN where a block holds one) into sc as float64, as
    block_fast.py's amax pass."""
    prefer_wide_vectors()
    fin = U32(0)
    for bj in range(nbc):
        start = r * C + bj * tc
        size = min(tc, C - bj * tc)
        m = U32(0)
        for k in range(min(size, bits.size - start)):  # (= size) not a constant: LLVM vectorises the max
            m = max(m, U32(bits[U64(start + k)] & ABS))
        sc[U64(r * nbc + bj)] = np.float64(U32(m).view(np.float32))
        fin = max(fin, finite_max_bits(bits, start, size) if m >= INF_BITS else m)
    amax = np.float64(U32(fin).view(np.float32))
    return max(np.float64(np.float32(amax / prod)), 2.0**-149) if amax != 0.0 else 1.0  # never 0 (BlockFormat)


@njit(cache=True, nogil=True, error_model="numpy")
def row_scales_range(r0, r1, bits, sc, t, C, tc, prod):
    """t[r] = T_r of rows r0..r1-1 of C elements in blocks of tc (float64; module doc), and each of their blocks'
    largest |x| into the flat scales sc; prod: element max * scale max. One kernel for the serial call and for
    each thread's share (``threads.launch``)."""
    prefer_wide_vectors()
    nbc = sc.size // t.size
    for r in range(r0, r1):
        t[U64(r)] = _row_scale(bits, sc, r, C, nbc, tc, prod)


@njit(cache=True, nogil=True, error_model="numpy")
def row_amax_range(r0, r1, bits, out, C):
    """out[r] = the largest finite |x| of row r of C float32 elements (bits: their uint32 view), as float64, for
    rows r0..r1-1 (one kernel for the serial call and each thread's share)."""
    prefer_wide_vectors()
    for r in range(r0, r1):
        out[U64(r)] = np.float64(U32(finite_max_bits(bits, r * C, C)).view(np.float32))


@njit(error_model="numpy")
def _row_chunk(bits, dbits, sc, t, C, nbc, tc, mids, ups, vals, max_e, negzero, s_max, s_min, s_split, s_magic,
               s_min_normal, b0, b1, tb, full, thr, val):
    """Blocks b0..b1-1 (module doc; every T_r > 0; sc holds their amaxes, ``row_scales_range``): their T_r, then their
    scales and thresholds in vector loops across the blocks (tb, full: float64 buffers of CHUNK; thr, val: uint32
    buffers of 7 * CHUNK, threshold i of block b0 + j at i * CHUNK + j), then the elements."""
    prefer_wide_vectors()
    n = b1 - b0
    tiled = tc == 16 and C % 16 == 0
    r0 = b0 // nbc
    c00 = (b0 - r0 * nbc) * tc
    r, c0 = r0, c00
    for j in range(n):
        tb[U64(j)] = t[U64(r)]
        c0 += tc
        if c0 >= C:
            r, c0 = r + 1, 0
    for j in range(n):
        amax = sc[U64(b0 + j)]
        tt = tb[U64(j)]
        want = min(amax / max_e / tt, s_max)
        q = max(round_nearest_value(want, s_split, s_magic, s_min_normal, s_max, s_max, 0), s_min)
        sc[U64(b0 + j)] = q if amax == amax else math.nan
        full[U64(j)] = q * tt  # exact
    for i in range(7):
        mi, ui, vi = mids[i], ups[i], vals[i]
        for j in range(n):
            thr[U64(i * CHUNK + j)] = _threshold(mi * full[U64(j)], ui)
            val[U64(i * CHUNK + j)] = np.float32(vi * full[U64(j)]).view(U32)
    r, c0 = r0, c00
    for j in range(n):
        start = r * C + c0
        size = min(tc, C - c0)
        if sc[U64(b0 + j)] != sc[U64(b0 + j)]:
            for k in range(size):
                dbits[U64(start + k)] = NAN32
        elif tiled:
            _table_block_strided(bits, dbits, start, 16, thr, val, U64(j), negzero)
        else:
            _table_block_strided(bits, dbits, start, size, thr, val, U64(j), negzero)
        c0 += tc
        if c0 >= C:
            r, c0 = r + 1, 0


@njit(inline="always", error_model="numpy")
def _table_block_strided(bits, dbits, start, size, thr, val, o, negzero):
    """block_fast's ``_table_block`` with threshold i at o + i * CHUNK."""
    st = U64(CHUNK)
    t0, t1, t2, t3, t4, t5, t6 = thr[o], thr[o + st], thr[o + 2 * st], thr[o + 3 * st], thr[o + 4 * st], \
        thr[o + 5 * st], thr[o + 6 * st]
    v0, v1, v2, v3, v4, v5, v6 = val[o], val[o + st], val[o + 2 * st], val[o + 3 * st], val[o + 4 * st], \
        val[o + 5 * st], val[o + 6 * st]
    for k in range(size):
        u = bits[U64(start + k)]
        a = u & ABS
        r = v0 if a > t0 else U32(0)
        r = v1 if a > t1 else r
        r = v2 if a > t2 else r
        r = v3 if a > t3 else r
        r = v4 if a > t4 else r
        r = v5 if a > t5 else r
        r = v6 if a > t6 else r
        dbits[U64(start + k)] = r | (u & SIGN if (a > t0) | (negzero != 0) else U32(0))


@njit(cache=True, nogil=True, error_model="numpy")
def row_range(c0, c1, bits, dbits, sc, t, C, tc, mids, ups, vals, max_e, negzero, s_man, s_emin, s_sub, s_max, s_min):
    """Per-row outer scales t (``row_scales_range``, all > 0), 1-D blocks of tc along rows of C (module doc), chunks
    c0..c1-1 of CHUNK blocks (``chunks``); sc: the flat float64 scales, one per block. One kernel for the serial
    call and for each thread's share (``threads.launch``), its buffers made once per call."""
    s_split, s_magic, s_min_normal = _split_constants(s_man, s_emin, s_sub)
    nbc = sc.size // t.size
    tb, full = np.empty(CHUNK), np.empty(CHUNK)
    thr, val = np.empty(7 * CHUNK, np.uint32), np.empty(7 * CHUNK, np.uint32)
    for ch in range(c0, c1):
        _row_chunk(bits, dbits, sc, t, C, nbc, tc, mids, ups, vals, max_e, negzero, s_max, s_min, s_split, s_magic,
                   s_min_normal, ch * CHUNK, min(ch * CHUNK + CHUNK, sc.size), tb, full, thr, val)


def chunks(nb: int) -> int:
    """The chunks of CHUNK blocks of ``row_range`` and ``fos_range`` for nb blocks."""
    return -(-nb // CHUNK)


# ---- 4/6 selection --------------------------------------------------------------------------------------------

@njit(inline="always", error_model="numpy")
def _scale(v, s_split, s_magic, s_min_normal, s_max):
    """The scalar core's ``_scale_of`` (float32 v >= 0, or inf, clamped to s_max and rounded to nearest-even into
    the scale format, a zero kept) by Veltkamp's split, as kernels/block_fast.py rounds its amax scales."""
    return F32(round_nearest_value(min(np.float64(v), s_max), s_split, s_magic, s_min_normal, s_max, s_max, 0))


@njit(inline="always", error_model="numpy")
def _e2m1(v, m, vl):
    """e2m1(v) of a float32 v >= 0 (inf, or NaN kept): m, vl the float32 midpoints (a tie going up stored as the next
    float32 below the midpoint) and values (module doc)."""
    q = vl[0] if v > m[0] else F32(0.0)
    q = vl[1] if v > m[1] else q
    q = vl[2] if v > m[2] else q
    q = vl[3] if v > m[3] else q
    q = vl[4] if v > m[4] else q
    q = vl[5] if v > m[5] else q
    q = vl[6] if v > m[6] else q
    return v if v != v else q  # inf * enc = inf * 0 where S * gds overflows: NaN, as the scalar core rounds it


@njit(inline="always", error_model="numpy")
def _terms(src, start, size, off, S, g, gamax, denom, metric, m, vl, qb, eb):
    """qb[off + k]: e2m1 of |x_k| * enc under candidate S; eb[off + k]: its error term (module doc)."""
    enc = _encode_scale(S, g)
    for k in range(size):
        a = abs(src[U64(start + k)])
        q = _e2m1(F32(a * enc), m, vl)
        val = F32(F32(F32(q * S) * gamax) / denom)
        d = abs(F32(val - a))
        qb[U64(off + k)] = q
        eb[U64(off + k)] = F32(d * d) if metric == 1 else d


@njit(inline="always", error_model="numpy")
def _sum(eb, off, size, metric):
    err = F32(0.0)
    for k in range(size):
        e = eb[U64(off + k)]
        err = max(err, e) if metric == 2 else F32(err + e)
    return err


@njit(inline="always", error_model="numpy")
def _join(a, b, metric):
    return max(a, b) if metric == 2 else F32(a + b)


@njit(inline="always", error_model="numpy")
def _tree(rows, metric):
    """16 row errors (zero past the tensor's edge) added as the scalar core's ``_tile_error`` tree."""
    total = F32(0.0)
    for jj in range(2):
        cj = F32(0.0)
        for kk in range(2):
            k = jj + 2 * kk
            bk = F32(0.0)
            for mm in range(2):
                mi = k + 4 * mm
                bk = _join(bk, _join(rows[mi], rows[mi + 8], metric), metric)
            cj = _join(cj, bk, metric)
        total = _join(total, cj, metric)
    return total


@njit(inline="always", error_model="numpy")
def store_row(bits, dbits, qb, q0, start, size, full, negzero):
    """Store one row of a 4/6 block: float32(+-q * full) of the kept candidate's elements qb[q0:q0 + size] at
    dbits[start:start + size], with x's sign where q != 0 or the element has -0 (the scalar core's stores)."""
    for k in range(size):
        u = bits[U64(start + k)]
        q = np.float64(qb[U64(q0 + k)])
        r = np.float32(q * full).view(U32)
        dbits[U64(start + k)] = r | (u & SIGN if (q != 0.0) | (negzero != 0) else U32(0))


@njit(inline="always", error_model="numpy")
def block_candidates(b, bits, dbits, sc, nbr, nbc, R, C, tr, tc, ges, gds, gamax, s_max, s_split, s_magic,
                     s_min_normal):
    """4/6 block b of a (P, nbr, nbc) grid of tr x tc blocks over float32 bits of (P, R, C): (row0, rows, c0, size,
    nan, s6, s4, g0, a0), its first flat row, its rows and columns clipped to the tensor, whether it holds a NaN
    (then stored here: NaN scale and elements), the candidates' scales (the scalar core's S6, S4) and its first
    row's gds and gamax."""
    p = b // (nbr * nbc)
    bi = (b - p * nbr * nbc) // nbc
    bj = b - (b // nbc) * nbc
    row0 = p * R + bi * tr  # the flat row of the block's first row
    rows = min(tr, R - bi * tr)
    c0 = bj * tc
    size = min(tc, C - c0)
    mx = U32(0)
    for i in range(rows):
        start = (row0 + i) * C + c0
        for k in range(size):
            mx = max(mx, U32(bits[U64(start + k)] & ABS))
    g0, a0 = gds[U64(row0)], gamax[U64(row0)]
    if mx > INF_BITS:  # a NaN
        sc[U64(b)] = math.nan
        for i in range(rows):
            start = (row0 + i) * C + c0
            for k in range(size):
                dbits[U64(start + k)] = NAN32
        return row0, rows, c0, size, True, F32(0.0), F32(0.0), g0, a0
    vmax = U32(mx).view(np.float32)
    base = F32(F32(vmax / F32(6.0)) * ges[U64(row0)])
    s6 = _scale(base, s_split, s_magic, s_min_normal, s_max)
    s4 = _scale(F32(base * F32(1.5)), s_split, s_magic, s_min_normal, s_max)
    return row0, rows, c0, size, False, s6, s4, g0, a0


@njit(error_model="numpy")
def _fos_chunk(src, bits, dbits, sc, nbr, nbc, R, C, tr, tc, ges, gds, gamax, denom, metric, m, vl, negzero, s_max,
               s_split, s_magic, s_min_normal, b0, b1, q6, q4, e6, e4, r6, r4):
    """Blocks b0..b1-1 (module doc); q6, q4, e6, e4: float32 buffers of tr * tc, r6, r4 of 16."""
    for b in range(b0, b1):
        row0, rows, c0, size, nan, s6, s4, g0, a0 = block_candidates(b, bits, dbits, sc, nbr, nbc, R, C, tr, tc, ges,
                                                                     gds, gamax, s_max, s_split, s_magic, s_min_normal)
        if nan:
            continue
        for i in range(rows):
            start = (row0 + i) * C + c0
            _terms(src, start, size, i * tc, s6, g0, a0, denom, metric, m, vl, q6, e6)
            _terms(src, start, size, i * tc, s4, g0, a0, denom, metric, m, vl, q4, e4)
        if tr == 1:
            err6 = _sum(e6, 0, size, metric)
            err4 = _sum(e4, 0, size, metric)
        else:
            for i in range(16):
                r6[i] = _sum(e6, i * tc, size, metric) if i < rows else F32(0.0)
                r4[i] = _sum(e4, i * tc, size, metric) if i < rows else F32(0.0)
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
                _terms(src, start, size, i * tc, s, g, a0, denom, metric, m, vl, qb, e6)
            store_row(bits, dbits, qb, i * tc, start, size, full, negzero)


@njit(cache=True, nogil=True, error_model="numpy")
def fos_range(c0, c1, src, bits, dbits, scales, R, C, tr, tc, ges, gds, gamax, denom, metric, m, vl, negzero, s_man,
              s_emin, s_sub, s_max):
    """4/6 selection, blocks of tr x tc (tr 1 or 16) of (P, R, C) data (module doc), chunks c0..c1-1 of CHUNK
    blocks (``chunks``): src flat float32, bits and dbits the uint32 views of src and dst; scales (P, nbr, nbc)
    float64; m, vl: ``e2m1_constants``. One kernel for the serial call and for each thread's share
    (``threads.launch``), its buffers made once per call."""
    s_split, s_magic, s_min_normal = _split_constants(s_man, s_emin, s_sub)
    nbr, nbc, nb = scales.shape[1], scales.shape[2], scales.size
    q6 = np.empty(tr * tc, np.float32)
    q4 = np.empty(tr * tc, np.float32)
    e6 = np.empty(tr * tc, np.float32)
    e4 = np.empty(tr * tc, np.float32)
    r6 = np.zeros(16, np.float32)
    r4 = np.zeros(16, np.float32)
    sc = scales.reshape(-1)
    for ch in range(c0, c1):
        _fos_chunk(src, bits, dbits, sc, nbr, nbc, R, C, tr, tc, ges, gds, gamax, denom, metric, m, vl, negzero,
                   s_max, s_split, s_magic, s_min_normal, ch * CHUNK, min(ch * CHUNK + CHUNK, nb), q6, q4, e6, e4, r6,
                   r4)


def e2m1_constants(mids, ups, vals):
    """(m, vl) for ``fos_range`` from ``block_fast.element_table``: float32 midpoints, each that a tie passes upward
    moved to the next float32 below it (so that ``v > m`` is ``v >= M`` there), and the float32 values."""
    m = mids.astype(np.float32)
    m = np.where(ups, np.nextafter(m, np.float32(0)), m).astype(np.float32)
    return m, vals.astype(np.float32)
