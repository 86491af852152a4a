"""Block-scaled formats: ``BlockFormat`` (blocks of elements sharing one scale) and the ``E8M0`` scale format.

Sources:
- OCP Microscaling Formats (MX) Specification v1.0 (2023): MXFP8 (e4m3/e5m2), MXFP6 (e3m2/e2m3), MXFP4 (e2m1),
  MXINT8, 32 elements per block, an E8M0 scale; the scale rule of section 6.3.
- NVFP4: NVIDIA, "Pretraining Large Language Models with NVFP4" (arXiv:2509.25149, 2025), section 2, and the
  NVIDIA developer blog "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference" (2025): 16 e2m1
  elements, an e4m3 block scale, and a per-tensor fp32 scale.
- MSFP12 / MSFP16 (classic block floating point: an 8-bit shared exponent over sign-magnitude mantissas of 3 / 7
  bits, 16 per block): Darvish Rouhani et al., "Pushing the Limits of Narrow Precision Inferencing at Cloudscale
  with Microsoft Floating Point", NeurIPS 2020. A sign + k-bit magnitude mantissa aligned to the block's
  largest exponent is exactly the FloatFormat e1m(k-1) with special='none' (values 0..2**k-1 times one step).
"""
from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass
from typing import Union

import numpy as np

from .base import FormatSpec, NumberFormat, RoundMode, as_codes, check_bool, check_int
from .fixed import FixedFormat
from .float import FloatFormat
from .nvfp4 import TENSOR_SCALE_MIN, UE5M3, FourOverSix, OuterScale, check_family
from .nvfp4_encode import encode_fos, row_outer_scale
from ..kernels.abi import ScaleArgs
from .presets import ALIASES, PRESETS
from .scale_rule import ScaleRule, pow2_exponents
from .table import TABLE_PRESETS, TableFormat



@dataclass(frozen=True)
class E8M0Format(NumberFormat):
    """OCP E8M0: an unsigned 8-bit exponent, value 2**(code - 127) for codes 0..254 (2**-127..2**127); code 255
    is NaN. No sign, no zero, no infinity. ``encode`` takes exact powers of two (what the MX scale rule makes);
    any other positive value is rounded down to a power of two (log2 floored), then clipped to the range."""

    bits: int = 8

    def __post_init__(self):
        if self.bits != 8:
            raise ValueError(f"E8M0Format.bits={self.bits!r}; allowed: 8")

    name = property(lambda self: "e8m0")
    max = property(lambda self: math.ldexp(1.0, 127))
    min_subnormal = property(lambda self: math.ldexp(1.0, -127))
    emin = property(lambda self: -127)
    emax = property(lambda self: 127)
    nan_code = property(lambda self: 255)

    def __str__(self) -> str:
        return self.name

    def decode(self, codes) -> np.ndarray:
        c = as_codes(codes, 256, "e8m0")
        return np.where(c == 255, np.nan, np.ldexp(1.0, np.minimum(c, 254) - 127))

    def encode(self, values, rounding: str = "down") -> np.ndarray:
        """Positive values -> codes 0..254 (2**(code - 127)), NaN -> 255, inf -> 254; a value between two powers
        of two rounds ``down`` (= ``toward_zero``: the OCP rule) or ``up``; beyond the range it clamps."""
        mode = RoundMode.parse(rounding)
        if mode not in (RoundMode.DOWN, RoundMode.TOWARD_ZERO, RoundMode.UP):
            raise ValueError(f"e8m0 encode rounding={rounding!r}: allowed: 'down' (= 'toward_zero') or 'up'")
        v = np.asarray(values, dtype=np.float64)
        if np.any(v <= 0):
            raise ValueError("e8m0 holds positive powers of two only; got a value <= 0")
        with np.errstate(divide="ignore", invalid="ignore"):
            m, e = np.frexp(np.where(np.isfinite(v), v, 1.0))
        e = e.astype(np.int64) - 1  # v = 2**e * (2m), 2m in [1, 2)
        if mode is RoundMode.UP:
            e = e + (m != 0.5)
        code = np.clip(e + 127, 0, 254)
        code = np.where(np.isinf(v), 254, code)
        return np.where(np.isnan(v), 255, code).astype(np.int64)

    def values(self) -> np.ndarray:
        return np.ldexp(1.0, np.arange(-127, 128))

    def to_kernel_args(self) -> ScaleArgs:
        """``kernels.abi.ScaleArgs``: a power-of-two scale 2**e, e in [-127, 127]."""
        return ScaleArgs(emin=-127, emax=127)


E8M0 = E8M0Format()


