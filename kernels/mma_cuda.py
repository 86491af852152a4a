"""numba-cuda kernel of the matrix-instruction datapaths: the CPU kernel's scalar cores (``mma_scalar``), one
thread per output element, so every output has the CPU's bits. Under ``NUMBA_ENABLE_CUDASIM=1`` it runs in
numba's simulator (CI)."""
import math

import numpy as np

from .cuda import cuda
from .mma_scalar import dot

TILE = 16


@cuda.jit
def gemm_kernel(A, BT, SA, SBT, C, out, prm):
    j = cuda.blockIdx.x * TILE + cuda.threadIdx.x
    i = cuda.blockIdx.y * TILE + cuda.threadIdx.y
    M, N = out.shape
    if i < M and j < N:
        out[i, j] = dot(A[i], BT[j], SA[i], SBT[j], A.shape[1], np.float64(C[i, j]), prm)


def gemm(A, BT, SA, SBT, C, out, prm):
    """Launch ``gemm_kernel`` on device arrays or numpy arrays (copied by numba; the simulator's way)."""
    M, N = out.shape
    if M == 0 or N == 0:
        return
    grid = (math.ceil(N / TILE), math.ceil(M / TILE))
    gemm_kernel[grid, (TILE, TILE)](A, BT, SA, SBT, C, out, tuple(int(v) for v in prm))
