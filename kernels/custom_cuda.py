"""numba-cuda kernels for user-defined types (``CustomFormat``), with the CPU kernel's bits.

- nearest: a grid-stride kernel built once per format (a closure over the user's njit functions, which
  numba-cuda compiles as device functions) and per dtype. Functions that use what CUDA lacks (numpy array
  allocation, Python objects, ...) do not compile: ``compiles`` then says False and keeps numba's message
  (``failure``), and ``emunum.quantize`` rounds such a format on the host, after a one-time warning.
  Every code is checked before from_code sees it: the first element whose code is outside 0 .. 2**nbits-1
  raises ValueError naming the format, the value and the code (``custom_cpu.raise_for``), after the kernel.
  An exception raised inside to_code/from_code reaches the caller under numba's simulator; on a GPU,
  numba-cuda drops exceptions raised in device code (unless compiled with debug=True).
- derived modes: ``scalar.round_table_value`` over the finite values (``TableFormat`` layout, copied to the
  device once per table), finished by ``scalar.finish_derived``; no user code runs.
Arrays: float32 or float64 device arrays (or numpy arrays, copied to the device and back).
"""
import re

import numpy as np
from numba import config, types

from .cuda import _copy_back, _device_pair, _launch, cuda
from .scalar import NEAREST, STOCHASTIC, finish_derived, random_bits, round_table_value
from .table_cuda import device_table

# numba's simulator cannot hand its fake device arrays to a compiled @njit core (see table_cuda)
_table_core = round_table_value.py_func if config.ENABLE_CUDASIM else round_table_value


@cuda.jit
def derived_kernel(src, dst, tab, n, snap32, ninf, pinf, negzero, mode, key, nbits):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    size = src.size
    while i < size:
        rnd = random_bits(key, i, nbits) if mode == STOCHASTIC else np.uint64(0)
        x = np.float64(src[i])
        q = _table_core(x, tab, n, snap32, mode, rnd, nbits)
        dst[i] = finish_derived(x, q, tab[0], tab[n - 1], ninf, pinf, negzero, mode)
        i += stride


_KERNELS: dict = {}  # (format, dtype name) -> compiled kernel, or the failure message (str)
_NUMBA_TYPES = {"float32": types.float32, "float64": types.float64}


def _build(to_code, from_code, dtype: str, ncodes: int):
    """The nearest kernel for one format and dtype, compiled now (so that failures show here); other array
    layouts compile lazily, as for any numba-cuda kernel. ``bad[0]`` (initially the size) becomes the
    smallest index whose code is outside 0 .. ncodes-1; such an element's dst is not written and from_code
    never sees its code."""
    arr = _NUMBA_TYPES[dtype][::1]
    limit = np.uint64(ncodes)

    def nearest_kernel(src, dst, bad):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        size = src.size
        while i < size:
            c = np.int64(to_code(np.float64(src[i])))
            if np.uint64(c) >= limit:
                cuda.atomic.min(bad, 0, i)
            else:
                dst[i] = from_code(c)
            i += stride

    kernel = cuda.jit(nearest_kernel)
    if hasattr(kernel, "compile"):  # numba-cuda: compile now for contiguous arrays (the simulator has no compile)
        kernel.compile(types.void(arr, arr, types.int64[::1]))
    return kernel


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _kernel(args, dtype: str):
    key = (args.name, args.to_code, args.from_code, args.ncodes, dtype)
    got = _KERNELS.get(key)
    if got is None:
        try:
            got = _build(args.to_code, args.from_code, dtype, args.ncodes)
        except Exception as e:  # numba's TypingError, LoweringError, NVVM errors ...
            text = _ANSI.sub("", str(e))  # numba colours its messages where a highlighter is installed
            lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("Failed in ")]
            got = f"{type(e).__name__}: {lines[0] if lines else ''}"
        if len(_KERNELS) > 256:
            _KERNELS.clear()
        _KERNELS[key] = got
    return got


def compiles(args, dtype="float32") -> bool:
    """Whether the to_code/from_code of ``args`` (``abi.CustomArgs``) compile for CUDA (nearest kernel for
    ``dtype``, float32/float64)."""
    return not isinstance(_kernel(args, np.dtype(dtype).name), str)


def failure(args, dtype="float32") -> str:
    """numba's first error line where ``compiles`` is False, else ''."""
    got = _kernel(args, np.dtype(dtype).name)
    return got if isinstance(got, str) else ""


def quantize_custom(src, dst, args, mode, key, nbits, *, stream=None):
    """Round the flat float32/float64 array ``src`` into ``dst`` (same dtype and size; may be ``src``) to the
    user type of ``args`` (``abi.CustomArgs``). RuntimeError if nearest is asked for and the functions do not compile for CUDA."""
    if src.size == 0:
        return
    if src.dtype not in (np.float32, np.float64):
        raise TypeError(f"src.dtype={src.dtype} is not supported; allowed: float32, float64")
    d_src, d_dst, host = _device_pair(src, dst)
    if int(mode) == NEAREST:
        k = _kernel(args, np.dtype(src.dtype).name)
        if isinstance(k, str):
            raise RuntimeError(f"{args.name}: to_code/from_code do not compile for CUDA: {k}")
        bad = cuda.to_device(np.array([d_src.size], np.int64), stream=stream or 0)
        _launch(k, d_src.size, stream, d_src, d_dst, bad)
        first = int(bad.copy_to_host(stream=stream or 0)[0])  # waits for the kernel: a code error raises here
        if first < d_src.size:
            from .custom_cpu import raise_for
            raise_for(args, float(d_src[first:first + 1].copy_to_host(stream=stream or 0)[0]))
    else:
        (n, tab), ninf, pinf, negzero = args.derived(mode)  # abi.TableArgs and flags
        _launch(derived_kernel, d_src.size, stream, d_src, d_dst, device_table(tab), np.int64(n),
                np.int64(src.dtype == np.float32), np.int64(ninf), np.int64(pinf), np.int64(negzero), int(mode),
                np.uint64(key), nbits)
    _copy_back(d_dst, host, stream)
