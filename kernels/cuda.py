"""CUDA kernels (numba-cuda): grid-stride loops over flat device arrays that call the same scalar cores as the
CPU kernels (``scalar.round_float_bits``, ``round_fixed_value``, ``random_bits``), so a result has the CPU's
bits, stochastic rounding included (same seed and flat index -> same random bits).

Needs the optional package numba-cuda (``pip install "emunum[cuda]"``); ``emunum.quantize`` imports this
module only for CUDA tensors. Under ``NUMBA_ENABLE_CUDASIM=1`` (read when numba.cuda is first imported) the
kernels run in numba's simulator on numpy arrays, which is how CI tests them. Kernels compile on first launch.

float16 / bfloat16 are handled in-kernel on 16-bit integer views: widen to binary32 bits (exact), round with
the binary32 core, narrow back with round-to-nearest-even. That is what the CPU path does through torch's
casts, so the bits agree; the one difference is NaN payloads (see ``narrow16``).

Torch interop (``as_device_array``, ``torch_stream``, ``device_of``) is the only torch-aware code here: it
wraps tensor memory without a copy and launches on torch's current stream, so emunum composes with streams
and CUDA graph capture.
"""
import importlib.util
import math
import warnings

import numpy as np
from numba import njit

MISSING_MESSAGE = (
    "emunum's CUDA backend needs the numba-cuda package: pip install 'emunum[cuda]' (or: pip install numba-cuda)"
)


def _import_numba_cuda():
    if importlib.util.find_spec("numba_cuda") is None:
        raise ImportError(MISSING_MESSAGE)
    from numba import cuda as numba_cuda

    if getattr(numba_cuda, "implementation", None) != "NVIDIA":  # numba's deprecated built-in target
        raise ImportError(MISSING_MESSAGE + f" (numba.cuda is {numba_cuda.__file__}, not numba-cuda's)")
    return numba_cuda


cuda = _import_numba_cuda()

from .scalar import STOCHASTIC, random_bits, round_fixed_value, round_float_bits  # noqa: E402

U64 = np.uint64
ONE = np.uint64(1)
ZERO = np.uint64(0)

# Launch shape. A block has THREADS_PER_BLOCK threads; the grid grows until each thread has at least
# ITEMS_PER_THREAD elements, and stops at BLOCKS_PER_SM blocks per multiprocessor: beyond that, threads loop
# (grid-stride, so neighbouring threads read neighbouring elements: coalesced).
# Measured on one H100 (benchmarks/gpu_check.sh, 2026-11-26): of 128/256/512 threads x 4..32 blocks per SM,
# 256 x 32 was the fastest (29% of copy_'s bandwidth; the spread was 18-29%). Both are read at each launch, so
# assigning them overrides. They change speed only.
THREADS_PER_BLOCK = 256
ITEMS_PER_THREAD = 4
BLOCKS_PER_SM = 32

# binary layouts: name -> (sign_pos, mantissa bits, bias, exponent bits)
BINARY32 = (31, 23, 127, 8)
BINARY64 = (63, 52, 1023, 11)
BINARY16 = {"float16": (15, 10, 15, 5), "bfloat16": (15, 7, 127, 8)}


# ---- 16-bit <-> binary32 conversion (integer arithmetic only; usable from CPU @njit code too) -------------

@njit
def msb64(v):
    """Index of the highest set bit of v > 0 (uint64), by binary search."""
    n = 0
    if v >= (ONE << U64(32)):
        v >>= U64(32)
        n += 32
    if v >= (ONE << U64(16)):
        v >>= U64(16)
        n += 16
    if v >= (ONE << U64(8)):
        v >>= U64(8)
        n += 8
    if v >= (ONE << U64(4)):
        v >>= U64(4)
        n += 4
    if v >= (ONE << U64(2)):
        v >>= U64(2)
        n += 2
    if v >= (ONE << U64(1)):
        n += 1
    return n


