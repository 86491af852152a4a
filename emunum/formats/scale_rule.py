"""Block-scale rules (``BlockFormat.scale_rule``): how a block's scale is chosen from its largest magnitude.

Four rules make a power of two 2**E (E8M0, or any scale format whose values are powers of two); amax is the
block's largest |x| (a float32 or float64 value, exact), emax the element's largest exponent
(floor(log2 element max)), and E is clipped to the scale format's exponent range [lo, hi]:
- ``floor`` (``ocp``; OCP MX v1.0 section 6.3): E = floor(log2 amax) - emax.
- ``ceil`` (torchao 0.18 ``ScaleCalculationMode.CEIL``): E = ceil(log2 amax) - emax.
- ``even`` (torchao 0.18 ``ScaleCalculationMode.EVEN``): E = floor(log2 RNA(amax)) - emax, RNA rounding amax to
  m + 1 significant bits, ties away from zero (m: the element's mantissa bits; for a fixed-point element
  floor(log2 code_max), the fraction bits of its top binade). Only the carry into the next power of two
  matters: E is one above ``floor``'s exactly when amax's significand (in [1, 2)) is >= 2 - 2**-(m + 1).
- ``rceil`` (cuBLAS, "Computing scaling and conversion factors for FP8 with UE8M0 scales"; PTX
  ``cvt.rp.satfinite.ue8m0x2.f32``): r = the float32 ratio amax / element max (rounded to nearest-even, once,
  from the exact quotient for float32 data; float64 data: the float64 quotient rounded to float32), then
  E = ceil(log2 r), saturating (r = 0 gives lo, r = inf gives hi).
Every rule: amax = 0 gives E = lo and amax = inf gives E = hi; a block holding a NaN gets a NaN scale.

A fifth rule, ``amax``, is not a power of two: S = amax / element max rounded to nearest-even into a float
scale format (NVFP4; ``BlockFormat`` states it).

Where torchao 0.18 differs (its own code, not its definitions): ``rceil``'s CPU fallback takes
ceil(log2(r)) of a float32 log2, which rounds to the integer k for r just above 2**k (|k| >= 4 or so), giving
2**k where the rule gives 2**(k + 1); ``floor``/``ceil``/``even`` give an inf block 2**(128 - emax) (emunum:
2**hi for every rule); ``ceil``/``even`` read a subnormal float32 amax's exponent as
-127 (emunum: its exact value; the two differ only below E8M0's range for torchao's element types).
"""
from __future__ import annotations

import enum
import math

import numpy as np

from .base import parse_enum


class ScaleRule(enum.Enum):
    """How a block's scale is chosen from the block's largest magnitude (module doc for the formulas)."""

    FLOOR = "floor"  # 2**(floor(log2 amax) - emax): OCP MX v1.0 section 6.3
    OCP = "floor"  # an alias of FLOOR (the name emunum used first)
    CEIL = "ceil"  # 2**(ceil(log2 amax) - emax): torchao CEIL
    EVEN = "even"  # 2**(floor(log2 RNA_m(amax)) - emax): torchao EVEN
    RCEIL = "rceil"  # 2**ceil(log2 fp32(amax / element max)): cuBLAS UE8M0, cvt.rp.satfinite.ue8m0x2.f32
    AMAX = "amax"  # S = amax / element max, rounded to nearest-even into the scale format (NVFP4, torchao)

    @classmethod
    def parse(cls, value) -> "ScaleRule":
        return parse_enum(cls, value, "scale_rule", "a scale rule", aliases={"ocp": "floor"})

    @property
    def power_of_two(self) -> bool:
        """Whether the rule makes a power of two (every rule but ``amax``)."""
        return self is not ScaleRule.AMAX

    @property
    def code(self) -> int:
        """The kernels' rule code (kernels/scalar/block.py)."""
        return _CODES[self]


_CODES = {ScaleRule.FLOOR: 0, ScaleRule.AMAX: 1, ScaleRule.CEIL: 2, ScaleRule.EVEN: 3, ScaleRule.RCEIL: 4}

# the rule suffixes of preset names: "mxfp8_e4m3_rceil" is mxfp8_e4m3 with scale_rule="rceil"
RULE_SUFFIXES = ("floor", "ceil", "even", "rceil")


def split_rule_suffix(name: str) -> tuple[str, ScaleRule] | None:
    """("mxfp8_e4m3", RCEIL) for "mxfp8_e4m3_rceil"; None for a name without a rule suffix."""
    base, sep, suffix = name.rpartition("_")
    if not sep or not base or suffix not in RULE_SUFFIXES + ("ocp",):
        return None
    return base, ScaleRule.parse(suffix)


def pow2_exponents(amax, rule: ScaleRule, emax: int, element_max: float, mbits: int, lo: int, hi: int,
                   ratio_dtype=np.float32) -> np.ndarray:
    """E (int64) of the power-of-two rules for block maxima ``amax`` (float64, NaN-free, >= 0), numpy reference
    of the kernels' ``kernels.scalar.block.pow2_exponent``; ratio_dtype: the float type of ``rceil``'s ratio."""
    a = np.asarray(amax, dtype=np.float64)
    if rule is ScaleRule.RCEIL:
        with np.errstate(over="ignore"):
            a = (a / element_max).astype(ratio_dtype).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        m, e = np.frexp(np.where(np.isfinite(a) & (a > 0), a, 1.0))  # a = m * 2**e, m in [0.5, 1)
    e = e.astype(np.int64) - 1
    if rule in (ScaleRule.CEIL, ScaleRule.RCEIL):
        e = e + (m != 0.5)
    elif rule is ScaleRule.EVEN:
        e = e + (m >= 1.0 - math.ldexp(1.0, -(mbits + 2)))
    if rule is not ScaleRule.RCEIL:
        e = e - emax
    e = np.clip(e, lo, hi)
    return np.where(a == 0, lo, np.where(np.isinf(a), hi, e))
