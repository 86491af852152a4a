"""im2col and col2im of a 2-D convolution for float32 CPU tensors, in the GEMM's row layout (one row per output
position, one column per input channel and kernel tap), as the block GEMMs of emunum/nn/block_gemm.py take it.

``im2col(x, out, ...)``: x (N, C, H, W) C-contiguous, out (N*Ho*Wo, C*kh*kw) C-contiguous; row (n, oy, ox),
column (c, i, j) holds x[n, c, oy*sh - ph + i*dh, ox*sw - pw + j*dw], +0.0 outside x: the values of
``F.unfold(x, ...).transpose(1, 2).reshape(-1, C*kh*kw)``, copied as bits (a NaN's payload included), in one
pass instead of two.

``im2col_cols(x, out, kh, kw, sh, sw, dh, dw, Ho, Wo, sn, sk)``: the same values in the column layout of the MAD
GEMMs (``emunum/mad/conv.py``), without padding: element (n, k = (c, i, j), l = (oy, ox)) of out (flat, C-contiguous)
at n*sn + k*sk + l holds x[n, c, oy*sh + i*dh, ox*sw + j*dw], copied as bits. sn = K*L, sk = L: (N, K, L), one
matrix per sample, i.e. ``F.unfold(x, ...)``; sn = L, sk = N*L: (K, N*L), every sample side by side. With sw = 1
each output row (n, k, oy) is one contiguous run of x's row: a copy loop (about as fast as torch's copy of the
strided view on a large batch, up to 2.8x faster on small ones: benchmarks/RESULTS.md "Stop 56");
``kernels/conv_fast.py`` calls it per sample, into a buffer that stays in the cache.

``col2im(g, out, ...)``: the adjoint, g (N*L, K) and out (N, C, H, W) C-contiguous, out = ``F.fold(g.view(N, L,
K).transpose(1, 2), ...)`` bit for bit. torch's col2im (aten/src/ATen/native/im2col.h) zero-fills the image and
then adds the columns in order of c_col = (c*kh + i)*kw + j, so each pixel receives its terms in ascending (i, j),
each added once, in float32, starting from +0.0. Here the image is zero-filled as well and the output rows oy are
taken in descending order; for each, every (c, i, j) in ascending order adds its column of the row's Wo gradient
rows into image row y = oy*sh - ph + i*dh along x = ox*sw - pw + j*dw (ox over the pixels inside the image). A
pixel's term from tap (i, j) comes from oy = (y + ph - i*dh) / sh, so its terms of larger i come in later (smaller)
output rows, and its terms of one i, all from one output row, in ascending j: every pixel receives the same terms
in the same order (a sum of -0.0 terms is +0.0 in both).

im2col takes the rows whose every tap lies inside the image through a table of the taps' offsets in x (column k's
source is x's flat element at the row's first tap plus ``taps[k]``), without per-tap bounds checks: the same copies
in the same order, one load per element instead of a loop per (c, i) over a view of x's row (measured, 64 x 16 x
32 x 32 images, 3x3 kernel, one thread: 12.1-12.5 -> 7.2-7.6 ms; benchmarks/RESULTS.md).
"""
import numpy as np
from numba import njit

from . import _cache

_cache.guard(__file__, [])

U64 = np.uint64
ABS = np.uint32(0x7FFFFFFF)
INF_BITS = np.uint32(0x7F800000)