@njit
def round_pack(sig, lsbexp, out_man, out_bias, out_exp_bits):
    """Encode the magnitude sig * 2**lsbexp (sig > 0) in an IEEE layout, rounding to nearest, ties to even.

    Returns the bits without sign: subnormal results where the layout has them, infinity past its max.
    """
    sig = U64(sig)
    top = lsbexp + msb64(sig)
    emin = 1 - out_bias
    q = (top if top > emin else emin) - out_man  # exponent of the result's last bit
    shift = q - lsbexp
    if shift > 0:
        if shift > 64:
            sig = ZERO  # below half of the last bit
        elif shift == 64:
            sig = ONE if sig > (ONE << U64(63)) else ZERO
        else:
            rem = sig & ((ONE << U64(shift)) - ONE)
            sig >>= U64(shift)
            half = ONE << U64(shift - 1)
            if rem > half or (rem == half and (sig & ONE) == ONE):
                sig += ONE
    elif shift < 0:
        sig <<= U64(-shift)
    if sig >> U64(out_man + 1) != ZERO:  # rounding carried into a new binade
        sig >>= ONE
        q += 1
    if sig == ZERO:
        return ZERO
    biased = q + out_man + out_bias if (sig >> U64(out_man)) != ZERO else 0
    exp_all = (1 << out_exp_bits) - 1
    if biased >= exp_all:
        return U64(exp_all) << U64(out_man)
    return (U64(biased) << U64(out_man)) | (sig & ((ONE << U64(out_man)) - ONE))


@njit
def widen16(h, man, bias):
    """Bits of a 16-bit float (1 sign, 15-man exponent, man mantissa bits) -> binary32 bits, exactly.

    NaN keeps its sign and payload (shifted to the top of binary32's mantissa).
    """
    h = U64(h) & U64(0xFFFF)
    sign = (h >> U64(15)) << U64(31)
    e = (h >> U64(man)) & ((ONE << U64(15 - man)) - ONE)
    m = h & ((ONE << U64(man)) - ONE)
    if e == (ONE << U64(15 - man)) - ONE:
        return sign | (U64(0xFF) << U64(23)) | (m << U64(23 - man))
    if e == ZERO:
        if m == ZERO:
            return sign
        return sign | round_pack(m, 1 - bias - man, 23, 127, 8)
    return sign | round_pack(m | (ONE << U64(man)), np.int64(e) - bias - man, 23, 127, 8)


@njit
def narrow16(u, man, bias):
    """binary32 bits -> bits of a 16-bit float, rounding to nearest, ties to even (overflow -> inf).

    NaN -> a quiet NaN with the same sign and the leading payload bits (as x86 F16C ``vcvtps2ph`` and torch's
    CPU float16 cast do). torch's bfloat16 casts instead write 0xFFFF (CPU) or 0x7FFF (CUDA) for every NaN.
    """
    u = U64(u) & U64(0xFFFFFFFF)
    sign = (u >> U64(31)) << U64(15)
    e = (u >> U64(23)) & U64(0xFF)
    m = u & U64(0x7FFFFF)
    exp_all = (ONE << U64(15 - man)) - ONE
    if e == U64(0xFF):
        if m == ZERO:
            return sign | (exp_all << U64(man))
        return sign | (exp_all << U64(man)) | (ONE << U64(man - 1)) | (m >> U64(23 - man))
    if e == ZERO:
        if m == ZERO:
            return sign
        return sign | round_pack(m, -149, man, bias, 15 - man)
    return sign | round_pack(m | (ONE << U64(23)), np.int64(e) - 150, man, bias, 15 - man)


