"""numba-cuda kernel of the NVFP4 family's per-row outer scales and 4/6 selection: one thread per block
(grid-stride) calling the cores of kernels/nvfp4_scalar.py, as kernels/nvfp4_cpu.py does, so the bits agree
(stochastic rounding included). Runs under NUMBA_ENABLE_CUDASIM=1."""
import numpy as np

from .cuda import _launch, cuda
from .nvfp4_scalar import fos_block, row_block


@cuda.jit
def nvfp4_kernel(src, dst, scales, tr, tc, fos, t, ges, gds, gamax, denom, metric, kind, p0, p1, p2, emax_e, max_e,
                 negzero, rule, lo, hi, s_man, s_emin, s_sub, s_max, s_min, mode, key, nbits):
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for b in range(start, scales.size, stride):
        if fos:
            fos_block(src, dst, scales, b, tr, tc, ges, gds, gamax, denom, metric, p0, p1, p2, max_e, negzero, s_man,
                      s_emin, s_sub, s_max, mode, key, nbits)
        else:
            row_block(src, dst, scales, b, tr, tc, t, kind, p0, p1, p2, emax_e, max_e, negzero, rule, lo, hi, s_man,
                      s_emin, s_sub, s_max, s_min, mode, key, nbits)


def quantize_nvfp4(src, dst, scales, tile, lines: tuple, args: tuple, mode: int, key: int, nbits: int,
                   stream=None) -> None:
    """As ``nvfp4_cpu.quantize_nvfp4``; src/dst/scales and the per-row arrays in ``lines`` are device arrays."""
    _launch(nvfp4_kernel, scales.size, stream, src, dst, scales, int(tile[0]), int(tile[1]), *lines, *args, int(mode),
            np.uint64(key), int(nbits))
