"""The built-in number systems' kernels, registered with ``emunum.backends``: a CPU factory and a CUDA factory per
format type. Kernel modules are imported on first use (``import emunum`` compiles and loads no numba)."""
from __future__ import annotations

import warnings

import numpy as np
import torch

from . import backends
from .formats import (CustomFormat, FixedFormat, FloatFormat, HiFloat8Format, LogFormat, P3109Format, PositFormat,
                      RoundMode, TableFormat)

# dtypes the CPU kernels read in place, and their numpy twins
NUMPY_DTYPES = {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}
_LAYOUT16 = {torch.float16: "float16", torch.bfloat16: "bfloat16"}

_cpu = None


def cpu_module():
    """``kernels.cpu``, imported (and its cache checked) on first use, not at ``import emunum``."""
    global _cpu
    if _cpu is None:
        from .kernels import cpu
        _cpu = cpu
    return _cpu


def cuda_module():
    """``kernels.cuda``; a clear ImportError naming the package when numba-cuda is missing."""
    from .kernels import cuda  # lazy: numba.cuda is imported on the first CUDA tensor only
    return cuda


# ---- CPU: run(src_ptr, dst_ptr, n, mode, key, nbits) -------------------------------------------------------
def _float_cpu(fmt, dtype):
    return cpu_module().float_runner(NUMPY_DTYPES[dtype], *fmt.to_kernel_args())


def _fixed_cpu(fmt, dtype):
    return cpu_module().fixed_runner(NUMPY_DTYPES[dtype], *fmt.to_kernel_args())


def _posit_cpu(fmt, dtype):
    from .kernels import posit_cpu
    a = fmt.to_kernel_args()
    return posit_cpu.posit_runner(NUMPY_DTYPES[dtype], a.nbits, a.es)


def _table_cpu(fmt, dtype):
    from .kernels import table_cpu
    return table_cpu.table_runner(NUMPY_DTYPES[dtype], *fmt.to_kernel_args())


def _log_cpu(fmt, dtype):
    from .kernels import log_cpu
    return log_cpu.log_runner(NUMPY_DTYPES[dtype], *fmt.to_kernel_args())


def custom_runner(fmt: CustomFormat, dtype: torch.dtype = torch.float32):
    """The CPU kernel of a CustomFormat for a float32/float64 dtype, ``run(src, dst, n, mode, key, nbits)`` on
    raw addresses (for timing: ``run(x.data_ptr(), y.data_ptr(), x.numel(), 0, 0, 32)`` rounds to nearest)."""
    from .kernels import custom_cpu
    return custom_cpu.custom_runner(NUMPY_DTYPES[dtype], fmt.to_kernel_args())


# ---- CUDA: launch(src, dst, mode, key, nbits) on flat contiguous CUDA tensors ---------------------------------
def _elementwise_cuda(kernel_name: str):
    """A float or fixed-point launcher: 16-bit dtypes are rounded in-kernel (``layout``)."""
    def factory(fmt, dtype):
        args, layout = tuple(fmt.to_kernel_args()), _LAYOUT16.get(dtype)

        def launch(src, dst, mode, key, nbits):
            kc = cuda_module()
            with kc.device_of(src):
                getattr(kc, kernel_name)(kc.as_device_array(src), kc.as_device_array(dst), *args, int(mode), key,
                                         nbits, layout=layout, stream=kc.torch_stream(src.device))
        return launch
    return factory


def _posit_cuda(fmt, dtype):
    layout = _LAYOUT16.get(dtype)

    def launch(src, dst, mode, key, nbits):
        from .kernels import posit_cuda
        kc = cuda_module()
        with kc.device_of(src):
            posit_cuda.quantize_posit(kc.as_device_array(src), kc.as_device_array(dst), fmt.nbits, fmt.es,
                                      int(mode), key, nbits, layout=layout, stream=kc.torch_stream(src.device))
    return launch


def _through_float32_cuda(fmt):
    """A 16-bit launcher: the tensor rounded in a float32 copy by fmt's float32 CUDA runner, cast back."""
    inner = backends.runner(fmt, "cuda", torch.float32)

    def launch16(src, dst, mode, key, nbits):
        work = src.float()
        inner(work, work, mode, key, nbits)
        dst.copy_(work)
    return launch16


