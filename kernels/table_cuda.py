"""numba-cuda kernel for codebooks (``TableFormat``): a grid-stride loop calling ``scalar.round_table_value``
with the random bits of (key, flat index), so a result has the CPU kernel's bits. Arrays: float32 or float64
device arrays (or numpy arrays, copied); the table (kernel layout, ``TableFormat.to_kernel_args``) is a
float64 device array, copied to the device once per table (``device_table``)."""
import numpy as np

from .cuda import _device_pair, _copy_back, _launch, cuda
from numba import config

from .scalar import STOCHASTIC, random_bits, round_table_value

# numba's simulator cannot hand its fake device arrays to a compiled @njit core: there the kernel calls the
# core's Python source (the same code, on the same float64 and int64 values).
_core = round_table_value.py_func if config.ENABLE_CUDASIM else round_table_value


@cuda.jit
def table_kernel(src, dst, tab, n, snap32, mode, key, nbits):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    size = src.size
    while i < size:
        rnd = random_bits(key, i, nbits) if mode == STOCHASTIC else np.uint64(0)
        dst[i] = _core(np.float64(src[i]), tab, n, snap32, mode, rnd, nbits)
        i += stride


_TABLES: dict = {}


def device_table(tab: np.ndarray):
    """``tab`` (a read-only array the formats cache) on the current device, cached by (device, array); the
    cache holds the array too, so its id cannot be reused while the entry lives."""
    key = (id(cuda.get_current_device()), id(tab))
    hit = _TABLES.get(key)
    if hit is None:
        if len(_TABLES) > 64:
            _TABLES.clear()
        hit = _TABLES[key] = (tab, cuda.to_device(np.ascontiguousarray(tab, dtype=np.float64)))
    return hit[1]


def quantize_table(src, dst, n, tab, mode, key, nbits, *, stream=None):
    """Round the flat float32/float64 array ``src`` into ``dst`` (same dtype and size; may be ``src``)."""
    if src.size == 0:
        return
    if src.dtype not in (np.float32, np.float64):
        raise TypeError(f"src.dtype={src.dtype} is not supported; allowed: float32, float64")
    d_src, d_dst, host = _device_pair(src, dst)
    if isinstance(tab, np.ndarray):
        tab = device_table(tab)
    _launch(table_kernel, d_src.size, stream, d_src, d_dst, tab, np.int64(n), np.int64(src.dtype == np.float32), mode,
            np.uint64(key), nbits)
    _copy_back(d_dst, host, stream)
