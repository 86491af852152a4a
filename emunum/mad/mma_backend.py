"""Dispatch of ``scaled_mm`` to the matrix-instruction kernels (``kernels/mma_cpu``, ``kernels/mma_cuda``,
and the exact fast path of ``kernels/mma_fast`` for mxf4nvf4), on checked operands; kernels load on first
use."""
from __future__ import annotations

import numpy as np
import torch

from ..kernels import abi
from .mma import MMAKind, MMAUnit

GROUP = 16  # mxf4nvf4's exactly summed group


def _scales_t(s, rows: int) -> torch.Tensor:
    """Scales as (rows, nblocks) float32 (ones (rows, 1) for units without scales)."""
    return torch.ones(rows, 1, dtype=torch.float32) if s is None else s.to(torch.float32)


def gemm(a: torch.Tensor, sa, b: torch.Tensor, sb, c: torch.Tensor, unit: MMAUnit) -> torch.Tensor:
    """out (M, N) float32 = the instruction chain of ``unit`` on checked a (M, K), b (K, N), scales sa (M, K/block)
    and sb (K/block, N) (None without scales) and c (M, N) fp32 values."""
    M, N = a.shape[0], b.shape[1]
    device = a.device
    A = a.to(torch.float32).contiguous()
    BT = b.to(torch.float32).t().contiguous()
    SA = _scales_t(sa, M).contiguous()
    SBT = _scales_t(None if sb is None else sb.t(), N).contiguous()
    C = c.to(torch.float32).contiguous()
    if device.type == "cuda":
        from ..kernels import cuda as kcuda, mma_cuda

        out = torch.empty(M, N, dtype=torch.float64, device=device)
        args = [kcuda.as_device_array(t.to(device)) for t in (A, BT, SA, SBT, C)]
        with kcuda.device_of(out):
            mma_cuda.gemm(*args, kcuda.as_device_array(out), unit.params())
        return out.to(torch.float32)
    from ..kernels import mma_cpu, parallel

    out = np.empty((M, N), np.float64)
    A, BT, SA, SBT, C = (t.cpu() for t in (A, BT, SA, SBT, C))
    if unit.kind == MMAKind.NV_GROUPS:
        from ..kernels import mma_fast

        P, EA, EBT = _group_operands(A, BT, SA, SBT, unit)
        with parallel.exclusive():
            mma_fast.groups_gemm(A.numpy(), BT.numpy(), SA.numpy(), SBT.numpy(), C.numpy(), P, EA, EBT, out,
                                 unit.params())
    elif unit.kind == MMAKind.NV_FUSED and _fused_fast(A, BT, SA, SBT, C, unit, out):
        pass
    else:
        with parallel.exclusive():
            mma_cpu.gemm(A.numpy(), BT.numpy(), SA.numpy(), SBT.numpy(), C.numpy(), out, unit.params())
    return torch.from_numpy(out).to(torch.float32).to(device)


def _fused_fast(A, BT, SA, SBT, C, unit: MMAUnit, out: np.ndarray) -> bool:
    """Run ``kernels.mma_fast.fused_gemm`` into out; False (nothing run) when an element or scale is not finite."""
    from ..kernels import mma_fast, parallel

    fmt = unit.element_format
    M, K = A.shape
    N = BT.shape[0]
    B = BT.t().contiguous()
    MA, EA = np.empty((M, K), np.int32), np.empty((M, K), np.int32)
    MB, EB = np.empty((K, N), np.int32), np.empty((K, N), np.int32)
    nsteps = max(-(-K // unit.terms), 1)
    if unit.scale is None:
        ESA, ESB = np.zeros((M, nsteps), np.int64), np.zeros((nsteps, N), np.int64)
    else:
        ESA = np.ascontiguousarray(_scale_exponents(SA[:, ::unit.terms // unit.block], -127))
        ESB = np.ascontiguousarray(_scale_exponents(SBT[:, ::unit.terms // unit.block], -127).T)
        if ESA.max(initial=0) >= 10**6 or ESB.max(initial=0) >= 10**6:  # a NaN scale
            return False
    with parallel.exclusive():
        if not (mma_fast.split(A.numpy(), fmt.emin, fmt.man, MA, EA)
                and mma_fast.split(B.numpy(), fmt.emin, fmt.man, MB, EB)):
            return False
        mma_fast.fused_gemm(A.numpy(), BT.numpy(), SA.numpy(), SBT.numpy(), C.numpy(), MA, EA, MB, EB, ESA, ESB,
                            fmt.man, out, unit.params())
    return True


def _scale_exponents(s: torch.Tensor, emin: int) -> np.ndarray:
    """sig_exp's exponent of every scale (zero: -126; NaN: a huge value, so the fast path declines)."""
    s64 = s.to(torch.float64)
    e = torch.clamp(torch.frexp(s64).exponent.to(torch.int64) - 1, min=emin)
    e = torch.where(s64 == 0, torch.full_like(e, -126), e)
    return torch.where(torch.isnan(s64), torch.full_like(e, 10**6), e).numpy()


def _group_operands(A, BT, SA, SBT, unit: MMAUnit):
    """(P, EA, EBT) of ``kernels.mma_fast.groups_gemm``: P (nsteps, M, N) the float64 GEMM of each step's
    scaled products, EA (M, ngroups) / EBT (N, ngroups) each 16-element group's scale exponent."""
    M, K = A.shape
    N = BT.shape[0]
    n = unit.terms
    nsteps = -(-K // n)
    ng = -(-K // GROUP)
    gidx = torch.arange(ng) * GROUP // unit.block
    emin = unit.params()[abi.X_SC_EMIN]
    EA = np.ascontiguousarray(_scale_exponents(SA[:, gidx], emin))
    EBT = np.ascontiguousarray(_scale_exponents(SBT[:, gidx], emin))
    pad = nsteps * n - K
    a = torch.nn.functional.pad(A.to(torch.float64) * SA.to(torch.float64).repeat_interleave(unit.block, 1), (0, pad))
    bt = torch.nn.functional.pad(BT.to(torch.float64) * SBT.to(torch.float64).repeat_interleave(unit.block, 1),
                                 (0, pad))
    P = torch.bmm(a.reshape(M, nsteps, n).transpose(0, 1), bt.reshape(N, nsteps, n).permute(1, 2, 0))
    return P.contiguous().numpy(), EA, EBT
