"""emunum: bit-exact emulation of reduced-precision number formats and arithmetic units in PyTorch.

``import emunum`` stays lean: it loads no numba.cuda and no hydra, starts no CUDA, and compiles nothing (it makes
one single-element ``torch.sqrt`` call, which settles MKL's vector math: see ``emunum.torch_cpu``). The
number formats and ``quantize`` load with it; every other public name (``patch``, ``mad``, ``coverage``,
``trace``, ...) loads its module on first use (PEP 562), so a program pays only for what it touches.
"""
import importlib
import importlib.util
import sys
import types

from .formats import (BlockFormat, CustomFormat, FixedFormat, FloatFormat, FourOverSix, HiFloat8Format, LogFormat,
                      MXPlusFormat, P3109Format, PRESETS, PositFormat, RoundMode, Special, TableFormat, get_format)
from .quantize import quantize
from . import ops as _ops  # noqa: F401,E402  (registers emunum::quantize, which a traced quantize calls)
from .torch_cpu import warm_vector_math as _warm_vector_math

_warm_vector_math()  # before any emulated op: a process's first parallel MKL call can be inexact (torch_cpu.py)

__version__ = "0.1.0"

# public name -> (module, attribute); attribute None: the module itself
_LAZY = {
    "approx": (".approx", None), "arithmetic": (".arithmetic", "arithmetic"), "emulated": (".arithmetic", "emulated"),
    "Quantizer": (".autograd", "Quantizer"), "quantize_ste": (".autograd", "quantize_ste"),
    "mad": (".mad", None), "MADUnit": (".mad", "MADUnit"), "addmm": (".mad", "addmm"),
    "baddbmm": (".mad", "baddbmm"), "conv1d": (".mad", "conv1d"), "conv2d": (".mad", "conv2d"),
    "linear": (".mad", "linear"), "matmul": (".mad", "matmul"),
    "LossScaler": (".optim", "LossScaler"), "OptimLP": (".optim", "OptimLP"),
    "patch": (".patch", "patch"), "patched": (".patch", "patched"), "register": (".patch", "register"),
    "unpatch": (".patch", "unpatch"),
    "Coverage": (".gemm_coverage", "Coverage"), "coverage": (".gemm_coverage", "coverage"),
    "Policy": (".policy", "Policy"), "Role": (".policy", "Role"), "RoleSpec": (".policy", "RoleSpec"),
    "Scaling": (".policy", "Scaling"),
    "distributed": (".distributed", None), "trace": (".trace", None),
}


def __getattr__(name):
    """A public name of ``_LAZY``, or a submodule (``emunum.nn``, ``emunum.policy``, ...), loaded on first use."""
    if name in _LAZY:
        module, attr = _LAZY[name]
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        module, attr = f".{name}", None
    else:
        raise AttributeError(f"module 'emunum' has no attribute {name!r}")
    mod = importlib.import_module(module, __name__)
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """The import system binds each loaded submodule as an attribute of its package. Where a public function
    shares its module's name (``emunum.patch``, ``emunum.arithmetic``), keep the name for the function, as the
    eager ``from .patch import patch`` this replaces did."""

    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and _LAZY.get(name, (None, None))[1] is not None:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "BlockFormat", "MXPlusFormat", "FourOverSix", "FloatFormat", "FixedFormat", "PositFormat", "RoundMode", "Special",
    "PRESETS",
    "get_format", "quantize", "TableFormat", "LogFormat", "CustomFormat", "P3109Format", "HiFloat8Format",
    "OptimLP", "LossScaler",
    "patch", "unpatch", "patched", "register", "coverage", "Coverage", "Policy", "Role", "RoleSpec", "Scaling", "trace",
    "Quantizer", "quantize_ste", "arithmetic", "emulated", "approx", "distributed",
    "MADUnit", "mad", "matmul", "linear", "addmm", "baddbmm", "conv1d", "conv2d",
]