@njit(inline="always")
def _im2col(x, out, kh, kw, sh, sw, dh, dw, ph, pw, Ho, Wo, amaxes, tc):
    N, C, H, W = x.shape
    xb = x.view(np.uint32)
    xf = xb.ravel()
    ob = out.view(np.uint32)
    K = C * kh * kw
    taps = np.empty(K, np.uint64)  # column (c, i, j)'s offset in x from the row's tap (0, 0, 0)
    for c in range(C):
        for i in range(kh):
            for j in range(kw):
                taps[(c * kh + i) * kw + j] = U64((c * H + i * dh) * W + j * dw)
    nbc = -(-K // tc) if amaxes.size else 0
    fin = np.uint32(0)
    for n in range(N):
        for oy in range(Ho):
            y0 = oy * sh - ph
            inside_y = y0 >= 0 and y0 + (kh - 1) * dh < H
            for ox in range(Wo):
                row = ob[U64((n * Ho + oy) * Wo + ox)]
                x0 = ox * sw - pw
                if inside_y and x0 >= 0 and x0 + (kw - 1) * dw < W:  # every tap inside x: no bounds checks
                    s0 = U64((n * C * H + y0) * W + x0)
                    for k in range(K):
                        row[U64(k)] = xf[s0 + taps[k]]
                else:
                    _edge_row(xb, row, n, oy, ox, C, H, W, kh, kw, sh, sw, dh, dw, ph, pw)
                for b in range(nbc):  # the row is in cache: its blocks' largest |v| (block_fast's amax pass)
                    m = np.uint32(0)
                    for k in range(b * tc, min(b * tc + tc, K)):
                        u = np.uint32(row[U64(k)] & ABS)
                        m = max(m, u)
                        fin = max(fin, u if u < INF_BITS else np.uint32(0))
                    amaxes[U64(((n * Ho + oy) * Wo + ox) * nbc + b)] = np.float64(np.uint32(m).view(np.float32))
    return fin


@njit(inline="always")
def _edge_row(xb, row, n, oy, ox, C, H, W, kh, kw, sh, sw, dh, dw, ph, pw):
    """Row (n, oy, ox) of a position with taps outside x (+0.0 there)."""
    for c in range(C):
        for i in range(kh):
            y = oy * sh - ph + i * dh
            for j in range(kw):
                xx = ox * sw - pw + j * dw
                k = U64((c * kh + i) * kw + j)
                if 0 <= y < H and 0 <= xx < W:
                    row[k] = xb[U64(n), U64(c), U64(y), U64(xx)]
                else:
                    row[k] = np.uint32(0)


@njit(cache=True)
def im2col(x, out, kh, kw, sh, sw, dh, dw, ph, pw, Ho, Wo):
    _im2col(x, out, kh, kw, sh, sw, dh, dw, ph, pw, Ho, Wo, np.empty(0, np.float64), 1)


@njit(cache=True)
def im2col_scan(x, out, kh, kw, sh, sw, dh, dw, ph, pw, Ho, Wo, amaxes, tc):
    """``im2col``, and each block of tc along out's rows: its largest |v| (NaN where it holds one) into amaxes
    (float64, one per block, row-major); returns the bits of out's largest finite |v| (0 if none): what
    ``block_cpu.block_amaxes`` finds in out."""
    return _im2col(x, out, kh, kw, sh, sw, dh, dw, ph, pw, Ho, Wo, amaxes, tc)


@njit(cache=True)
def im2col_cols(x, out, kh, kw, sh, sw, dh, dw, Ho, Wo, sn, sk):
    N, C, H, W = x.shape
    xf = x.view(np.uint32).ravel()
    of = out.view(np.uint32).ravel()
    for n in range(N):
        for c in range(C):
            for i in range(kh):
                for j in range(kw):
                    k = (c * kh + i) * kw + j
                    d0 = n * sn + k * sk
                    for oy in range(Ho):
                        s0 = ((n * C + c) * H + oy * sh + i * dh) * W + j * dw
                        d = U64(d0 + oy * Wo)
                        if sw == 1:  # one contiguous run (a loop of its own, so that it vectorises)
                            for ox in range(Wo):
                                of[d + U64(ox)] = xf[U64(s0 + ox)]
                        else:
                            for ox in range(Wo):
                                of[d + U64(ox)] = xf[U64(s0 + ox * sw)]


@njit(cache=True)
def col2im(g, out, kh, kw, sh, sw, dh, dw, ph, pw, Ho, Wo):
    N, C, H, W = out.shape
    K = C * kh * kw
    # per tap column j: the offset off (pixel x = ox * sw + off) and the output columns [lo, hi) whose pixel lies in
    # the image, made once (two integer divisions per (oy, c, i, j) before: ~15% of the kernel, measured)
    offs = np.empty(kw, np.int64)
    los = np.empty(kw, np.int64)
    his = np.empty(kw, np.int64)
    for j in range(kw):
        off = j * dw - pw
        offs[j] = off
        los[j] = max(0, -(off // sw)) if off < 0 else 0
        his[j] = min(Wo, (W - 1 - off) // sw + 1) if W - 1 - off >= 0 else 0
    gf = g.ravel()
    of = out.ravel()
    for n in range(N):
        of[U64(n * C * H * W):U64((n + 1) * C * H * W)] = 0.0
        for oy in range(Ho - 1, -1, -1):  # descending: a pixel's terms in ascending i (module doc)
            gb = (n * Ho + oy) * Wo * K  # this output row's gradient rows (in cache while they are added)
            for c in range(C):
                for i in range(kh):
                    y = oy * sh - ph + i * dh
                    if y < 0 or y >= H:
                        continue
                    db = ((n * C + c) * H + y) * W
                    k0 = (c * kh + i) * kw
                    for j in range(kw):  # ascending: a pixel's terms of one i in ascending j
                        src = gb + k0 + j
                        d0 = db + offs[j]
                        if sw == 1:  # contiguous pixels (a loop of its own: ~20% faster, measured)
                            for ox in range(los[j], his[j]):
                                of[U64(d0 + ox)] += gf[U64(src + ox * K)]
                        else:
                            for ox in range(los[j], his[j]):
                                of[U64(d0 + ox * sw)] += gf[U64(src + ox * K)]
