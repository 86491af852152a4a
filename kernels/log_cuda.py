"""numba-cuda kernel for logarithmic numbers (``LogFormat``): a grid-stride loop calling
``scalar.round_log_value`` with the random bits of (key, flat index), so a result has the CPU kernel's bits
(stochastic rounding's log2 excepted on real GPUs: see ``LogFormat``). Arrays as in ``table_cuda``."""
import numpy as np

from .cuda import _device_pair, _copy_back, _launch, cuda
from numba import config

from .scalar import STOCHASTIC, random_bits, round_log_value

# numba's simulator cannot hand its fake device arrays to a compiled @njit core: there the kernel calls the
# core's Python source (the same code, on the same float64 and int64 values).
_core = round_log_value.py_func if config.ENABLE_CUDASIM else round_log_value
from .table_cuda import device_table  # noqa: F401  (the same per-device table cache)


@cuda.jit
def log_kernel(src, dst, tab, frac_bits, kmin, kmax, signed, snap32, mode, key, nbits):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    size = src.size
    while i < size:
        rnd = random_bits(key, i, nbits) if mode == STOCHASTIC else np.uint64(0)
        dst[i] = _core(np.float64(src[i]), tab, frac_bits, kmin, kmax, signed, snap32, mode, rnd, nbits)
        i += stride


def quantize_log(src, dst, frac_bits, kmin, kmax, signed, tab, mode, key, nbits, *, stream=None):
    """Round the flat float32/float64 array ``src`` into ``dst`` (same dtype and size; may be ``src``)."""
    if src.size == 0:
        return
    if src.dtype not in (np.float32, np.float64):
        raise TypeError(f"src.dtype={src.dtype} is not supported; allowed: float32, float64")
    d_src, d_dst, host = _device_pair(src, dst)
    if isinstance(tab, np.ndarray):
        tab = device_table(tab)
    _launch(log_kernel, d_src.size, stream, d_src, d_dst, tab, np.int64(frac_bits), np.int64(kmin),
            np.int64(kmax), np.int64(signed), np.int64(src.dtype == np.float32), mode, np.uint64(key), nbits)
    _copy_back(d_dst, host, stream)
