"""numba-cuda kernels for posits: grid-stride loops calling the same scalar core as ``posit_cpu``
(``scalar.posit.round_posit_value``), so results have the CPU's bits, stochastic rounding included.

NaN bits are written explicitly, since GPUs' float conversions make the canonical NaN: an input NaN comes back
with its payload and the quiet bit (as on the CPU), and NaR from ±inf is the positive quiet NaN. float16 /
bfloat16 (uint16 views) round their exact value and narrow through binary32 (both to nearest even), as the CPU
path does with torch's casts. Runs under NUMBA_ENABLE_CUDASIM=1 on numpy arrays (copied to the device and back).
"""
import numpy as np

from .cuda import (ONE, U64, ZERO, _copy_back, _device_pair, _launch, _layout16, cuda, f64_to_binary32,
                   narrow16, value16, widen16)
from .scalar.common import STOCHASTIC, random_bits
from .scalar.posit import round_posit_value


@cuda.jit
def posit_kernel(src, src_bits, dst, dst_bits, quiet, nan_bits, nbits, es, mode, key, srbits):
    """src, dst: float32 or float64 arrays with unsigned-integer views of the same memory (``*_bits``)."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    n = src.size
    while i < n:
        x = src[i]
        if x != x:
            dst_bits[i] = src_bits[i] | quiet
        else:
            rnd = random_bits(key, i, srbits) if mode == STOCHASTIC else ZERO
            v = round_posit_value(np.float64(x), nbits, es, mode, rnd, srbits)
            if v != v:
                dst_bits[i] = nan_bits
            else:
                dst[i] = v
        i += stride


@cuda.jit
def posit16_kernel(src, dst, h_man, h_bias, nbits, es, mode, key, srbits):
    """src, dst: uint16 views of float16/bfloat16."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    n = src.size
    while i < n:
        h = U64(src[i]) & U64(0xFFFF)
        exp_all = (ONE << U64(15 - h_man)) - ONE
        if ((h >> U64(h_man)) & exp_all) == exp_all:
            if (h & ((ONE << U64(h_man)) - ONE)) != ZERO:
                dst[i] = narrow16(widen16(h, h_man, h_bias), h_man, h_bias)  # NaN stays NaN (quiet)
            else:
                dst[i] = narrow16(U64(0x7FC00000), h_man, h_bias)  # ±inf -> NaR: the positive quiet NaN
        else:
            rnd = random_bits(key, i, srbits) if mode == STOCHASTIC else ZERO
            v = round_posit_value(value16(h, h_man, h_bias), nbits, es, mode, rnd, srbits)
            dst[i] = narrow16(f64_to_binary32(v), h_man, h_bias)
        i += stride


_BITS = {np.dtype(np.float32): (np.uint32, 1 << 22, 0x7FC00000),
         np.dtype(np.float64): (np.uint64, 1 << 51, 0x7FF8000000000000)}


def quantize_posit(src, dst, nbits, es, mode, key, srbits, *, layout=None, stream=None):
    """Round the flat device array ``src`` to the posit format (nbits, es) into ``dst`` (same dtype and size;
    may be ``src``). Arrays as ``kernels.cuda.quantize_float``: float32, float64, or 16 bits (float16, or uint16
    with ``layout`` "float16" / "bfloat16"); numpy arrays are copied to the device and back."""
    if src.size == 0:
        return
    d_src, d_dst, host_dst = _device_pair(src, dst)
    n = d_src.size
    tail = (int(nbits), int(es), int(mode), U64(key), int(srbits))
    if d_src.dtype.itemsize == 2:
        h_man, h_bias = _layout16(d_src, layout)
        _launch(posit16_kernel, n, stream, d_src.view(np.uint16), d_dst.view(np.uint16), h_man, h_bias, *tail)
    else:
        if np.dtype(d_src.dtype) not in _BITS:
            raise TypeError(f"src.dtype={d_src.dtype} is not supported; allowed: float32, float64, float16, uint16")
        uint, quiet, nan_bits = _BITS[np.dtype(d_src.dtype)]
        _launch(posit_kernel, n, stream, d_src, d_src.view(uint), d_dst, d_dst.view(uint), U64(quiet),
                U64(nan_bits), *tail)
    _copy_back(d_dst, host_dst, stream)
