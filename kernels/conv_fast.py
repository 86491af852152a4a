"""A 2-D convolution's GEMMs on ``gemm_fast``, one sample at a time, each sample's im2col columns made into one
buffer that its GEMM then reads while it is in the cache.

``conv_fast(x, A, rows, has_bias, out, <gemm_fast's unit and plan arguments>, tm, kh, kw, sh, sw, dh, dw, Ho, Wo)``:
x (N, C, H, W) float32, already padded; A (G, O/G, K) with K = C/G * kh * kw, the weight matrix of each group;
out (N*G, O/G, Ho*Wo) float64, written: out[n*G + g] = A[g] @ columns of sample n, group g (+ rows[g]), where
the columns are ``im2col_cpu.im2col_cols``' (per sample: (C*kh*kw, Ho*Wo), i.e. (G, K, Ho*Wo)); rows: the bias
(G, O/G, Ho*Wo) float64 that every sample's GEMM adds (read where has_bias), read-only like the bias
``gemm_cpu`` hands over, so that one compiled ``gemm_fast`` serves both. These are the GEMMs of ``gemm_cpu.gemm``
on the whole (N*G, K, Ho*Wo) column tensor, hence the same bits: ``gemm_fast`` computes every output element
alone, whatever the batch it is in. Against that one call, the columns (tens of MB for a batch of images) stay
in the cache (measured on the cnn2d step: benchmarks/RESULTS.md)."""
import numpy as np
from numba import njit, prange

from . import _cache

_cache.guard(__file__, [])

from .gemm_fast import TN, _exact_span, close_chunk, finish_tile, gemm_fast  # noqa: E402
from .gemm_scalar import tile_of  # noqa: E402
from .im2col_cpu import im2col_cols  # noqa: E402
from .wide import prefer_wide_vectors  # noqa: E402


@njit(cache=True)
def conv_fast(x, A, rows, has_bias, out, mulf, accf, acc64, lanes, chunk, mul_sub, acc_sub, checks, mul_exact, tm,
              kh, kw, sh, sw, dh, dw, Ho, Wo):
    N, C = x.shape[0], x.shape[1]
    G, Og, K = A.shape
    L = Ho * Wo
    cols = np.empty((G, K, L), x.dtype)
    for n in range(N):
        im2col_cols(x[n:n + 1], cols, kh, kw, sh, sw, dh, dw, Ho, Wo, C * kh * kw * L, L)
        gemm_fast(A, cols, rows, has_bias, out[n * G:(n + 1) * G], mulf, accf, acc64, lanes, chunk, mul_sub, acc_sub,
                  checks, mul_exact, tm)


@njit(cache=True, parallel=True)
def wgrad_fast(g, x, taps, out, accf, acc64, lanes, chunk, tm, sh, sw, Wo):
    """A convolution's weight gradient (one group) on ``gemm_fast``'s exact-product path, without its operands'
    layouts: out (1, O, Kc) float64, out[0, o, c] = the dot over k = (n, oy, ox) in C order of g[n, o, oy*Wo + ox]
    times x's tap c at that position, x.ravel()[n*C*H*W + oy*sh*W + ox*sw + taps[c]] (taps: each im2col column's
    offset, ``conv._patch_rows``' columns). That is ``gemm_fast`` on A = g as (O, N*L) and B = the im2col rows
    (N*L, Kc), for a unit and operands whose plan has exact products, no subnormal sums and no checks, in float32,
    with chunk > 0; the same bits (each output element alone, its terms in increasing k). Each tile copies a
    span's terms of both operands into panels first (``_exact_span`` reads them at offset kk), so that neither
    operand is laid out in memory (the rows were the batch's im2col matrix: 37 MB on cnn2d's second layer)."""
    N, O, L = g.shape
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    Kc = taps.size
    K = N * L
    xf = x.ravel()
    ti, tj = (O + tm - 1) // tm, (Kc + TN - 1) // TN
    span = chunk * lanes
    for t in prange(ti * tj):
        prefer_wide_vectors()
        b, i0, i1, j0, nj, _, _ = tile_of(t, O, Kc, 1, 1, tm, TN)
        rows = i1 - i0
        inner = np.zeros((rows, lanes, TN), g.dtype)
        outer = np.zeros((rows, lanes, TN), g.dtype)
        spare = np.zeros(TN, g.dtype)
        ap = np.empty((1, rows, span), g.dtype)
        bp = np.empty((1, span, TN), g.dtype)
        for kk in range(0, K, span):
            kend = min(K, kk + span)
            n = kk // L
            l0 = kk - n * L
            oy = l0 // Wo
            ox = l0 - oy * Wo
            for q in range(kend - kk):  # positions kk.. in C order, (n, oy, ox) counted on
                base = n * C * H * W + oy * sh * W + ox * sw
                for r in range(rows):
                    ap[0, r, q] = g[n, i0 + r, oy * Wo + ox]
                brow = bp[0, q]
                for jj in range(nj):
                    brow[jj] = xf[base + taps[j0 + jj]]
                ox += 1
                if ox == Wo:
                    ox = 0
                    oy += 1
                    if oy * Wo == L:
                        oy = 0
                        n += 1
            _exact_span(ap, bp, kk, kk, inner, spare, 0, 0, 0, rows, 0, nj, kk, kend, lanes, accf)
            close_chunk(inner, outer, rows, lanes, nj, accf, False, False)
        finish_tile(outer, out, b, i0, rows, j0, nj, lanes, out, False, accf, acc64, False, False)

