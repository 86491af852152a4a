"""numba-cuda kernel of the multi-term (tensor-core) datapath and of exact accumulation.

The same scalar cores as the CPU kernel (``multiterm_scalar``), one thread per output element, so every
output has the CPU's bits. B arrives transposed, (bB, N, K). Batches run over grid z (grid-stride beyond
65535). Needs numba-cuda; under ``NUMBA_ENABLE_CUDASIM=1`` it runs in numba's simulator (CI).
"""
import math

import numpy as np

from .cuda import as_device_array, cuda, device_of, torch_stream
from .gemm_cpu import as_keys, as_params
from .gemm_scalar import S_ACC, S_BIAS, add_round
from .multiterm_scalar import (
    NLIMB, T_IN_EMIN, T_KIND, T_PROMOTE, T_TERMS, exact_accumulate, exact_result, fused_step, is_promotion_point,
    kul_clear, product, promote,
)

TILE = 16
from .abi import MAX_TERMS  # noqa: E402
MAX_GRID_Z = 65535


@cuda.jit
def gemm_kernel(A, BT, C, bias, has_bias, out, prm, mulp, accp, outerp, keys, nbits):
    limbs = cuda.local.array(NLIMB, np.int64)
    av = cuda.local.array(MAX_TERMS, np.float32)
    bv = cuda.local.array(MAX_TERMS, np.float32)
    j = cuda.blockIdx.x * TILE + cuda.threadIdx.x
    i = cuda.blockIdx.y * TILE + cuda.threadIdx.y
    nb, M, N = out.shape[0], out.shape[1], out.shape[2]
    K = A.shape[2]
    n = prm[T_TERMS]
    if i >= M or j >= N:
        return
    b = cuda.blockIdx.z
    while b < nb:
        ab = b % A.shape[0]
        bb = b % BT.shape[0]
        o = (b * M + i) * N + j
        if prm[T_KIND] == 1:
            kul_clear(limbs)
            sp, has = exact_accumulate(limbs, C[b, i, j], 0.0, False)
            if has_bias:
                sp, has = exact_accumulate(limbs, bias[b, i, j], sp, has)
            for k in range(K):
                p, e = product(A[ab, i, k], BT[bb, j, k], prm[T_IN_EMIN], prm, mulp)
                sp, has = exact_accumulate(limbs, p, sp, has)
            out[b, i, j] = exact_result(limbs, sp, has, accp, keys[S_ACC], o, nbits)
        else:
            acc = C[b, i, j]
            outer = 0.0
            k0 = 0
            while k0 < K or (K == 0 and k0 == 0):
                k1 = min(K, k0 + n)
                for q in range(k1 - k0):
                    av[q] = A[ab, i, k0 + q]
                    bv[q] = BT[bb, j, k0 + q]
                acc = fused_step(av, bv, k1 - k0, acc, prm, mulp, accp, limbs)
                if is_promotion_point(k1, K, prm):
                    outer = promote(outer, acc, outerp)
                    acc = 0.0
                k0 = k1 if k1 > k0 else k0 + 1
            if prm[T_PROMOTE] > 0:
                acc = outer
                if has_bias:
                    acc = add_round(acc, bias[b, i, j], outerp, keys[S_BIAS], o, nbits)
            elif has_bias:
                acc = add_round(acc, bias[b, i, j], accp, keys[S_BIAS], o, nbits)
            out[b, i, j] = acc
        b += cuda.gridDim.z


def gemm(A, BT, C, bias, has_bias, out, prm, mulp, accp, outerp, keys, nbits, stream=None):
    """Launch ``gemm_kernel``: A (bA, M, K) / BT (bB, N, K) float32, C and out (nb, M, N) float64, bias
    (nb, M, N) or (1, 1, 1) float64: device arrays, or numpy arrays (copied by numba; the simulator's way)."""
    nb, M, N = out.shape
    if nb == 0 or M == 0 or N == 0:
        return
    grid = (math.ceil(N / TILE), math.ceil(M / TILE), min(nb, MAX_GRID_Z))
    launch = gemm_kernel[grid, (TILE, TILE)] if stream is None else gemm_kernel[grid, (TILE, TILE), stream]
    launch(A, BT, C, bias, has_bias, out, as_params(prm), as_params(mulp), as_params(accp), as_params(outerp),
           as_keys(keys), nbits)


def gemm_torch(A, BT, C, bias, has_bias, out, prm, mulp, accp, outerp, keys, nbits):
    """``gemm`` on contiguous CUDA tensors (zero-copy views), on torch's current stream of their device."""
    with device_of(out):
        gemm(as_device_array(A), as_device_array(BT), as_device_array(C), as_device_array(bias), has_bias,
             as_device_array(out), prm, mulp, accp, outerp, keys, nbits, stream=torch_stream(out.device))