@njit
def value16(h, man, bias):
    """The value of finite 16-bit float bits, as a float64 (exact)."""
    h = U64(h) & U64(0xFFFF)
    e = np.int64((h >> U64(man)) & ((ONE << U64(15 - man)) - ONE))
    m = h & ((ONE << U64(man)) - ONE)
    if e == 0:
        v = math.ldexp(np.float64(m), np.int32(1 - bias - man))
    else:
        v = math.ldexp(np.float64(m | (ONE << U64(man))), np.int32(e - bias - man))
    return -v if (h >> U64(15)) != ZERO else v


@njit
def f64_to_binary32(v):
    """binary32 bits of float32(v) for finite v, rounding to nearest, ties to even (as a float32 store)."""
    if v == 0.0:
        return ZERO if math.copysign(1.0, v) > 0.0 else ONE << U64(31)
    sign = ONE << U64(31) if v < 0.0 else ZERO
    f, e = math.frexp(abs(v))  # f in [0.5, 1)
    return sign | round_pack(U64(f * 9007199254740992.0), np.int64(e) - 53, 23, 127, 8)


# ---- kernels ---------------------------------------------------------------------------------------------

@cuda.jit
def float_kernel(src, dst, sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero, mode, key, nbits):
    """src, dst: uint32 (binary32) or uint64 (binary64) views; element i as the CPU kernel computes it."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    n = src.size
    while i < n:
        rnd = random_bits(key, i, nbits) if mode == STOCHASTIC else ZERO
        dst[i] = round_float_bits(src[i], sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero,
                                  mode, rnd, nbits)
        i += stride


@cuda.jit
def float16_kernel(src, dst, h_man, h_bias, man, emin, sub, max_bits, ovf, negzero, mode, key, nbits):
    """src, dst: uint16 views of float16/bfloat16; rounds through binary32 (max_bits in binary32)."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    n = src.size
    while i < n:
        rnd = random_bits(key, i, nbits) if mode == STOCHASTIC else ZERO
        u = widen16(src[i], h_man, h_bias)
        r = round_float_bits(u, 31, 23, 127, man, emin, sub, max_bits, ovf, negzero, mode, rnd, nbits)
        dst[i] = narrow16(r, h_man, h_bias)
        i += stride


@cuda.jit
def fixed_kernel(src, src_bits, dst, dst_bits, quiet, frac_bits, code_min, code_max, saturate, mode, key, nbits):
    """src, dst: float32 or float64 arrays, with unsigned-integer views of the same memory (``*_bits``).

    The value is rounded in float64 and stored with a cast (to nearest even). A NaN is copied as bits with
    ``quiet`` (the quiet bit) set: what the CPU's float conversions do, and GPUs' (canonical NaN) do not.
    """
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    n = src.size
    while i < n:
        x = src[i]
        if x != x:
            dst_bits[i] = src_bits[i] | quiet
        else:
            rnd = random_bits(key, i, nbits) if mode == STOCHASTIC else ZERO
            dst[i] = round_fixed_value(np.float64(x), frac_bits, code_min, code_max, saturate, mode, rnd, nbits)
        i += stride


