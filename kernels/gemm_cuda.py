"""numba-cuda kernels for emulated multiply-accumulate: batched GEMM and the element-wise MAD.

Same datapath and the same scalar cores as ``gemm_cpu.gemm_general`` (``gemm_scalar.mac``, ``add_round``,
``reduce_lanes``), so every output has the CPU's bits, stochastic rounding included (same seed, same
counters). The GEMM kernel: one thread per output element, blocks of TILE x TILE threads; A and B are staged
through shared-memory tiles of TILE x TILE (TILE terms of k per step); each thread keeps its lanes' inner and
outer accumulators in registers (local arrays) and counts k to close chunks. Batches run over grid z
(grid-stride beyond 65535). Products are exact in binary64 (float32 operands), so an FMA contraction by the
compiler (a*b + acc fused) gives the same value as the separate operations: the arithmetic is unchanged.

Needs numba-cuda (``kernels.cuda`` raises a clear ImportError without it). Under ``NUMBA_ENABLE_CUDASIM=1``
the kernels run in numba's simulator on numpy arrays (CI). Kernels compile on first launch.
"""
import math

import numpy as np

from .cuda import as_device_array, cuda, device_of, torch_stream
from .gemm_cpu import as_keys, as_params
from .gemm_scalar import S_ACC, S_BIAS, S_CHUNK, S_MUL, S_REDUCE, add_round, canonical_nan, mac, reduce_lanes

TILE = 16
from .abi import MAX_LANES  # noqa: E402
MAX_GRID_Z = 65535
MAD_THREADS = 256


@cuda.jit
def gemm_kernel(A, B, bias, has_bias, out, fused, mulp, accp, lanes, chunk, keys, nbits):
    """out[b] = A[b % bA] @ B[b % bB] (+ bias[b]); A, B float32, bias/out float64 (see ``gemm_cpu.gemm``)."""
    As = cuda.shared.array((TILE, TILE), np.float32)
    Bs = cuda.shared.array((TILE, TILE), np.float32)
    inner = cuda.local.array(MAX_LANES, np.float64)
    outer = cuda.local.array(MAX_LANES, np.float64)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    j = cuda.blockIdx.x * TILE + tx
    i = cuda.blockIdx.y * TILE + ty
    nb = out.shape[0]
    M = out.shape[1]
    N = out.shape[2]
    K = A.shape[2]
    span = chunk * lanes if chunk > 0 else K + 1
    live = i < M and j < N
    b = cuda.blockIdx.z
    while b < nb:
        ab = b % A.shape[0]
        bb = b % B.shape[0]
        o = (b * M + i) * N + j
        for lane in range(lanes):
            inner[lane] = 0.0
            outer[lane] = 0.0
        for k0 in range(0, K, TILE):
            As[ty, tx] = A[ab, i, k0 + tx] if (i < M and k0 + tx < K) else np.float32(0.0)
            Bs[ty, tx] = B[bb, k0 + ty, j] if (j < N and k0 + ty < K) else np.float32(0.0)
            cuda.syncthreads()
            if live:
                for kt in range(min(TILE, K - k0)):
                    k = k0 + kt
                    lane = k % lanes
                    inner[lane] = mac(As[ty, kt], Bs[kt, tx], inner[lane], fused, mulp, accp, keys[S_MUL],
                                      keys[S_ACC], o * K + k, nbits)
                    if chunk > 0 and ((k + 1) % span == 0 or k == K - 1):
                        kk = (k // span) * span
                        for q in range(lanes):
                            outer[q] = add_round(outer[q], inner[q], accp, keys[S_CHUNK], o * K + kk + q, nbits)
                            inner[q] = 0.0
            cuda.syncthreads()
        if live:
            if chunk > 0:
                y = reduce_lanes(outer, lanes, accp, keys[S_REDUCE], o, nbits)
            else:
                y = reduce_lanes(inner, lanes, accp, keys[S_REDUCE], o, nbits)
            if has_bias:
                y = add_round(y, bias[b, i, j], accp, keys[S_BIAS], o, nbits)
            out[b, i, j] = canonical_nan(y)
        b += cuda.gridDim.z


@cuda.jit
def mad_kernel(a, b, c, out, fused, mulp, accp, keys, nbits):
    """out[i] = the one-step MAD of (a[i], b[i], c[i]); grid-stride over the flat arrays."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < out.size:
        out[i] = canonical_nan(mac(a[i], b[i], c[i], fused, mulp, accp, keys[S_MUL], keys[S_ACC], i, nbits))
        i += stride


def gemm(A, B, bias, has_bias, out, fused, mulp, accp, lanes, chunk, keys, nbits, stream=None):
    """Launch ``gemm_kernel``. A (bA, M, K) / B (bB, K, N) float32, bias (nb, M, N) or (1, 1, 1) float64,
    out (nb, M, N) float64: device arrays, or numpy arrays (copied by numba; the simulator's way)."""
    if lanes > MAX_LANES:
        raise ValueError(f"lanes={lanes} is out of range; allowed: 1..{MAX_LANES}")
    nb, M, N = out.shape
    if nb == 0 or M == 0 or N == 0:
        return
    grid = (math.ceil(N / TILE), math.ceil(M / TILE), min(nb, MAX_GRID_Z))
    launch = gemm_kernel[grid, (TILE, TILE)] if stream is None else gemm_kernel[grid, (TILE, TILE), stream]
    launch(A, B, bias, has_bias, out, fused, as_params(mulp), as_params(accp), lanes, chunk, as_keys(keys), nbits)


def mad(a, b, c, out, fused, mulp, accp, keys, nbits, stream=None):
    """Launch ``mad_kernel`` on flat arrays: a, b float32, c and out float64 (device or numpy)."""
    n = out.size
    if n == 0:
        return
    blocks = min(math.ceil(n / MAD_THREADS), 4096)
    launch = mad_kernel[blocks, MAD_THREADS] if stream is None else mad_kernel[blocks, MAD_THREADS, stream]
    launch(a, b, c, out, fused, as_params(mulp), as_params(accp), as_keys(keys), nbits)


def gemm_torch(A, B, bias, has_bias, out, fused, mulp, accp, lanes, chunk, keys, nbits):
    """``gemm`` on CUDA tensors (contiguous; zero-copy views), on torch's current stream of their device."""
    with device_of(out):
        gemm(as_device_array(A), as_device_array(B), as_device_array(bias), has_bias, as_device_array(out), fused,
             mulp, accp, lanes, chunk, keys, nbits, stream=torch_stream(out.device))


def mad_torch(a, b, c, out, fused, mulp, accp, keys, nbits):
    """``mad`` on flat contiguous CUDA tensors, on torch's current stream of their device."""
    with device_of(out):
        mad(as_device_array(a), as_device_array(b), as_device_array(c), as_device_array(out), fused, mulp, accp,
            keys, nbits, stream=torch_stream(out.device))
