"""numba-cuda kernel of the matrix-instruction datapaths: the CPU kernel's scalar cores (``mma_scalar``), one
thread per output element, so every output has the CPU's bits. Each step's operands and scales are copied
into thread-local arrays first (the cores index them from 0). Under ``NUMBA_ENABLE_CUDASIM=1`` it runs in
numba's simulator (CI)."""
import math

import numpy as np

from .cuda import cuda
from .mma_scalar import BLOCK, TERMS, step

TILE = 16
MAX_STEP = 64  # the widest instruction step (kind::mxf4nvf4); ``MMAUnit`` refuses wider ones


@cuda.jit
def gemm_kernel(A, BT, SA, SBT, C, out, prm):
    av = cuda.local.array(MAX_STEP, np.float32)
    bv = cuda.local.array(MAX_STEP, np.float32)
    sav = cuda.local.array(MAX_STEP, np.float32)
    sbv = cuda.local.array(MAX_STEP, np.float32)
    j = cuda.blockIdx.x * TILE + cuda.threadIdx.x
    i = cuda.blockIdx.y * TILE + cuda.threadIdx.y
    M, N = out.shape
    if i >= M or j >= N:
        return
    K = A.shape[1]
    n = prm[TERMS]
    blk = prm[BLOCK]
    acc = np.float64(C[i, j])
    k0 = 0
    while k0 < K:
        k1 = min(K, k0 + n)
        for q in range(k1 - k0):
            av[q] = A[i, k0 + q]
            bv[q] = BT[j, k0 + q]
        if blk > 0:  # k0 is a multiple of the block (steps are whole blocks)
            for q in range((k1 - k0 + blk - 1) // blk):
                sav[q] = SA[i, k0 // blk + q]
                sbv[q] = SBT[j, k0 // blk + q]
        acc = step(av, bv, sav, sbv, 0, k1 - k0, acc, prm)
        k0 = k1
    out[i, j] = acc


def gemm(A, BT, SA, SBT, C, out, prm):
    """Launch ``gemm_kernel`` on device arrays or numpy arrays (copied by numba; the simulator's way)."""
    M, N = out.shape
    if M == 0 or N == 0:
        return
    grid = (math.ceil(N / TILE), math.ceil(M / TILE))
    gemm_kernel[grid, (TILE, TILE)](A, BT, SA, SBT, C, out, tuple(int(v) for v in prm))