def _lookup_cuda(fmt, dtype):
    """TableFormat / LogFormat / CustomFormat: float32/float64 in place of the kernel's arrays; 16-bit dtypes
    are rounded through float32 and cast back (nearest-even), as on the CPU. A CustomFormat whose functions do
    not compile for CUDA rounds on the host (a copy there and back), after one warning."""
    if dtype in _LAYOUT16:
        return _through_float32_cuda(fmt)

    def launch(src, dst, mode, key, nbits):
        if isinstance(fmt, CustomFormat) and _custom_on_host(fmt, mode, NUMPY_DTYPES[src.dtype]):
            host = src.cpu()
            backends.cpu_runner(fmt, host.dtype)(host.data_ptr(), host.data_ptr(), host.numel(), int(mode), key,
                                                 nbits)
            dst.copy_(host)
            return
        kc = cuda_module()
        with kc.device_of(src):
            s, d = kc.as_device_array(src), kc.as_device_array(dst)
            stream = kc.torch_stream(src.device)
            if isinstance(fmt, TableFormat):
                from .kernels import table_cuda
                a = fmt.to_kernel_args()
                table_cuda.quantize_table(s, d, a.n, table_cuda.device_table(a.table), int(mode), key, nbits,
                                          stream=stream)
            elif isinstance(fmt, CustomFormat):
                from .kernels import custom_cuda
                custom_cuda.quantize_custom(s, d, fmt.to_kernel_args(), int(mode), key, nbits, stream=stream)
            else:
                from .kernels import log_cuda
                a = fmt.to_kernel_args()
                log_cuda.quantize_log(s, d, a.frac, a.kmin, a.kmax, a.signed, log_cuda.device_table(a.table),
                                      int(mode), key, nbits, stream=stream)
    return launch


_warned_custom: set = set()


def _custom_on_host(fmt: CustomFormat, mode: RoundMode, dtype) -> bool:
    """Whether fmt must round on the host: nearest, with functions that do not compile for CUDA (warns once)."""
    from .kernels import custom_cuda
    if int(mode) != RoundMode.NEAREST or custom_cuda.compiles(fmt.to_kernel_args(), dtype):
        return False
    if fmt not in _warned_custom:
        _warned_custom.add(fmt)
        warnings.warn(f"{fmt.name}: to_code/from_code do not compile for CUDA ({custom_cuda.failure(fmt.to_kernel_args(), dtype)}); "
                      "rounding on the host instead (a device -> host -> device copy per call)", RuntimeWarning,
                      stacklevel=6)
    return True


# ---- IEEE P3109: the float kernels (FloatArgs); unsigned formats send x < 0 to NaN ---------------------------
def _p3109_cpu(fmt: P3109Format, dtype):
    run = _float_cpu(fmt, dtype)
    if fmt.signed:
        return run
    from .kernels import p3109_cpu
    a = fmt.to_kernel_args()
    return p3109_cpu.unsigned_runner(NUMPY_DTYPES[dtype], run, a.man, a.emin, a.max, a.overflow)


def _p3109_cuda(fmt: P3109Format, dtype):
    launch = _elementwise_cuda("quantize_float")(fmt, dtype)
    if fmt.signed:
        return launch

    def launch_unsigned(src, dst, mode, key, nbits):
        neg = src < 0  # read before an in-place rounding
        launch(src, dst, mode, key, nbits)
        dst.masked_fill_(neg, float("nan"))
    return launch_unsigned


# ---- HiFloat8: kernels/hifloat8_cpu.py and hifloat8_cuda.py ------------------------------------------------
def _hif8_cpu(fmt: HiFloat8Format, dtype):
    from .kernels import hifloat8_cpu
    return hifloat8_cpu.hif8_runner(NUMPY_DTYPES[dtype], fmt.to_kernel_args().overflow)


def _hif8_cuda(fmt: HiFloat8Format, dtype):
    """float32/float64 in place; 16-bit dtypes through float32 (exact both ways: every HiF8 value is a
    float16 and a bfloat16 value), as on the CPU."""
    if dtype in _LAYOUT16:
        return _through_float32_cuda(fmt)
    ovf = fmt.to_kernel_args().overflow

    def launch(src, dst, mode, key, nbits):
        from .kernels import hifloat8_cuda
        kc = cuda_module()
        with kc.device_of(src):
            hifloat8_cuda.quantize_hif8(kc.as_device_array(src), kc.as_device_array(dst), ovf, int(mode), key, nbits,
                                        stream=kc.torch_stream(src.device))
    return launch


for _t, _cpu_factory, _cuda_factory in (
        (FloatFormat, _float_cpu, _elementwise_cuda("quantize_float")),
        (FixedFormat, _fixed_cpu, _elementwise_cuda("quantize_fixed")),
        (PositFormat, _posit_cpu, _posit_cuda),
        (TableFormat, _table_cpu, _lookup_cuda),
        (LogFormat, _log_cpu, _lookup_cuda),
        (CustomFormat, custom_runner, _lookup_cuda),
        (P3109Format, _p3109_cpu, _p3109_cuda),
        (HiFloat8Format, _hif8_cpu, _hif8_cuda)):
    backends.register(_t, "cpu", _cpu_factory)
    backends.register(_t, "cuda", _cuda_factory)
del _t, _cpu_factory, _cuda_factory
