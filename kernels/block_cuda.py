"""numba-cuda kernel for block-scaled formats: one thread per block (grid-stride), calling the same scalar
cores as kernels/block_cpu.py, so the bits agree (stochastic rounding included: same seed and index).
Arrays as in block_cpu: (P, R, C) src/dst, (P, nbr, nbc) float64 scales. Runs under NUMBA_ENABLE_CUDASIM=1."""
import math

import numpy as np

from .cuda import _launch, cuda
from .scalar.block import block_scale, element_mbits, round_element
from .scalar.common import STOCHASTIC, random_bits


@cuda.jit
def block_kernel(src, dst, scales, tr, tc, kind, p0, p1, p2, emax_e, max_e, negzero, rule, lo, hi, s_man, s_emin,
                 s_sub, s_max, s_min, t, mode, key, nbits):
    P, R, C = src.shape
    nbr, nbc = scales.shape[1], scales.shape[2]
    per = nbr * nbc
    mbits = element_mbits(kind, p0, p2)
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for b in range(start, P * per, stride):
        p = b // per
        bi = (b % per) // nbc
        bj = b % nbc
        r0 = bi * tr
        r1 = min(r0 + tr, R)
        c0 = bj * tc
        c1 = min(c0 + tc, C)
        amax = 0.0
        has_nan = False
        for i in range(r0, r1):
            for j in range(c0, c1):
                v = np.float64(src[p, i, j])
                if v != v:
                    has_nan = True
                else:
                    amax = max(amax, abs(v))
        s = block_scale(amax, has_nan, rule, emax_e, max_e, lo, hi, s_man, s_emin, s_sub, s_max, s_min, t, mbits)
        scales[p, bi, bj] = s
        full = s * t
        for i in range(r0, r1):
            for j in range(c0, c1):
                if has_nan:
                    dst[p, i, j] = math.nan
                else:
                    rnd = random_bits(key, (p * R + i) * C + j, nbits) if mode == STOCHASTIC else np.uint64(0)
                    q = round_element(np.float64(src[p, i, j]) / full, kind, p0, p1, p2, max_e, negzero, mode,
                                      rnd, nbits)
                    dst[p, i, j] = q * full


def quantize_blocks(src, dst, scales, tile, args: tuple, mode: int, key: int, nbits: int, stream=None) -> None:
    """As ``block_cpu.quantize_blocks``; src/dst/scales are device arrays (or numpy arrays, copied)."""
    host = None
    if isinstance(dst, np.ndarray):
        host = (dst, scales)
        src = cuda.to_device(np.ascontiguousarray(src))
        dst = cuda.device_array(host[0].shape, host[0].dtype)
        scales = cuda.device_array(host[1].shape, np.float64)
    _launch(block_kernel, scales.size, stream, src, dst, scales, int(tile[0]), int(tile[1]), *args, int(mode),
            np.uint64(key), int(nbits))
    if host is not None:
        dst.copy_to_host(host[0])
        scales.copy_to_host(host[1])
