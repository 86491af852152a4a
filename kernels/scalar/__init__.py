"""Scalar rounding cores, written once and shared by the CPU (``@njit(parallel=True)``) and CUDA kernels.

One module per number system (``float``, ``fixed``, ``table``, ``log``, ``custom``, ``hifloat8``), plus ``common`` (mode and
overflow codes, the counter-based random bits, the shared rounding decisions). Signature-less ``@njit`` functions: numba
specialises them for each caller. Format parameters are always arguments (never globals, which ``cache=True``
would freeze). Everything works on integers so that rounding is exact: a float is handled as the unsigned
bits of an IEEE binary32 or binary64 value.
"""
import glob
import os

from .common import (DOWN, GOLDEN, NEAREST, NEAREST_AWAY, ODD, ONE, OVF_INF, OVF_NAN, OVF_SAT, STOCHASTIC,
                     TOWARD_ZERO, U64, UP, ZERO, mix64, random_bits, round_up_decision, stochastic_decision)
from .fixed import round_fixed_value
from .log import round_log_value
from .table import round_table_value, stochastic_up
from .custom import finish_derived
from .float import round_f32_fast, round_float_bits, round_nearest_fast, round_nearest_value
from .hifloat8 import (MAX_BITS32 as HIF8_MAX_BITS32, MAX_BITS64 as HIF8_MAX_BITS64, nearest_ta_f32, round_hif8_bits,
                       round_hif8_f32, sr_f32 as hif8_sr_f32)

__all__ = [
    "DOWN", "GOLDEN", "NEAREST", "NEAREST_AWAY", "ODD", "ONE", "OVF_INF", "OVF_NAN", "OVF_SAT", "STOCHASTIC",
    "TOWARD_ZERO", "U64", "UP", "ZERO", "mix64", "random_bits", "round_up_decision", "stochastic_decision",
    "round_fixed_value", "round_f32_fast", "round_float_bits", "round_nearest_fast", "round_nearest_value",
    "round_table_value", "round_log_value", "finish_derived", "stochastic_up", "SOURCES",
    "round_hif8_bits", "round_hif8_f32", "nearest_ta_f32", "hif8_sr_f32", "HIF8_MAX_BITS32", "HIF8_MAX_BITS64",
]

# The source files every kernel module built on these cores depends on (its numba cache is keyed on them).
SOURCES = sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "*.py")))
