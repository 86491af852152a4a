"""MX+ block formats (``MXPlusFormat``): OCP MX blocks whose largest element, the block max (BM), reuses its
exponent field as extra mantissa bits.

Source: Lee, Park, Cha, Cho, Sim, "MX+: Pushing the Limits of Microscaling Formats for Efficient Large
Language Model Serving", MICRO 2025 (arXiv:2510.14557). Under the OCP scale rule the BM's scaled magnitude
|x_bm| / X always lies in [2**emax, 2**(emax+1)) (emax: the element's largest exponent), so its exponent field
carries no information: MX+ stores the BM as a sign and ebits + mbits mantissa bits at the implied exponent
emax, plus the BM's index within the block (one 8-bit field per block in the paper; MXFP4+ is 4 + 16/32 =
4.5 bits per element). docs/mxplus.md gives the definition below with worked examples.

Definition (emunum's; the paper's choices where it states them, emunum's where marked):
- The scale is plain MX's: X = 2**clip(floor(log2 amax) - emax, lo, hi) (``scale_rule='floor'``, OCP MX v1.0
  section 6.3; other rules would move |x_bm| / X out of the BM's binade, so they are refused).
- The BM is the first element (lowest index, row-major within a 2-D tile) of largest |x| (emunum: ties go to
  the first).
- The BM's value is sign * 2**emax * (1 + k / 2**p), p = ebits + mbits, k in 0 .. 2**p - 1: |x_bm| / X rounded
  with the caller's rounding mode to a multiple of 2**(emax - p), then saturated to [2**emax, 2**emax * (2 -
  2**-p)]. A carry out of the binade (a value at or above the largest BM value's upper midpoint) saturates
  (emunum: the exponent is implied, so it cannot carry); a value below 2**emax (only when the scale is
  clipped at the scale format's smallest power of two, i.e. tiny blocks) is raised to 2**emax, the smallest
  value the encoding has (emunum; the paper's blocks never clip).
- Every other element is rounded exactly as plain MX (``BlockFormat``): x / X rounded to the element format
  and saturated to +-element max.
- A block holding a NaN is all NaN (a NaN scale, as MX). An all-zero block (amax = 0) has no BM and stays zero
  (signed zeros as MX; emunum: the paper does not say how such a block is encoded). An infinite x gets the
  largest scale and, as BM, the largest BM value (further infinities of the block saturate to element max).
- The paper's MX++ variant is not implemented (docs/mxplus.md: its definition was not available to pin down).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .block import BlockFormat
from .float import FloatFormat
from .nvfp4 import OuterScale
from .scale_rule import ScaleRule

BM_INDEX_BITS = 8  # the paper's BM-index field per block


@dataclass(frozen=True)
class MXPlusFormat(BlockFormat):
    """An MX block format with the MX+ block max (module docstring: the exact definition).

    element: a FloatFormat with an exponent field (ebits >= 1, man >= 1; e.g. "fp4_e2m1", "e4m3fn");
    block_size: as BlockFormat (1-D blocks or 2-D tiles); scale: a scale format holding powers of two ("e8m0");
    scale_rule: "floor" (= "ocp") only; no tensor scale, outer scale or 4/6 selection.
    """

    def __post_init__(self):
        super().__post_init__()
        el = self.element
        if not isinstance(el, FloatFormat) or el.exp < 1:
            raise ValueError(f"MXPlusFormat.element={el.name}: the block max reuses the element's exponent field; "
                             "allowed: a FloatFormat with exp >= 1 (e.g. fp4_e2m1, fp6_e2m3, fp6_e3m2, e4m3fn, e5m2)")
        if self.scale_rule != ScaleRule.FLOOR:
            raise ValueError(f"MXPlusFormat.scale_rule={self.scale_rule.value!r}: the block max's exponent is "
                             "implied only under the OCP rule; allowed: 'floor' (= 'ocp')")
        if self.tensor_scale or self.outer_scale != OuterScale.NONE or self.four_over_six is not None:
            raise ValueError("MXPlusFormat: tensor_scale, outer_scale and four_over_six are NVFP4 options; allowed: "
                             "none of them (MX+ extends the OCP MX formats)")

    @property
    def bm_bits(self) -> int:
        """p: the BM's mantissa bits (the element's exponent and mantissa fields together)."""
        return self.element.exp + self.element.man

    @property
    def bm_max(self) -> float:
        """The largest BM magnitude in units of the scale: 2**emax * (2 - 2**-p)."""
        return math.ldexp(2.0 - math.ldexp(1.0, -self.bm_bits), self.element_emax)

    @property
    def bits(self) -> float:
        """Bits per element: element bits plus the scale and the 8-bit BM index per block (MXFP4+: 4.5)."""
        return self.element.bits + (self.scale.bits + BM_INDEX_BITS) / self.block_elements

    @property
    def max(self) -> float:
        return self.bm_max * self.scale.max

    @property
    def name(self) -> str:
        key = MXPLUS_NAMES.get(self)
        if key is not None:
            return key
        bs = self.block_size
        size = f"{bs[0]}x{bs[1]}" if isinstance(bs, tuple) else str(bs)
        return f"block[{self.element.name},{size},{self.scale.name},mx+]"

    def __str__(self) -> str:
        return self.name

    def with_block_size(self, block_size) -> "MXPlusFormat":
        return MXPlusFormat(self.element, block_size, self.scale)

    def with_scale_rule(self, scale_rule) -> "MXPlusFormat":
        return MXPlusFormat(self.element, self.block_size, self.scale, scale_rule=scale_rule)

    def encode(self, x, axis: int = -1, rounding: str = "nearest"):
        raise ValueError(f"{self.name}.encode: an MX+ block max has no element code; MX+ formats are quantised by "
                         "emunum.quantize(x, fmt) (emunum/mxplus_quantize.py)")


_E2M1 = FloatFormat(2, 1, special="none")

# The MX+ variants of the OCP MX element types (the paper's MXFP4+, MXFP6+ and MXFP8+), E8M0 scales over 32.
MXPLUS_PRESETS: dict[str, MXPlusFormat] = {
    "mxfp8_e4m3_plus": MXPlusFormat(FloatFormat(4, 3, special="fn"), 32),
    "mxfp8_e5m2_plus": MXPlusFormat(FloatFormat(5, 2), 32),
    "mxfp6_e3m2_plus": MXPlusFormat(FloatFormat(3, 2, special="none"), 32),
    "mxfp6_e2m3_plus": MXPlusFormat(FloatFormat(2, 3, special="none"), 32),
    "mxfp4_e2m1_plus": MXPlusFormat(_E2M1, 32),
}
MXPLUS_ALIASES: dict[str, str] = {"mxfp8_plus": "mxfp8_e4m3_plus", "mxfp6_plus": "mxfp6_e3m2_plus",
                                  "mxfp4_plus": "mxfp4_e2m1_plus"}
MXPLUS_NAMES = {f: n for n, f in MXPLUS_PRESETS.items()}
