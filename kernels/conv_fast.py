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
from numba import njit

from . import _cache

_cache.guard(__file__, [])

from .gemm_fast import gemm_fast  # noqa: E402
from .im2col_cpu import im2col_cols  # noqa: E402


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