@cuda.jit
def fixed16_kernel(src, dst, h_man, h_bias, frac_bits, code_min, code_max, saturate, mode, key, nbits):
    """src, dst: uint16 views; the value is rounded in float64, then to float32, then to 16 bits (both RNE),
    as the CPU path's float32 kernel and torch cast do."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    n = src.size
    while i < n:
        h = U64(src[i]) & U64(0xFFFF)
        exp_all = (ONE << U64(15 - h_man)) - ONE
        if ((h >> U64(h_man)) & exp_all) == exp_all and (h & ((ONE << U64(h_man)) - ONE)) != ZERO:
            dst[i] = narrow16(widen16(h, h_man, h_bias), h_man, h_bias)  # NaN stays NaN (quiet)
        else:
            rnd = random_bits(key, i, nbits) if mode == STOCHASTIC else ZERO
            v = round_fixed_value(value16(h, h_man, h_bias), frac_bits, code_min, code_max, saturate, mode,
                                  rnd, nbits)
            dst[i] = narrow16(f64_to_binary32(v), h_man, h_bias)
        i += stride


# ---- launch ----------------------------------------------------------------------------------------------

_sm_counts: dict = {}


def launch_config(n: int) -> tuple[int, int]:
    """(blocks, threads) for n elements on the current device."""
    dev = cuda.get_current_device()
    key = getattr(dev, "id", 0)
    sms = _sm_counts.get(key)
    if sms is None:
        sms = _sm_counts[key] = int(getattr(dev, "MULTIPROCESSOR_COUNT", 1))
    per_block = THREADS_PER_BLOCK * ITEMS_PER_THREAD
    blocks = max(1, min(-(-n // per_block), sms * BLOCKS_PER_SM))
    return blocks, THREADS_PER_BLOCK


def _launch(kernel, n, stream, *args):
    blocks, threads = launch_config(n)
    config = (blocks, threads) if stream is None else (blocks, threads, stream)
    if blocks < 128:  # numba warns below 128 blocks; small arrays get small grids on purpose
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Grid size .* under-utilization")
            launch = kernel[config]
    else:
        launch = kernel[config]
    launch(*args)


def _layout16(src, layout):
    """(man, bias) of a 16-bit array's float layout; ``layout`` names it for uint16 views."""
    if src.dtype == np.float16:
        layout = "float16" if layout is None else layout
    if layout not in BINARY16:
        raise ValueError(f"layout={layout!r} is not a 16-bit float layout; allowed: {', '.join(BINARY16)}")
    _, man, bias, _ = BINARY16[layout]
    return man, bias


def _max_bits32(max_value: float) -> int:
    return int(np.array(max_value, dtype=np.float32).view(np.uint32))


def _device_pair(src, dst):
    """(src, dst, host_dst): device arrays as given; numpy arrays copied to the device, with the host array
    to copy the result back into (copying each host view separately would lose writes through aliases)."""
    if src.size != dst.size or src.dtype != dst.dtype:
        raise ValueError(f"dst must match src in size and dtype: src is {src.size} x {src.dtype}, "
                         f"dst is {dst.size} x {dst.dtype}")
    host = isinstance(src, np.ndarray), isinstance(dst, np.ndarray)
    if not any(host):
        return src, dst, None
    if not all(host):
        raise TypeError("src and dst must both be device arrays or both numpy arrays")
    d_src = cuda.to_device(np.ascontiguousarray(src))
    if np.shares_memory(src, dst):
        if src.__array_interface__["data"] != dst.__array_interface__["data"]:
            raise ValueError("dst overlaps src without being src")
        return d_src, d_src, dst
    return d_src, cuda.to_device(np.ascontiguousarray(dst)), dst


def _copy_back(d_dst, host_dst, stream):
    if host_dst is not None:
        host_dst[...] = d_dst.copy_to_host(stream=stream if stream is not None else 0).reshape(host_dst.shape)


def quantize_float(src, dst, man, emin, subnormals, max_value, overflow, negzero, mode, key, nbits, *,
                   layout=None, stream=None):
    """Round the flat device array ``src`` into ``dst`` (same dtype and size; may be ``src``) to a FloatFormat.

    src: float32 / float64, or 16 bits (float16, or uint16 with ``layout`` "float16" / "bfloat16").
    Arguments as ``kernels.cpu.quantize_float``; ``stream``: a numba stream (None: the default stream).
    numpy arrays are copied to the device and back.
    """
    if src.size == 0:
        return
    d_src, d_dst, host_dst = _device_pair(src, dst)
    _quantize_float(d_src, d_dst, man, emin, subnormals, max_value, overflow, negzero, mode, key, nbits,
                    layout, stream)
    _copy_back(d_dst, host_dst, stream)


