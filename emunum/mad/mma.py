"""``MMAUnit``: a matrix instruction's datapath (Blackwell tcgen05 / block-scaled MMA, Hopper wgmma, Ampere
mma, AMD CDNA3 MFMA), after MMA-Sim's bit-accurate models, and the presets that name them.

Source: P. Xie, Y. Wang, F. Yang, M. Yang, "MMA-Sim: Bit-Accurate Reference Model of Tensor Cores and Matrix
Cores", arXiv:2511.10909 (2025), code github.com/microsoft/MMA-Sim (MIT), ``mmasim/simulator/arithmetic.py``
(commit and validation in tests/data/mmasim/PROVENANCE.md). The datapaths, precisely:

Operands and exponents. Elements a_k, b_k are values of the unit's element format; c and every result are
fp32 values. For a value x of a format with smallest exponent emin: exp(x) = max(floor(log2|x|), emin) and
sig(x) = x / 2**exp(x) (a subnormal keeps emin and a significand below 1); a zero has sig 0 and exp -126 in
every format (MMA-Sim's convention; it lets zero products and a zero c take part in the alignment below).
c's emin is -126 (fp32). An instruction of K products is applied along a dot product of length K_total in
steps, k = s*K .. s*K + K - 1, each step's result the next step's c (the first c is the caller's C).

NV_FUSED (kind::f8f6f4, wgmma, mma, kind::mxf8f6f4), one step of n = ``terms`` products, F = ``frac_bits``:
  terms: c with (sig(c), exp(c)); each product with sig(a)sig(b) and exp(a) + exp(b) + exp(sa) + exp(sb)
    (block-scaled kinds: the step's power-of-two scales sa, sb enter as exponents only);
  E = the largest exponent of all terms (zeros included, see above);
  S = sum over terms of trunc(sig * 2**(F + exp - E)) (each term truncated toward zero to F bits below E,
    the sum exact);
  result = S * 2**(E - F) truncated toward zero to ``out_man`` fraction bits at exponent
    max(floor(log2|.|), -126); 2**128 or more gives inf. S = 0 gives +0.
  a100_mma_bf16 (m16n8k16) runs as two steps of 8 products (MMA-Sim's split-K on Ampere).
NV_GROUPS (kind::mxf4nvf4, F = 35): the step's 64 products form 4 groups of 16; G_g = the exact sum of the
  group's products; each group is a term with significand G_g * sig(sa) * sig(sb) and exponent exp(sa) +
  exp(sb) (its scales: index k // block); c as above; E, S and the result as in NV_FUSED. The groups are
  aligned on their scale exponents, not on their own magnitude: a group sum keeps every bit above 2**(E-35).
AMD_TWO_STAGE (CDNA3 MFMA, F = 24, n = 8 (bf16) or 16 (fp8)): stage 1: the products (exponents as above),
  for fp8 in two interleaved halves (even k and odd k of the step, each aligned to its own largest exponent
  and truncated to 24 bits below it, then both floored to 24 bits below the larger of the two), for bf16
  all together, give (S, E); stage 2: M = max(E, exp(c)); S floored to 31 fraction bits at M, c floored to
  24 fraction bits at M (fp8: c is dropped if exp(c) < M - 25); their exact sum rounded to fp32 to
  nearest-even (overflow: inf). A product of magnitude 2**128 or more makes the step +-inf (NaN if both).
Non-finite: a step whose binary64 sum of scaled products and c is NaN or infinite returns that value
  (mxf4nvf4: a NaN scale or c gives NaN, an infinite c passes through).

Scales are taken as given: E8M0 values (powers of two 2**-127 .. 2**127, or NaN) or UE4M3 values
(non-negative E4M3 values); mxf4nvf4 with UE8M0 scales of block 32 gives each pair of groups one scale.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from ..formats import get_format
from ..kernels import abi


MAX_STEP = 64  # products per step the CUDA kernel holds (kernels/mma_cuda.py)


class MMAKind(enum.IntEnum):
    """The step datapath (module docstring)."""

    NV_FUSED = abi.X_NV_FUSED
    NV_GROUPS = abi.X_NV_GROUPS
    AMD_TWO_STAGE = abi.X_AMD_TWO_STAGE


@dataclass(frozen=True)
class MMAUnit:
    """One matrix instruction as a datapath: ``kind``; ``element``: the a/b element format's name; ``k``: the
    instruction's K; ``terms``: products per step (k, or k/2 for Ampere's split-K); ``frac_bits``: F, the
    bits kept below the step exponent; ``out_man``: the result's fraction bits (NVIDIA: 23, or 13 for fp8
    wgmma's e8m13); ``scale``: None, "e8m0" or "ue4m3"; ``block``: elements per scale (0 without scales);
    ``pairs``: AMD fp8's even/odd split; ``source``: the MMA-Sim instruction it follows."""

    name: str
    kind: MMAKind
    element: str
    k: int
    terms: int
    frac_bits: int
    out_man: int = 23
    scale: str | None = None
    block: int = 0
    pairs: bool = False
    source: str = ""

    def __post_init__(self):
        object.__setattr__(self, "kind", MMAKind(self.kind))
        for field, lo, hi in (("k", 1, 1024), ("terms", 1, MAX_STEP), ("frac_bits", 0, 40), ("out_man", 1, 23)):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise ValueError(f"MMAUnit.{field}={v!r}; allowed: an int in {lo}..{hi}")
        if self.scale not in (None, "e8m0", "ue4m3"):
            raise ValueError(f"MMAUnit.scale={self.scale!r}; allowed: None, 'e8m0', 'ue4m3'")
        if (self.scale is None) != (self.block == 0) or (self.block and self.terms % self.block):
            raise ValueError(f"MMAUnit.block={self.block!r} with scale={self.scale!r}, terms={self.terms}; allowed: "
                             "0 without scales, else a divisor of terms")
        self.element_format  # noqa: B018  (an unknown element format raises here)

    @property
    def element_format(self):
        return get_format(self.element)

    @property
    def scale_format(self):
        return None if self.scale is None else get_format("e8m0" if self.scale == "e8m0" else "e4m3fn")

    def params(self) -> np.ndarray:
        """The int64 parameter vector of ``kernels.mma_scalar`` (slots ``kernels.abi.X_*``)."""
        p = np.zeros(abi.NXPARAM, np.int64)
        p[abi.X_KIND], p[abi.X_TERMS], p[abi.X_FRAC], p[abi.X_OUT_MAN] = int(self.kind), self.terms, self.frac_bits, self.out_man
        p[abi.X_EL_EMIN] = self.element_format.emin
        p[abi.X_SC_EMIN] = {None: 0, "e8m0": -127, "ue4m3": -6}[self.scale]
        p[abi.X_BLOCK], p[abi.X_PAIRS] = self.block, int(self.pairs)
        return p

    def __str__(self) -> str:
        """The preset's name, or the full spec for a unit that is not a preset."""
        return self.name if MMA_PRESETS.get(self.name) == self else repr(self)

    def replace(self, **changes) -> "MMAUnit":
        """A copy with fields changed (e.g. ``frac_bits`` one fewer, to check that tests notice)."""
        import dataclasses

        return dataclasses.replace(self, **changes)


