"""Number formats: what values exist, and how to round to them. One module per number system.

``base`` (RoundMode; FormatSpec, what every spec has; NumberFormat, an element format's interface), ``float``
(FloatFormat), ``fixed`` (FixedFormat), ``posit`` (PositFormat), ``block`` (BlockFormat), ``scale_rule`` (its
scale rules), ``nvfp4`` (the NVFP4 family's options), ``mxplus`` (MXPlusFormat, MX+ block formats), ``table``
(TableFormat, codebooks), ``log`` (LogFormat), ``p3109`` (P3109Format), ``hifloat8`` (HiFloat8Format), ``custom``
(CustomFormat, user-defined types), ``interned`` (ids for custom ops),
``exact`` (float64-exact rounding used by ``encode``), ``presets`` (the catalogue), ``names``
(get_format).
"""
from typing import Union

from .base import FormatSpec, NumberFormat, Overflow, RoundMode, parse_enum
from .custom import CustomFormat
from .block import E8M0, BlockFormat, E8M0Format
from .block_presets import BLOCK_ALIASES, BLOCK_PRESETS
from .mxplus import MXPLUS_ALIASES, MXPLUS_PRESETS, MXPlusFormat
from .scale_rule import ScaleRule
from .fixed import FixedFormat
from .nvfp4 import UE5M3, FourOverSix, Metric, OuterScale
from .float import FloatFormat, Special
from .log import LogFormat
from .table import TABLE_PRESETS, TableFormat
from .names import format_or_none, get_format
from .posit import PositFormat
from .p3109 import P3109Format
from .hifloat8 import HiFloat8Format
from .presets import ALIASES, POSIT_PRESETS, PRESETS, known_names

Format = Union[FloatFormat, FixedFormat, PositFormat]  # the element formats the kernels take directly

__all__ = [
    "FormatSpec", "NumberFormat", "RoundMode", "Overflow", "parse_enum", "FloatFormat", "FixedFormat", "Special", "Format",
    "get_format", "format_or_none", "PRESETS", "ALIASES", "known_names",
    "PositFormat", "POSIT_PRESETS",
    "BlockFormat", "E8M0Format", "E8M0", "ScaleRule", "BLOCK_PRESETS", "BLOCK_ALIASES",
    "TableFormat", "LogFormat", "TABLE_PRESETS", "CustomFormat", "P3109Format", "HiFloat8Format",
    "FourOverSix", "Metric", "OuterScale", "UE5M3",
    "MXPlusFormat", "MXPLUS_PRESETS", "MXPLUS_ALIASES",
]