def _preset(value, field: str):
    """A spec passes through; a string is a preset name (``get_format``'s full grammar is one layer up)."""
    if not isinstance(value, str):
        return value
    key = value.strip().lower()
    if key == "e8m0":
        return E8M0
    if key == "ue5m3":
        return UE5M3
    key = ALIASES.get(key, key)
    if key in TABLE_PRESETS:
        return TABLE_PRESETS[key]
    if key not in PRESETS:
        raise ValueError(f"BlockFormat.{field}={value!r} is not a preset name; pass a spec or one of "
                         f"{', '.join(sorted(PRESETS))}, e8m0")
    return PRESETS[key]


def _element_emax(fmt) -> int:
    if isinstance(fmt, FloatFormat):
        return fmt.emax
    return math.frexp(fmt.max)[1] - 1


def _parse_block_size(value) -> tuple[int, int]:
    """(rows, cols): rows 0 means 1-D blocks of ``cols`` along one axis."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"block_size={value!r}: a tile is a pair (rows, cols)")
        return (check_int("block_size[0]", value[0], 1, 1 << 20), check_int("block_size[1]", value[1], 1, 1 << 20))
    return (0, check_int("block_size", value, 1, 1 << 20))


# preset spec -> its name, filled by formats/block_presets.py (the first name of equal specs)
PRESET_NAMES: dict = {}


@dataclass(frozen=True)
class BlockFormat(FormatSpec):
    """Elements of ``element`` in blocks that share one scale: value = element * scale (* tensor scale).

    element: a FloatFormat (man >= 1), FixedFormat, or TableFormat (codebook; scale_rule "amax" only, with a
    largest value > 0: QLoRA's absmax blocks are ``nf4_b64``). block_size: an int, for 1-D blocks of that many
    consecutive elements along ``axis``, or a pair (rows, cols) for 2-D tiles over a tensor's last two
    dimensions (so that W and W.T share one quantisation). scale: the scale's format, ``"e8m0"`` or any
    FloatFormat (e.g. ``"e4m3fn"``).

    Quantisation of one block (``emunum.quantize(x, fmt, rounding, axis=...)``), all in float64:
    - amax = max |x| over the block.
    - scale_rule "floor" (= "ocp", the default; OCP MX v1.0 section 6.3): X = 2**(floor(log2 amax) -
      emax_element), the exponent clipped to the scale format's powers of two (2**-127..2**127 for e8m0).
      amax = 0 gives the smallest scale; amax = inf the largest. floor(log2) is exact (from the float's
      exponent field; gfloat's np.log2 can round up for a float64 amax just below a power of two; float32
      inputs never). "ceil", "even" (torchao) and "rceil" (cuBLAS) make other powers of two and need a
      power-of-two scale format (e8m0, or a FloatFormat with man=0): formats/scale_rule.py states them.
    - scale_rule "amax": S = amax / element.max (divided by the tensor scale, if any), rounded to nearest,
      ties to even, into the scale format, saturating at its max and raised to its smallest positive value
      if it would round to 0 (so an all-zero block gets that smallest scale).
    - tensor_scale (NVFP4's second level): T = amax_tensor / (element.max * scale.max) rounded to fp32 (nearest-even),
      raised to the smallest positive fp32 (2**-149) if it would round to 0 (a tensor whose largest magnitude is below
      about 2**-139; T is never 0); T = 1 if the tensor's amax is 0 or not finite. The full scale is S * T (exact in
      float64).
    - Elements: x / full_scale (one float64 division, as gfloat does), rounded with the caller's mode (every
      mode, stochastic included) and always saturated to the element range (+-max; [min, max] for fixed
      point, so MXINT8 reaches -2), whatever the element format's own overflow policy; an infinite x therefore
      becomes +-max. The result is element * full scale (in float32, an infinity's max * 2**127 is inf).
    - A NaN anywhere in a block makes the block's scale NaN (e8m0 code 255, or the scale format's NaN) and
      every element of that block NaN (OCP: a NaN scale makes the whole block NaN).
    - A partial last block (the axis length not a multiple of the block size) is its own, smaller block.
    The result has x's dtype: float32/float64 hold every MX result exactly; float16/bfloat16 are rounded
    through float32 and cast back (nearest-even).
    """

    element: NumberFormat
    block_size: Union[int, tuple] = 32
    scale: Union[str, NumberFormat] = "e8m0"
    _: KW_ONLY
    scale_rule: Union[str, ScaleRule] = ScaleRule.FLOOR
    tensor_scale: bool = False
    outer_scale: Union[str, OuterScale, None] = None
    four_over_six: Union[FourOverSix, None] = None

    def __post_init__(self):
        el = _preset(self.element, "element")
        if isinstance(el, BlockFormat):
            raise TypeError("BlockFormat.element must be an element format, not another BlockFormat")
        if not isinstance(el, (FloatFormat, FixedFormat, TableFormat)):
            raise TypeError(f"BlockFormat.element={el!r}: allowed element formats are FloatFormat, FixedFormat and "
                            "TableFormat")
        if isinstance(el, FloatFormat) and el.man < 1:
            raise ValueError(f"BlockFormat.element={el.name}: block elements need man >= 1")
        object.__setattr__(self, "element", el)
        bs = _parse_block_size(self.block_size)
        object.__setattr__(self, "block_size", bs[1] if bs[0] == 0 else bs)
        sc = _preset(self.scale, "scale")
        if not isinstance(sc, (E8M0Format, FloatFormat)):
            raise TypeError(f"BlockFormat.scale={sc!r}: allowed scale formats are 'e8m0' and any FloatFormat")
        object.__setattr__(self, "scale", sc)
        rule = ScaleRule.parse(self.scale_rule)
        object.__setattr__(self, "scale_rule", rule)
        check_bool("BlockFormat.tensor_scale", self.tensor_scale)
        if rule == ScaleRule.AMAX and isinstance(sc, E8M0Format):
            raise ValueError("BlockFormat: scale='e8m0' holds powers of two only; it needs scale_rule='floor' "
                             "(= 'ocp'), 'ceil', 'even' or 'rceil'")
        if rule.power_of_two and rule != ScaleRule.FLOOR and not self.power_of_two_scale:
            raise ValueError(f"BlockFormat.scale_rule={rule.value!r} needs a power-of-two scale format (e8m0, or a "
                             f"FloatFormat with man=0), got scale={sc.name}; allowed with it: 'floor' (= 'ocp'), "
                             "'amax'")
        if rule == ScaleRule.FLOOR and isinstance(sc, FloatFormat) and \
                self.scale_exp_range[0] > self.scale_exp_range[1]:
            raise ValueError(f"BlockFormat.scale={sc.name} holds no power of two")
        if isinstance(el, TableFormat) and (rule != ScaleRule.AMAX or not el.max > 0):
            raise ValueError(f"BlockFormat.element={el.name}: a codebook element needs scale_rule='amax' and a "
                             f"positive largest value (got scale_rule={rule.value!r}, max={el.max!r})")
        if self.tensor_scale and rule != ScaleRule.AMAX:
            raise ValueError("BlockFormat: tensor_scale=True needs scale_rule='amax' (the NVFP4 scheme)")
        # the NVFP4 family (emunum/formats/nvfp4.py): tensor_scale=True is outer_scale='tensor'
        outer = OuterScale.parse(self.outer_scale)
        if self.tensor_scale and outer not in (OuterScale.NONE, OuterScale.TENSOR):
            raise ValueError(f"BlockFormat: tensor_scale=True and outer_scale={outer.value!r} conflict; allowed: "
                             "one outer scale ('tensor' or 'row')")
        if outer == OuterScale.TENSOR and rule != ScaleRule.AMAX:
            raise ValueError("BlockFormat: outer_scale='tensor' needs scale_rule='amax' (the NVFP4 scheme)")
        outer = OuterScale.TENSOR if self.tensor_scale else outer
        object.__setattr__(self, "outer_scale", outer)
        object.__setattr__(self, "tensor_scale", outer == OuterScale.TENSOR)
        check_family(el, sc, rule == ScaleRule.AMAX, self.tile, outer, self.four_over_six)

    # ---- structure -------------------------------------------------------------------------------
    @property
    def tile(self) -> tuple[int, int]:
        """(rows, cols) of a block; rows 0 means 1-D blocks of cols elements along an axis."""
        bs = self.block_size
        return bs if isinstance(bs, tuple) else (0, bs)

    @property
    def block_elements(self) -> int:
        r, c = self.tile
        return max(r, 1) * c

    @property
    def bits(self) -> float:
        """Bits per element, the scale's share included (MXFP4: 4 + 8/32 = 4.25); a tensor scale (32 bits per
        tensor) is not counted."""
        return self.element.bits + self.scale.bits / self.block_elements

    @property
    def max(self) -> float:
        """The largest finite magnitude: element max times the largest scale (times T for tensor_scale)."""
        return self.element.max * self.scale.max

    @property
    def element_emax(self) -> int:
        return _element_emax(self.element)

    @property
    def power_of_two_scale(self) -> bool:
        """Whether every value of the scale format is a power of two (e8m0; a FloatFormat with man=0)."""
        return isinstance(self.scale, E8M0Format) or self.scale.man == 0

    @property
    def element_mbits(self) -> int:
        """The element's mantissa bits (the ``even`` rule's rounding): man, or floor(log2 code_max) for fixed
        point (its top binade's fraction bits)."""
        el = self.element
        return el.man if isinstance(el, FloatFormat) else max(int(el.code_max).bit_length() - 1, 0)

    @property
    def scale_exp_range(self) -> tuple[int, int]:
        """The exponents of the powers of two the scale format holds (the OCP rule clips to them)."""
        sc = self.scale
        if isinstance(sc, E8M0Format):
            return (-127, 127)
        lo = math.frexp(sc.min_subnormal)[1] - 1
        return (lo, sc.emax)

    @property
    def name(self) -> str:
        rule = self.scale_rule
        base = self if not rule.power_of_two or rule == ScaleRule.FLOOR else self.with_scale_rule(ScaleRule.FLOOR)
        key = PRESET_NAMES.get(base)
        if key is not None:
            return key if base is self else f"{key}_{rule.value}"  # the rule suffix (formats/scale_rule.py)
        bs = self.block_size
        size = f"{bs[0]}x{bs[1]}" if isinstance(bs, tuple) else str(bs)
        extra = "" if rule == ScaleRule.FLOOR else f",{rule.value}"
        extra += ",tensor" if self.tensor_scale else ""
        extra += ",row" if self.outer_scale == OuterScale.ROW else ""
        extra += f",{self.four_over_six}" if self.four_over_six is not None else ""
        return f"block[{self.element.name},{size},{self.scale.name}{extra}]"

    def __str__(self) -> str:
        return self.name

    def with_block_size(self, block_size) -> "BlockFormat":
        return BlockFormat(self.element, block_size, self.scale, scale_rule=self.scale_rule,
                           tensor_scale=self.tensor_scale, outer_scale=self.outer_scale,
                           four_over_six=self.four_over_six)

    @property
    def nvfp4_path(self) -> bool:
        """Whether quantisation takes the NVFP4-family kernels (a per-row outer scale or 4/6 selection)."""
        return self.outer_scale == OuterScale.ROW or self.four_over_six is not None

    def with_scale_rule(self, scale_rule) -> "BlockFormat":
        """This format with another scale rule (``mxfp8_e4m3.with_scale_rule("rceil")``)."""
        return BlockFormat(self.element, self.block_size, self.scale, scale_rule=scale_rule,
                           tensor_scale=self.tensor_scale)

    # ---- codes (a float64 numpy reference; emunum.quantize runs the kernels) --------------------------
    def encode(self, x, axis: int = -1, rounding: str = "nearest"):
        """(element codes, scale codes, tensor scale T) of ``x`` quantised along ``axis`` (ignored for tiles).

        Element codes (int64) have x's shape; scale codes (int64) have x's shape with the block axis (for tiles,
        the last two axes) shrunk to the number of blocks. T is a float (1.0 without tensor_scale). Semantics
        as in the class docstring; stochastic rounding here uses seed 0 (``emunum.quantize`` takes seeds).
        A per-row outer scale (1-D blocks) comes back as T: an array of x's shape with the block axis of length 1;
        4/6 selection (emunum/formats/nvfp4_encode.py) gives its outer decode scale as T.
        """
        v = np.asarray(x, dtype=np.float64)
        blocks, shape, unblock = _blocked(v, self.tile, axis)
        el = self.element
        if self.four_over_six is not None:
            q, s, t = encode_fos(self, blocks, rounding)
            codes = unblock(el.encode(q))
        else:
            t = row_outer_scale(self, blocks) if self.outer_scale == OuterScale.ROW else self.tensor_scale_of(v)
            s = self.block_scales(np.max(np.abs(np.where(np.isnan(blocks), 0.0, blocks)), axis=(-3, -1),
                                         keepdims=True), t)
            nan = np.any(np.isnan(blocks), axis=(-3, -1), keepdims=True)
            s = np.where(nan, np.nan, s)
            with np.errstate(invalid="ignore"):
                scaled = np.clip(blocks / (s * t), el.min if isinstance(el, (FixedFormat, TableFormat)) else -el.max,
                                 el.max)
            scaled = np.where(np.isnan(scaled), 0.0, scaled)  # NaN blocks: element codes of 0 under a NaN scale
            codes = unblock(el.encode(scaled, rounding))
        t = float(t) if np.ndim(t) == 0 else _scale_layout(np.asarray(t, np.float64), shape, self.tile, axis)
        if isinstance(self.scale, E8M0Format):
            scodes = self.scale.encode(s)
        else:
            scodes = np.where(np.isnan(s), self.scale.nan_code if self.scale.nan_code is not None else 0,
                              self.scale.encode(np.where(np.isnan(s), 0.0, s)))
        return codes, _scale_layout(scodes, shape, self.tile, axis), t

    def decode(self, codes, scales, axis: int = -1, tensor_scale: float = 1.0) -> np.ndarray:
        """float64 values of element codes and scale codes (the inverse of ``encode``)."""
        values = self.element.decode(codes)
        s = self.scale.decode(scales)
        r, c = self.tile
        if r == 0:
            ax = _axis(axis, values.ndim)
            full = np.repeat(s, c, axis=ax).take(np.arange(values.shape[ax]), axis=ax)
        else:
            if values.ndim < 2:
                raise ValueError(f"{self.name}: tiles need at least 2 dimensions, got codes of shape {values.shape}")
            full = np.repeat(np.repeat(s, r, axis=-2), c, axis=-1)[..., :values.shape[-2], :values.shape[-1]]
        return values * (full * np.asarray(tensor_scale, dtype=np.float64))  # a float, or per row

    def tensor_scale_of(self, v: np.ndarray) -> float:
        """T for float64 values ``v`` (1.0 without tensor_scale)."""
        if not self.tensor_scale:
            return 1.0
        fin = np.abs(v[np.isfinite(v)])
        return self.tensor_scale_for(float(fin.max()) if fin.size else 0.0)

    def tensor_scale_for(self, amax: float) -> float:
        """T for a tensor whose largest finite magnitude is ``amax`` (the class docstring's rule)."""
        if amax == 0.0:
            return 1.0
        return max(float(np.float32(amax / (self.element.max * self.scale.max))), TENSOR_SCALE_MIN)

    def block_scales(self, amax: np.ndarray, t: float = 1.0) -> np.ndarray:
        """The scale (a value of the scale format) for block amax values (float64, NaN-free)."""
        if self.scale_rule.power_of_two:
            lo, hi = self.scale_exp_range
            return np.ldexp(1.0, pow2_exponents(amax, self.scale_rule, self.element_emax, self.element.max,
                                                self.element_mbits, lo, hi))
        sc = self.scale
        with np.errstate(over="ignore"):
            want = np.minimum(amax / self.element.max / t, sc.max)
        q = sc.decode(sc.encode(want, "nearest"))
        return np.maximum(np.minimum(q, sc.max), sc.min_subnormal)


def _axis(axis, ndim: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis={axis} is out of range for a tensor of {ndim} dimensions; allowed: "
                         f"{-ndim}..{ndim - 1}")
    return int(axis) % ndim


def _blocked(v: np.ndarray, tile, axis):
    """v as (P, nbr, tr, nbc, tc) blocks padded with zeros; the working shape; a function mapping such an
    array back to v's shape."""
    r, c = tile
    if r == 0:
        ax = _axis(axis, v.ndim)
        w = np.moveaxis(v, ax, -1)
        wshape = w.shape
        w = w.reshape(-1, 1, wshape[-1])
        tr, tc = 1, c
    else:
        if v.ndim < 2:
            raise ValueError(f"block_size={tile}: 2-D tiles need a tensor of at least 2 dimensions, got {v.shape}")
        wshape = v.shape
        w = v.reshape(-1, v.shape[-2], v.shape[-1])
        tr, tc = r, c
    P, R, C = w.shape
    nbr, nbc = -(-R // tr), -(-C // tc)
    pad = np.zeros((P, nbr * tr, nbc * tc))
    pad[:, :R, :C] = w
    blocks = pad.reshape(P, nbr, tr, nbc, tc)

    def unblock(a):
        a = a.reshape(P, nbr * tr, nbc * tc)[:, :R, :C].reshape(wshape)
        return np.moveaxis(a, -1, ax) if r == 0 else a

    return blocks, v.shape, unblock


def _scale_layout(s: np.ndarray, shape, tile, axis) -> np.ndarray:
    """(P, nbr, 1, nbc, 1) scales -> x's shape with the blocked axes shrunk to their block counts."""
    r, c = tile
    P, nbr, _, nbc, _ = s.shape
    if r == 0:
        ax = _axis(axis, len(shape))
        moved = list(np.moveaxis(np.empty(shape, dtype=np.int8), ax, -1).shape)
        moved[-1] = nbc
        return np.moveaxis(s.reshape(moved), -1, ax)
    return s.reshape(tuple(shape[:-2]) + (nbr, nbc))
