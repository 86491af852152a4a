"""The preset catalogue: named formats and their aliases (``get_format`` in ``names.py`` reads them)."""
from __future__ import annotations

from .base import NumberFormat
from .fixed import FixedFormat
from .float import FloatFormat
from .posit import PositFormat

PRESETS: dict[str, NumberFormat] = {
    "fp32": FloatFormat(8, 23),
    "tf32": FloatFormat(8, 10),
    "bf16": FloatFormat(8, 7),
    "fp16": FloatFormat(5, 10),
    "fp16_169": FloatFormat(6, 9),
    "fp8_152": FloatFormat(5, 2),
    "fp8_143": FloatFormat(4, 3),
    "e4m3fn": FloatFormat(4, 3, special="fn"),
    "e4m3fnuz": FloatFormat(4, 3, special="fnuz"),
    "e5m2fnuz": FloatFormat(5, 2, special="fnuz"),
    "fp6_e3m2": FloatFormat(3, 2, special="none"),
    "fp6_e2m3": FloatFormat(2, 3, special="none"),
    "fp4_e2m1": FloatFormat(2, 1, special="none"),
    "int8": FixedFormat(8, 0),
    "int4": FixedFormat(4, 0),
    "uint8": FixedFormat(8, 0, signed=False),
    "fixed16_12": FixedFormat(16, 12),
}

ALIASES: dict[str, str] = {
    "float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
    "fp8_e5m2": "fp8_152", "e5m2": "fp8_152",
    "fp8_e4m3fn": "e4m3fn", "fp8_e4m3fnuz": "e4m3fnuz", "fp8_e5m2fnuz": "e5m2fnuz",
    "fp8_e4m3": "fp8_143", "e4m3": "fp8_143",
}

# Posits (own table: ``emunum formats`` lists them apart). es=2 as in the Posit Standard (2022); any
# ``posit<n>_<es>`` (and ``posit<n>``, es=2) is parsed by ``get_format``.
POSIT_PRESETS: dict[str, PositFormat] = {
    "posit8": PositFormat(8, 2),
    "posit16": PositFormat(16, 2),
}


def known_names() -> list[str]:
    return sorted(PRESETS) + sorted(ALIASES) + sorted(POSIT_PRESETS)
