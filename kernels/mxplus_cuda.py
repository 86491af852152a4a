"""numba-cuda kernel of the MX+ block formats: one thread per block (grid-stride) calling the core of
kernels/mxplus_scalar.py, as kernels/mxplus_cpu.py does, so the bits agree (stochastic rounding included).
Runs under NUMBA_ENABLE_CUDASIM=1."""
import importlib.util
import os

import numpy as np
from numba import config

from .cuda import _launch, cuda


def _plain_core():
    """The core as a Python function (a second copy of kernels/mxplus_scalar.py with PLAIN_PYTHON set), for
    the simulator, whose fake device arrays compiled @njit functions cannot take."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mxplus_scalar.py")
    spec = importlib.util.spec_from_file_location(f"{__package__}._mxplus_scalar_plain", path)
    mod = importlib.util.module_from_spec(spec)
    mod.PLAIN_PYTHON = True
    spec.loader.exec_module(mod)
    return mod.mxplus_block


if config.ENABLE_CUDASIM:
    mxplus_block = _plain_core()
else:
    from .mxplus_scalar import mxplus_block


@cuda.jit
def mxplus_kernel(src, dst, scales, tr, tc, man, emin, sub, emax_e, max_e, negzero, lo, hi, pbits, split, magic,
                  min_normal, mode, key, nbits):
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for b in range(start, scales.size, stride):
        mxplus_block(src, dst, scales, b, tr, tc, man, emin, sub, emax_e, max_e, negzero, lo, hi, pbits, split, magic,
                     min_normal, mode, key, nbits)


def quantize_mxplus(src, dst, scales, tile, args: tuple, mode: int, key: int, nbits: int, stream=None) -> None:
    """As ``mxplus_cpu.quantize_mxplus``; src/dst/scales are device arrays."""
    _launch(mxplus_kernel, scales.size, stream, src, dst, scales, int(tile[0]), int(tile[1]), *args, int(mode),
            np.uint64(key), int(nbits))
