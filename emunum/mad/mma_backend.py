"""Dispatch of ``scaled_mm`` to the matrix-instruction kernels (``kernels/mma_cpu``, ``kernels/mma_cuda``,
and the exact fast paths of ``kernels/mma_fast``), on checked operands; kernels load on first use."""
from __future__ import annotations

import numpy as np
import torch

from .mma import MMAUnit


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
    with parallel.exclusive():
        mma_cpu.gemm(A.cpu().numpy(), BT.cpu().numpy(), SA.cpu().numpy(), SBT.cpu().numpy(), C.cpu().numpy(), out,
                     unit.params())
    return torch.from_numpy(out).to(torch.float32).to(device)
