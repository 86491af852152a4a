"""Dispatch of MAD units with a multiplier (``emunum.mad.multiplier``) to ``kernels.gemm_approx`` (CPU) and
``kernels.gemm_approx_cuda`` (CUDA); table multipliers get their operands as codes
(``Multiplier.encode_operands``). Tensors in (CPU or CUDA), float64 tensors out; kernels load on first use.
"""
from __future__ import annotations

import torch

from .multiplier import MultiplierKind
from .unit import MADUnit, stream_keys


def operands(unit: MADUnit, **tensors) -> list:
    """The tensors as the kernels take them: a table multiplier's operands become their codes (float32)."""
    m = unit.multiplier
    if m.kind != MultiplierKind.TABLE:
        return list(tensors.values())
    return [m.encode_operands(x, name) for name, x in tensors.items()]


def gemm(A: torch.Tensor, B: torch.Tensor, unit: MADUnit, seed: int, bias, nb: int, c) -> torch.Tensor:
    """out (nb, M, N) float64 = A[b % bA] @ B[b % bB] (+ bias) on ``unit`` with its multiplier; c (addmm's
    accumulator input, broadcastable to (nb, M, N)) needs lanes=1 and chunk=None. A, B on CPU or CUDA."""
    if c is not None and (unit.lanes != 1 or unit.chunk is not None):
        raise ValueError(f"addmm/baddbmm on {unit}: an accumulator input with a multiplier needs lanes=1 and "
                         "chunk=None")
    A, B = operands(unit, A=A, B=B)
    M, N = A.shape[1], B.shape[2]
    device = A.device
    m = unit.multiplier
    margs = m.kernel_args()
    mulp, accp = unit.kernel_params()
    with torch.no_grad():
        a32 = A.detach().to(torch.float32).contiguous()
        b32 = B.detach().to(torch.float32).contiguous()
        bias64 = None if bias is None else bias.detach().to(torch.float64).expand(nb, M, N).contiguous()
        c64 = None if c is None else c.detach().to(torch.float64).expand(nb, M, N).contiguous()
        out = torch.empty((nb, M, N), dtype=torch.float64, device=device)
        if out.numel() == 0:
            return out
        if device.type == "cuda":
            from ..kernels import gemm_approx_cuda

            gemm_approx_cuda.gemm_torch(a32, b32, bias64, c64, out, int(unit.fused), mulp, accp, unit.lanes,
                                        unit.chunk or 0, stream_keys(seed), unit.sr_bits, margs, m.fn)
            return out
        from ..kernels import gemm_approx

        gemm_approx.gemm(a32.numpy(), b32.numpy(), None if bias64 is None else bias64.numpy(),
                         None if c64 is None else c64.numpy(), out.numpy(), int(unit.fused), mulp, accp, unit.lanes,
                         unit.chunk or 0, stream_keys(seed), unit.sr_bits, margs, m.fn)
        return out


def elementwise(a32: torch.Tensor, b32: torch.Tensor, c64: torch.Tensor, out: torch.Tensor, unit: MADUnit,
                seed: int) -> None:
    """out = the one-step MAD of flat contiguous a32, b32 (float32), c64 (float64) with the unit's multiplier."""
    a32, b32 = operands(unit, a=a32, b=b32)
    m = unit.multiplier
    margs = m.kernel_args()
    mulp, accp = unit.kernel_params()
    if out.device.type == "cuda":
        from ..kernels import gemm_approx_cuda

        gemm_approx_cuda.mad_torch(a32, b32, c64, out, int(unit.fused), mulp, accp, stream_keys(seed),
                                   unit.sr_bits, margs, m.fn)
    else:
        from ..kernels import gemm_approx

        gemm_approx.mad(a32.numpy(), b32.numpy(), c64.numpy(), out.numpy(), int(unit.fused), mulp, accp,
                        stream_keys(seed), unit.sr_bits, margs, m.fn)

