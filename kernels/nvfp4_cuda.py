"""numba-cuda kernel of the NVFP4 family's per-row outer scales and 4/6 selection: one thread per block
(grid-stride) calling the cores of kernels/nvfp4_scalar.py, as kernels/nvfp4_cpu.py does, so the bits agree
(stochastic rounding included). Runs under NUMBA_ENABLE_CUDASIM=1."""
import importlib.util
import os

import numpy as np
from numba import config

from .cuda import _launch, cuda


def _plain_cores():
    """The cores as Python functions (a second copy of kernels/nvfp4_scalar.py with PLAIN_PYTHON set), for the
    simulator, whose fake device arrays compiled @njit functions cannot take."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nvfp4_scalar.py")
    spec = importlib.util.spec_from_file_location(f"{__package__}._nvfp4_scalar_plain", path)
    mod = importlib.util.module_from_spec(spec)
    mod.PLAIN_PYTHON = True
    spec.loader.exec_module(mod)
    return mod.fos_block, mod.row_block


if config.ENABLE_CUDASIM:
    fos_block, row_block = _plain_cores()
else:
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
