"""numba-cuda kernels for MAD units with a multiplier: the datapath of ``gemm_cuda`` (same tiles, counters and
scalar cores) with the product a*b replaced by ``multiplier_scalar.approx_product``, so every output has the
bits of ``gemm_approx`` on the CPU. CUDA kernels cannot take a function argument, so the kernels are built
per multiplier function (``kernels_for``; built-in and table multipliers share one pair) and compile on first
launch. A user function must compile as a CUDA device function (numba compiles the ``njit`` function for
the device); when it does not, ``ValueError`` names it.
"""
import math

import numpy as np
from numba import config

from .cuda import as_device_array, cuda, device_of, torch_stream
from .gemm_cpu import as_keys, as_params
from .gemm_scalar import S_ACC, S_BIAS, S_CHUNK, S_MUL, S_REDUCE, add_round, canonical_nan, reduce_lanes
from .multiplier_scalar import K_FUNCTION, approx_product, mac_product

TILE = 16
from .abi import MAX_LANES  # noqa: E402
MAX_GRID_Z = 65535
MAD_THREADS = 256
_KERNELS: dict = {}

if config.ENABLE_CUDASIM:  # the simulator hands kernels fake arrays, which njit code cannot take: unwrap them
    def _product(a, b, prm, lut, fn):
        return approx_product(a, b, prm, np.asarray(lut), fn)
else:
    _product = approx_product


def _build(fn):
    @cuda.jit
    def gemm_kernel(A, B, bias, has_bias, c, has_c, out, fused, mulp, accp, lanes, chunk, keys, nbits, prm, lut):
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
            if has_c and live:
                inner[0] = c[b, i, j]
            for k0 in range(0, K, TILE):
                As[ty, tx] = A[ab, i, k0 + tx] if (i < M and k0 + tx < K) else np.float32(0.0)
                Bs[ty, tx] = B[bb, k0 + ty, j] if (j < N and k0 + ty < K) else np.float32(0.0)
                cuda.syncthreads()
                if live:
                    for kt in range(min(TILE, K - k0)):
                        k = k0 + kt
                        lane = k % lanes
                        p = _product(As[ty, kt], Bs[kt, tx], prm, lut, fn)
                        inner[lane] = mac_product(p, inner[lane], fused, mulp, accp, keys[S_MUL], keys[S_ACC],
                                                  o * K + k, nbits)
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
    def mad_kernel(a, b, c, out, fused, mulp, accp, keys, nbits, prm, lut):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < out.size:
            p = _product(a[i], b[i], prm, lut, fn)
            out[i] = canonical_nan(mac_product(p, c[i], fused, mulp, accp, keys[S_MUL], keys[S_ACC], i, nbits))
            i += stride

    return gemm_kernel, mad_kernel


def kernels_for(prm, fn):
    """(gemm_kernel, mad_kernel) for a multiplier: one pair per user function, one for all other kinds."""
    key = fn if prm[0] == K_FUNCTION else None
    if key not in _KERNELS:
        _KERNELS[key] = _build(key)
    return _KERNELS[key]


def _launch(kernel, config, stream, fn, args):
    launch = kernel[config] if stream is None else kernel[config + (stream,)]
    try:
        launch(*args)
    except Exception as e:
        if fn is None or type(e).__module__.split(".")[0] != "numba":
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"Multiplier.function: {getattr(fn, '__name__', fn)} does not compile for CUDA: "
                         f"{first}") from None


def _margs(margs, to_device):
    prm, lut = margs
    return tuple(int(v) for v in prm), to_device(lut)


def gemm(A, B, bias, has_bias, c, has_c, out, fused, mulp, accp, lanes, chunk, keys, nbits, margs, fn=None,
         stream=None, to_device=np.array):
    """Launch the GEMM kernel: A (bA, M, K) / B (bB, K, N) float32, bias / c (nb, M, N) or (1, 1, 1) float64,
    out (nb, M, N) float64 (device arrays, or numpy arrays in the simulator); margs: ``Multiplier.kernel_args``."""
    if lanes > MAX_LANES:
        raise ValueError(f"lanes={lanes} is out of range; allowed: 1..{MAX_LANES}")
    nb, M, N = out.shape
    if nb == 0 or M == 0 or N == 0:
        return
    prm, lut = _margs(margs, to_device)
    kernel = kernels_for(prm, fn)[0]
    grid = (math.ceil(N / TILE), math.ceil(M / TILE), min(nb, MAX_GRID_Z))
    _launch(kernel, (grid, (TILE, TILE)), stream, fn if prm[0] == K_FUNCTION else None,
            (A, B, bias, has_bias, c, has_c, out, fused, as_params(mulp), as_params(accp), lanes, chunk,
             as_keys(keys), nbits, prm, lut))


def mad(a, b, c, out, fused, mulp, accp, keys, nbits, margs, fn=None, stream=None, to_device=np.array):
    """Launch the element-wise MAD kernel on flat arrays: a, b float32, c and out float64."""
    n = out.size
    if n == 0:
        return
    prm, lut = _margs(margs, to_device)
    kernel = kernels_for(prm, fn)[1]
    blocks = min(math.ceil(n / MAD_THREADS), 4096)
    _launch(kernel, (blocks, MAD_THREADS), stream, fn if prm[0] == K_FUNCTION else None,
            (a, b, c, out, fused, as_params(mulp), as_params(accp), as_keys(keys), nbits, prm, lut))


def _to_device_for(t):
    import torch

    return lambda x: as_device_array(torch.from_numpy(np.ascontiguousarray(x)).to(t.device))


def gemm_torch(A, B, bias, c, out, fused, mulp, accp, lanes, chunk, keys, nbits, margs, fn=None):
    """``gemm`` on contiguous CUDA tensors (bias, c: None or (nb, M, N) float64), on torch's current stream."""
    import torch

    dummy = torch.zeros((1, 1, 1), dtype=torch.float64, device=out.device)
    with device_of(out):
        gemm(as_device_array(A), as_device_array(B), as_device_array(dummy if bias is None else bias), bias is not None,
             as_device_array(dummy if c is None else c), c is not None, as_device_array(out), fused, mulp, accp,
             lanes, chunk, keys, nbits, margs, fn, stream=torch_stream(out.device), to_device=_to_device_for(out))


def mad_torch(a, b, c, out, fused, mulp, accp, keys, nbits, margs, fn=None):
    """``mad`` on flat contiguous CUDA tensors, on torch's current stream of their device."""
    with device_of(out):
        mad(as_device_array(a), as_device_array(b), as_device_array(c), as_device_array(out), fused, mulp, accp,
            keys, nbits, margs, fn, stream=torch_stream(out.device), to_device=_to_device_for(out))
