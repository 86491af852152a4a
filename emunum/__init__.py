"""emunum: bit-exact emulation of reduced-precision number formats and arithmetic units in PyTorch.

``import emunum`` stays lean: it loads no numba.cuda and no hydra, starts no CUDA, and compiles nothing.
"""
from . import approx  # noqa: E402  (emunum.approx: approximate tanh/sigmoid/softmax operators)
from .arithmetic import arithmetic, emulated
from .autograd import Quantizer, quantize_ste
from .formats import (BlockFormat, CustomFormat, FixedFormat, FloatFormat, FourOverSix, HiFloat8Format, LogFormat,
                      P3109Format, PRESETS, PositFormat, RoundMode, Special, TableFormat, get_format)
from . import mad  # noqa: E402  (emunum.mad: the MAD-unit package; mad.elementwise is the element-wise MAD)
from .mad import MADUnit, addmm, baddbmm, conv1d, conv2d, linear, matmul
from .optim import LossScaler, OptimLP
from .patch import patch, patched, register, unpatch
from .gemm_coverage import Coverage, coverage
from .policy import Policy, Role, RoleSpec, Scaling
from . import distributed  # noqa: E402  (emunum.distributed: DDP hooks with a low-precision all-reduce)
from . import trace  # noqa: E402  (emunum.trace.collect / enable: per-layer numerics counters)
from .quantize import quantize

__version__ = "0.1.0"

__all__ = [
    "BlockFormat", "FourOverSix", "FloatFormat", "FixedFormat", "PositFormat", "RoundMode", "Special", "PRESETS",
    "get_format", "quantize", "TableFormat", "LogFormat", "CustomFormat", "P3109Format", "HiFloat8Format",
    "OptimLP", "LossScaler",
    "patch", "unpatch", "patched", "register", "coverage", "Coverage", "Policy", "Role", "RoleSpec", "Scaling", "trace",
    "Quantizer", "quantize_ste", "arithmetic", "emulated", "approx", "distributed",
    "MADUnit", "mad", "matmul", "linear", "addmm", "baddbmm", "conv1d", "conv2d",
]
