"""numba-cuda kernel for HiFloat8: a grid-stride loop calling ``scalar.round_hif8_bits`` with the random bits of
(key, flat index), so a result has the CPU kernel's bits. Arrays: float32 or float64 device arrays (or numpy
arrays, copied); float16/bfloat16 tensors are rounded through float32 by the caller (``emunum.kernel_backends``:
widening is exact and every HiF8 value is a float16 and a bfloat16 value, so narrowing back is exact too)."""
import numpy as np

from .cuda import _copy_back, _device_pair, _launch, cuda
from .scalar import HIF8_MAX_BITS32, HIF8_MAX_BITS64, STOCHASTIC, random_bits, round_hif8_bits

U64 = np.uint64


@cuda.jit
def hif8_kernel(src, dst, sign_pos, in_man, in_bias, max_bits, ovf, mode, key, nbits):
    """src, dst: uint32 (binary32) or uint64 (binary64) views; element i as the CPU kernel computes it."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    n = src.size
    while i < n:
        rnd = random_bits(key, i, nbits) if mode == STOCHASTIC else U64(0)
        dst[i] = round_hif8_bits(src[i], sign_pos, in_man, in_bias, max_bits, ovf, mode, rnd, nbits)
        i += stride


def quantize_hif8(src, dst, overflow, mode, key, nbits, *, stream=None):
    """Round the flat float32/float64 array ``src`` into ``dst`` (same dtype and size; may be ``src``);
    overflow 0 inf / 2 saturate, mode a rounding-mode code, ``stream`` a numba stream (None: the default)."""
    if src.size == 0:
        return
    if src.dtype == np.float32:
        uint, layout = np.uint32, (31, 23, 127, U64(HIF8_MAX_BITS32))
    elif src.dtype == np.float64:
        uint, layout = np.uint64, (63, 52, 1023, U64(HIF8_MAX_BITS64))
    else:
        raise TypeError(f"src.dtype={src.dtype} is not supported; allowed: float32, float64")
    d_src, d_dst, host = _device_pair(src, dst)
    _launch(hif8_kernel, d_src.size, stream, d_src.view(uint), d_dst.view(uint), *layout, int(overflow), int(mode),
            U64(key), nbits)
    _copy_back(d_dst, host, stream)
