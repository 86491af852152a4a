"""emunum: bit-exact emulation of reduced-precision number formats and arithmetic units in PyTorch.

``import emunum`` stays lean: it loads no numba.cuda and no hydra, starts no CUDA, and compiles nothing.
"""
from .formats import PRESETS, get_format
from .optim import LossScaler, OptimLP
from .quantize import quantize
from .spec import FixedFormat, FloatFormat, RoundMode, Special

__version__ = "0.1.0"

__all__ = [
    "FloatFormat", "FixedFormat", "RoundMode", "Special", "PRESETS", "get_format", "quantize",
    "OptimLP", "LossScaler",
]