_NV, _G, _AMD = MMAKind.NV_FUSED, MMAKind.NV_GROUPS, MMAKind.AMD_TWO_STAGE
_BW = "MMA-Sim tcgen05mma('Blackwell', '{}')"
MMA_PRESETS = {u.name: u for u in (
    MMAUnit("b200_f8f6f4_e4m3", _NV, "e4m3fn", 32, 32, 25, source=_BW.format("m128nNk32.f32.e4m3.e4m3")),
    MMAUnit("b200_f8f6f4_e5m2", _NV, "e5m2", 32, 32, 25, source=_BW.format("m128nNk32.f32.e5m2.e5m2")),
    MMAUnit("b200_mxf8f6f4_e4m3", _NV, "e4m3fn", 32, 32, 25, scale="e8m0", block=32,
            source="MMA-Sim tcgen05mma_block_scale('Blackwell', 'm128nNk32.block32.f32.e4m3.e4m3.ue8m0')"),
    MMAUnit("b200_mxf4nvf4_ue4m3", _G, "fp4_e2m1", 64, 64, 35, scale="ue4m3", block=16,
            source="MMA-Sim tcgen05mma_block_scale('Blackwell', 'm128nNk64.block16.f32.e2m1.e2m1.ue4m3')"),
    MMAUnit("b200_mxf4nvf4_ue8m0", _G, "fp4_e2m1", 64, 64, 35, scale="e8m0", block=32,
            source="MMA-Sim tcgen05mma_block_scale('Blackwell', 'm128nNk64.block32.f32.e2m1.e2m1.ue8m0')"),
    MMAUnit("h100_wgmma_e4m3", _NV, "e4m3fn", 32, 32, 13, out_man=13,
            source="MMA-Sim wgmma('Hopper', 'm64nNk32.f32.e4m3.e4m3')"),
    MMAUnit("a100_mma_bf16", _NV, "bf16", 16, 8, 24, source="MMA-Sim mma('Ampere', 'm16n8k16.f32.bf16.bf16.f32')"),
    MMAUnit("mi300_mfma_fp8", _AMD, "e4m3fnuz", 32, 16, 24, pairs=True,
            source="MMA-Sim mfma('CDNA3', 'f32_16x16x32_fp8_fp8')"),
    MMAUnit("mi300_mfma_bf16", _AMD, "bf16", 16, 8, 24, source="MMA-Sim mfma('CDNA3', 'f32_16x16x16_bf16')"),
    MMAUnit("h100_wgmma_e5m2", _NV, "e5m2", 32, 32, 13, out_man=13,
            source="MMA-Sim wgmma('Hopper', 'm64nNk32.f32.e5m2.e5m2')"),
    MMAUnit("mi300_mfma_bf8", _AMD, "e5m2fnuz", 32, 16, 24, pairs=True,
            source="MMA-Sim mfma('CDNA3', 'f32_16x16x32_bf8_bf8')"),
)}


def mma_preset(name) -> MMAUnit:
    """The ``MMAUnit`` preset of that name (``MMA_PRESETS``); an ``MMAUnit`` passes through."""
    if isinstance(name, MMAUnit):
        return name
    if not isinstance(name, str):
        raise TypeError(f"unit must be an MMAUnit or a preset name (str), got {type(name).__name__}")
    unit = MMA_PRESETS.get(name.strip().lower())
    if unit is None:
        raise ValueError(f"unit={name!r} is not a matrix-instruction preset; allowed: {', '.join(MMA_PRESETS)}")
    return unit
