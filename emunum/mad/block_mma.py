"""``block_scaled_mm``: A @ B with A, B quantised to block formats and multiplied on a block-scaled matrix
instruction (``emunum.mad.mma``: kind::mxf8f6f4, kind::mxf4nvf4), as a training GEMM does on such hardware.

A (..., M, K) is quantised to ``fmt_a`` along K and B (..., K, N) to ``fmt_b`` along K (``emunum.quantize``'s
semantics and seeds, as in ``emunum.mad.block``), giving element values, block scales and tensor scales Ta, Tb
(1 without tensor_scale). The instruction takes the elements and the block scales (the scale rule of the
policy's block format produced them): each matrix of the batch is ``scaled_mm(elements_a, scales_a,
elements_b, scales_b, 0, unit)``; K is zero-padded to a multiple of the block (the padded elements are 0,
the last block keeps its scale). With tensor scales (NVFP4) the epilogue multiplies by alpha = fp32(Ta*Tb),
one fp32 rounding to nearest-even (cuBLAS's alpha). The result is returned in A's and B's promoted dtype.

Compatibility (``check_formats``): the formats' elements must be the unit's element format, their scales the
unit's scale format (E8M0 for ue8m0, E4M3 for ue4m3), and their block length along K the unit's block.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .. import gemm_listener
from ..formats import BlockFormat, E8M0Format, FloatFormat, MXPlusFormat, RoundMode, get_format
from ..quantize import check_sr_bits, check_tensor, resolve_seed
from ..rng import seed_key
from .block import _SEED_A, _SEED_B, _derived, _k_length, _split
from .compile_boundary import graph_break
from .mma import MMAUnit, mma_preset
from .scaled_gemm import scaled_mm


def check_formats(fa, fb, unit: MMAUnit) -> None:
    """Raise ValueError unless block formats fa (A, K last) and fb (B, K first) feed ``unit``."""
    for name, f, k_last in (("fmt_a", fa, True), ("fmt_b", fb, False)):
        if not isinstance(f, BlockFormat):
            raise ValueError(f"{name}={f.name}: {unit.name} takes block-scaled operands; allowed: a BlockFormat")
        if isinstance(f, MXPlusFormat):
            raise ValueError(f"{name}={f.name}: {unit.name} decodes every element with its exponent field and has no "
                             "MX+ block max; allowed: a plain MX or NVFP4 format (MX+ runs on MAD units: "
                             "emunum.mad.block_matmul)")
        if unit.scale is None:
            raise ValueError(f"{unit.name} takes no block scales; allowed with block formats: a block-scaled preset "
                             "(b200_mxf8f6f4_e4m3, b200_mxf4nvf4_ue4m3, b200_mxf4nvf4_ue8m0)")
        if f.element != unit.element_format:
            raise ValueError(f"{name}={f.name} has {f.element.name} elements; {unit.name} takes {unit.element}")
        want = E8M0Format if unit.scale == "e8m0" else FloatFormat
        if not isinstance(f.scale, want) or (unit.scale == "ue4m3" and f.scale != unit.scale_format):
            raise ValueError(f"{name}={f.name} has {f.scale.name} scales; {unit.name} takes {unit.scale} scales")
        if _k_length(f, k_last) != unit.block:
            raise ValueError(f"{name}={f.name} has blocks of {_k_length(f, k_last)} along K; {unit.name} takes "
                             f"blocks of {unit.block}")


@graph_break
def block_scaled_mm(A: torch.Tensor, B: torch.Tensor, fmt_a, fmt_b, unit, *, rounding="nearest", rounding_b=None,
                    seed: int | None = None, sr_bits: int = 32) -> torch.Tensor:
    """C = A @ B with A quantised to ``fmt_a`` along K and B to ``fmt_b``, on the block-scaled instruction
    ``unit`` (module docstring). A (..., M, K), B (..., K, N) with equal batch dims; rounding / rounding_b:
    the operands' rounding modes; seed: for stochastic operand rounding (None: drawn when needed)."""
    unit = mma_preset(unit)
    check_tensor(A, "A")
    check_tensor(B, "B")
    if A.dim() < 2 or A.dim() != B.dim() or A.shape[:-2] != B.shape[:-2] or A.shape[-1] != B.shape[-2]:
        raise ValueError(f"block_scaled_mm needs A (..., M, K) and B (..., K, N) with the same batch dims, got A "
                         f"{tuple(A.shape)}, B {tuple(B.shape)}")
    fa, fb = get_format(fmt_a), get_format(fmt_b)
    check_formats(fa, fb, unit)
    mode = RoundMode.parse(rounding)
    mode_b = mode if rounding_b is None else RoundMode.parse(rounding_b, "rounding_b")
    nbits = check_sr_bits(sr_bits)
    seed = resolve_seed(seed) if RoundMode.STOCHASTIC in (mode, mode_b) else 0
    key_a = seed_key(_derived(seed, _SEED_A)) if mode == RoundMode.STOCHASTIC else seed_key(0)
    key_b = seed_key(_derived(seed, _SEED_B)) if mode_b == RoundMode.STOCHASTIC else seed_key(0)
    L = unit.block
    flops = 2 * math.prod(A.shape[:-1]) * A.shape[-1] * B.shape[-1]  # coverage counts K, not K padded to blocks
    with torch.no_grad(), gemm_listener.native("mma_gemm", flops):
        ea, sa, ta = _split(A, fa, -1, mode, key_a, nbits)
        eb, sb, tb = _split(B, fb, -2, mode_b, key_b, nbits)
        K = A.shape[-1]
        pad = (-K) % L
        sa_blk = sa[..., ::L]  # (..., M, nblk): the first element's scale is its block's
        sb_blk = sb[..., ::L, :]  # (..., nblk, N)
        ea = torch.nn.functional.pad(ea, (0, pad))
        eb = torch.nn.functional.pad(eb, (0, 0, 0, pad))
        batch, M, N = A.shape[:-2], A.shape[-2], B.shape[-1]
        nb = math.prod(batch)
        ea, eb = ea.reshape(nb, M, K + pad), eb.reshape(nb, K + pad, N)
        sa_blk, sb_blk = sa_blk.reshape(nb, M, sa_blk.shape[-1]), sb_blk.reshape(nb, sb_blk.shape[-2], N)
        out = torch.empty((*batch, M, N), dtype=torch.float32, device=A.device)  # its own tensor, not a view
        for i, o in enumerate(out.view(nb, M, N)):
            o.copy_(scaled_mm(ea[i], sa_blk[i], eb[i], sb_blk[i], None, unit))
        if fa.tensor_scale or fb.tensor_scale:
            out = out * torch.tensor(float(np.float32(ta * tb)), dtype=torch.float32)  # one fp32 rounding
    return out.to(torch.promote_types(A.dtype, B.dtype))


def is_mma_unit(unit) -> bool:
    return isinstance(unit, MMAUnit)
