"""The NVFP4 family's options on ``BlockFormat``: outer scales (per tensor or per row of blocks), "four over
six" (4/6) block-scale selection, and the UE5M3 block-scale format. docs/nvfp4.md describes the family.

Sources:
- 4/6: Cook et al., "Four Over Six: More Accurate NVFP4 Quantization with Adaptive Block Scaling"
  (arXiv:2512.02010); TransformerEngine's ``NVFP4BlockScaling(nvfp4_4over6=...)`` and its pure-PyTorch
  reference ``transformer_engine/pytorch/custom_recipes/reference_nvfp4.py`` (which emunum follows bit for bit);
  mit-han-lab/fouroversix ``src/fouroversix/quantize/pytorch/reference.py``.
- Row-scaled NVFP4: TransformerEngine's ``row_scaled_nvfp4`` (one fp32 outer scale per row of the rowwise data,
  one per column of the columnwise data).
- UE5M3: PTX ISA 13.4, "alternate floating-point data formats": unsigned, 5 exponent bits (bias 15), 3 mantissa
  bits, subnormals, no infinity, the all-ones code 0xff the only NaN; largest value 1.75 * 2**16 = 114688,
  smallest 2**-17 (TransformerEngine PR #3325; NVIDIA/cutlass PR #3617 decodes codes 248..254 as finite).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

from .base import parse_enum
from .fixed import FixedFormat
from .float import FloatFormat

# the smallest positive float32: an outer (tensor or row) scale T that would round to 0 is raised to it
TENSOR_SCALE_MIN = 2.0 ** -149

# UE5M3's values are exactly the non-negative values of e5m3 with special "fn" (bias 15, only the all-ones
# magnitude code NaN): an UE5M3 code is that format's code without its (always 0) sign bit.
UE5M3 = FloatFormat(5, 3, special="fn")
_E2M1 = FloatFormat(2, 1, special="none")


class OuterScale(enum.Enum):
    """The fp32 scale above the block scales (NVFP4's second level)."""

    NONE = "none"  # single level: block scales only
    TENSOR = "tensor"  # one per tensor (NVFP4; BlockFormat.tensor_scale=True)
    # one per row of blocks: per index of every axis but the block axis. An (M, K) matrix blocked along K gets
    # one per row; a (K, N) matrix blocked along K (a GEMM's second operand, TE's columnwise copy) one per column.
    ROW = "row"

    @classmethod
    def parse(cls, value) -> "OuterScale":
        if value is None:
            return cls.NONE
        return parse_enum(cls, value, "outer_scale", "an outer scale", {"col": "row", "column": "row"})


class Metric(enum.Enum):
    """The block error that 4/6 selection minimises (the sum over the block, or its largest term)."""

    MAE = "mae"  # sum of |q - x|
    MSE = "mse"  # sum of (q - x)**2
    ABSMAX = "absmax"  # max of |q - x|

    @classmethod
    def parse(cls, value) -> "Metric":
        return parse_enum(cls, value, "FourOverSix.metric", "a 4/6 error metric", {"abs_max": "absmax", "l1": "mae"})


BOUNDS = (448, 256)


@dataclass(frozen=True)
class FourOverSix:
    """4/6 block-scale selection (``BlockFormat(..., four_over_six=FourOverSix(metric, bound))``).

    metric: "mae" (TransformerEngine's default), "mse" (fouroversix's default) or "absmax".
    bound: the block-scale maximum that the outer scale aims at, 448 (e4m3's max) or 256 (both references'
    default for 4/6: it leaves the map-to-4 scale, 1.5x the map-to-6 one, room below 448). Used only with an
    outer scale; a single-level format ignores it.
    """

    metric: Union[str, Metric] = Metric.MAE
    bound: int = 256

    def __post_init__(self):
        object.__setattr__(self, "metric", Metric.parse(self.metric))
        if isinstance(self.bound, bool) or self.bound not in BOUNDS:
            raise ValueError(f"FourOverSix.bound={self.bound!r}; allowed: 448 or 256")
        object.__setattr__(self, "bound", int(self.bound))

    def __str__(self) -> str:
        return f"4over6({self.metric.value},{self.bound})"


def check_family(element, scale, scale_rule_is_amax: bool, tile, outer: OuterScale, fos) -> None:
    """ValueError/TypeError for an outer scale or a 4/6 option that the rest of a BlockFormat cannot take."""
    if fos is not None:
        if not isinstance(fos, FourOverSix):
            raise TypeError(f"BlockFormat.four_over_six={fos!r}: allowed: None or a FourOverSix")
        if element != _E2M1:
            raise ValueError(f"BlockFormat.four_over_six needs element e2m1 (fp4_e2m1); got element="
                             f"{getattr(element, 'name', element)}")
        if not scale_rule_is_amax or not isinstance(scale, FloatFormat):
            raise ValueError(f"BlockFormat.four_over_six needs a float scale (e.g. e4m3fn) and scale_rule='amax'; "
                             f"got scale={getattr(scale, 'name', scale)}")
        if tile[0] not in (0, 16) or tile[1] != 16:
            raise ValueError(f"BlockFormat.four_over_six: block_size={tile[1] if tile[0] == 0 else tile}; "
                             "allowed: 16 or (16, 16)")
    if outer == OuterScale.ROW:
        if not scale_rule_is_amax:
            raise ValueError("BlockFormat.outer_scale='row' needs scale_rule='amax' (the NVFP4 scheme)")
        if tile[0] != 0:
            raise ValueError(f"BlockFormat.outer_scale='row' needs 1-D blocks; got block_size={tile}")
        if not isinstance(element, (FloatFormat, FixedFormat)):
            raise ValueError(f"BlockFormat.outer_scale='row' needs a FloatFormat or FixedFormat element; got "
                             f"element={element.name}")
