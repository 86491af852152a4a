"""im2col and col2im of a 2-D convolution for float32 CPU tensors, in the GEMM's row layout (one row per output
position, one column per input channel and kernel tap), as the block GEMMs of emunum/nn/block_gemm.py take it.

``im2col(x, out, ...)``: x (N, C, H, W) C-contiguous, out (N*Ho*Wo, C*kh*kw) C-contiguous; row (n, oy, ox),
column (c, i, j) holds x[n, c, oy*sh - ph + i*dh, ox*sw - pw + j*dw], +0.0 outside x: the values of
``F.unfold(x, ...).transpose(1, 2).reshape(-1, C*kh*kw)``, copied as bits (a NaN's payload included), in one
pass instead of two.

``col2im(g, out, ...)``: the adjoint, out (N, C, H, W) = ``F.fold(g.view(N, L, K).transpose(1, 2), ...)`` bit
for bit. torch's col2im (aten/src/ATen/native/im2col.h) zero-fills the image and then adds the columns in
order of c_col = (c*kh + i)*kw + j, so each pixel receives its terms in ascending (i, j), each added once, in
float32, starting from +0.0. Here the image is zero-filled as well and the rows are added in descending
(oy, ox), each row's contiguous columns in turn: a pixel's term from tap (i, j) comes from row
oy = (y + ph - i*dh) / sh, ox = (x + pw - j*dw) / sw, so ascending (i, j) is descending (oy, ox), and every
pixel receives the same terms in the same order (a sum of -0.0 terms is +0.0 in both).

Both loops take the rows whose every tap lies inside the image without per-tap bounds checks (the same
copies and additions in the same order).
"""
import numpy as np
from numba import njit

from . import _cache

_cache.guard(__file__, [])

U64 = np.uint64


@njit(cache=True)
def im2col(x, out, kh, kw, sh, sw, dh, dw, ph, pw, Ho, Wo):
    N, C, H, W = x.shape
    xb = x.view(np.uint32)
    ob = out.view(np.uint32)
    for n in range(N):
        for oy in range(Ho):
            y0 = oy * sh - ph
            inside_y = y0 >= 0 and y0 + (kh - 1) * dh < H
            for ox in range(Wo):
                row = ob[U64((n * Ho + oy) * Wo + ox)]
                x0 = ox * sw - pw
                if inside_y and x0 >= 0 and x0 + (kw - 1) * dw < W:  # every tap inside x: no bounds checks
                    for c in range(C):
                        for i in range(kh):
                            src = xb[U64(n), U64(c), U64(y0 + i * dh)]
                            k0 = (c * kh + i) * kw
                            for j in range(kw):
                                row[U64(k0 + j)] = src[U64(x0 + j * dw)]
                    continue
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
def col2im(g, out, kh, kw, sh, sw, dh, dw, ph, pw, Ho, Wo):
    N, C, H, W = out.shape
    for n in range(N):
        img = out[n]
        img[:] = 0.0
        for oy in range(Ho - 1, -1, -1):  # rows in descending order: each pixel's terms in ascending (i, j)
            y0 = oy * sh - ph
            inside_y = y0 >= 0 and y0 + (kh - 1) * dh < H
            for ox in range(Wo - 1, -1, -1):
                row = g[U64((n * Ho + oy) * Wo + ox)]
                x0 = ox * sw - pw
                if inside_y and x0 >= 0 and x0 + (kw - 1) * dw < W:  # every tap inside the image
                    for c in range(C):
                        for i in range(kh):
                            dst = img[U64(c), U64(y0 + i * dh)]
                            k0 = (c * kh + i) * kw
                            for j in range(kw):
                                dst[U64(x0 + j * dw)] += row[U64(k0 + j)]
                    continue
                for c in range(C):
                    for i in range(kh):
                        y = oy * sh - ph + i * dh
                        if 0 <= y < H:
                            for j in range(kw):
                                xx = ox * sw - pw + j * dw
                                if 0 <= xx < W:
                                    img[U64(c), U64(y), U64(xx)] += row[U64((c * kh + i) * kw + j)]