def _quantize_float(src, dst, man, emin, subnormals, max_value, overflow, negzero, mode, key, nbits, layout,
                    stream):
    n = src.size
    args = (man, emin, subnormals)
    tail = (overflow, negzero, mode, U64(key), nbits)
    if src.dtype.itemsize == 2:
        h_man, h_bias = _layout16(src, layout)
        _launch(float16_kernel, n, stream, src.view(np.uint16), dst.view(np.uint16), h_man, h_bias, *args,
                U64(_max_bits32(max_value)), *tail)
        return
    if src.dtype == np.float32:
        uint, (sign_pos, in_man, in_bias, _) = np.uint32, BINARY32
    elif src.dtype == np.float64:
        uint, (sign_pos, in_man, in_bias, _) = np.uint64, BINARY64
    else:
        raise TypeError(f"src.dtype={src.dtype} is not supported; allowed: float32, float64, float16, uint16")
    mbits = int(np.array(max_value, dtype=src.dtype).view(uint))
    _launch(float_kernel, n, stream, src.view(uint), dst.view(uint), sign_pos, in_man, in_bias, *args,
            U64(mbits), *tail)


def quantize_fixed(src, dst, frac_bits, code_min, code_max, saturate, mode, key, nbits, *, layout=None,
                   stream=None):
    """Round the flat device array ``src`` to fixed point into ``dst`` (arrays as ``quantize_float``)."""
    if src.size == 0:
        return
    d_src, d_dst, host_dst = _device_pair(src, dst)
    _quantize_fixed(d_src, d_dst, frac_bits, code_min, code_max, saturate, mode, key, nbits, layout, stream)
    _copy_back(d_dst, host_dst, stream)


def _quantize_fixed(src, dst, frac_bits, code_min, code_max, saturate, mode, key, nbits, layout, stream):
    n = src.size
    tail = (frac_bits, np.int64(code_min), np.int64(code_max), saturate, mode, U64(key), nbits)
    if src.dtype.itemsize == 2:
        h_man, h_bias = _layout16(src, layout)
        _launch(fixed16_kernel, n, stream, src.view(np.uint16), dst.view(np.uint16), h_man, h_bias, *tail)
        return
    if src.dtype == np.float32:
        uint, quiet = np.uint32, U64(1 << 22)
    elif src.dtype == np.float64:
        uint, quiet = np.uint64, U64(1 << 51)
    else:
        raise TypeError(f"src.dtype={src.dtype} is not supported; allowed: float32, float64, float16, uint16")
    _launch(fixed_kernel, n, stream, src, src.view(uint), dst, dst.view(uint), quiet, *tail)


# ---- torch interop ---------------------------------------------------------------------------------------

def as_device_array(t):
    """A numba device array over a CUDA tensor's memory, without a copy or a synchronisation.

    float16 and bfloat16 tensors come back as uint16 views (pass ``layout`` to the kernels).
    """
    import torch

    if not hasattr(cuda, "as_cuda_array"):
        raise RuntimeError("NUMBA_ENABLE_CUDASIM=1 is set: numba's CUDA simulator cannot use torch CUDA tensors; "
                           "unset it to run emunum's kernels on the GPU")
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.view(torch.uint16)
    return cuda.as_cuda_array(t.detach(), sync=False)


_streams: dict = {}


def torch_stream(device):
    """The numba stream wrapping torch's current stream on ``device`` (a torch.device)."""
    import torch

    ptr = torch.cuda.current_stream(device).cuda_stream
    s = _streams.get(ptr)
    if s is None:
        if len(_streams) > 64:
            _streams.clear()
        s = _streams[ptr] = cuda.external_stream(ptr)
    return s


def device_of(t):
    """Context manager making ``t``'s GPU numba's current device."""
    return cuda.gpus[t.device.index if t.device.index is not None else 0]


__all__ = ["quantize_float", "quantize_fixed", "as_device_array", "torch_stream", "device_of", "launch_config",
           "widen16", "narrow16", "value16", "f64_to_binary32", "round_pack", "MISSING_MESSAGE"]
