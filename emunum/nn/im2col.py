"""The im2col matrix of a 2-D convolution in the block GEMM's row layout, (N*Ho*Wo, C*kh*kw), for float32 CPU
tensors in eager mode: one pass (kernels/im2col_cpu.py) where ``F.unfold`` followed by a transposing copy took
two, and a backward that adds the gradient's columns back into the image as that pair's backward (torch's
col2im) does, in the same order, without first transposing the gradient. Values and gradients are the same
bits as ``F.unfold(x, ...).transpose(1, 2).reshape(-1, K)`` under autograd (tests/nn/test_im2col.py)."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..ops import eager_ok


def _geometry(x: Tensor, k, st, p, d):
    """(Ho, Wo) of a 2-D convolution of x (N, C, H, W) with kernel k, stride st, padding p, dilation d."""
    return tuple((x.shape[2 + i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) // st[i] + 1 for i in range(2))


class _Im2Col(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, k, st, p, d, tc: int, scans: list) -> Tensor:
        from ..kernels import im2col_cpu  # noqa: PLC0415  (compiled on first use)

        ho, wo = _geometry(x, k, st, p, d)
        ctx.geometry = (x.shape, k, st, p, d, ho, wo)
        src = x.detach().resolve_neg().contiguous()
        out = torch.empty((x.shape[0] * ho * wo, x.shape[1] * k[0] * k[1]), dtype=x.dtype)
        args = (src.numpy(), out.numpy(), k[0], k[1], st[0], st[1], d[0], d[1], p[0], p[1], ho, wo)
        if tc:
            amaxes = np.empty(out.shape[0] * -(-out.shape[1] // tc), dtype=np.float64)
            fin = im2col_cpu.im2col_scan(*args, amaxes, tc)
            scans.append((amaxes, float(np.uint32(fin).view(np.float32))))
        else:
            im2col_cpu.im2col(*args)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor):
        from ..kernels import im2col_cpu  # noqa: PLC0415

        shape, k, st, p, d, ho, wo = ctx.geometry
        out = torch.empty(shape, dtype=torch.float32)
        im2col_cpu.col2im(g.detach().resolve_neg().contiguous().numpy(), out.numpy(), k[0], k[1], st[0], st[1],
                          d[0], d[1], p[0], p[1], ho, wo)
        return out, None, None, None, None, None, None


def im2col_rows(x: Tensor, k, st, p, d) -> Optional[Tensor]:
    """``F.unfold(x, k, dilation=d, padding=p, stride=st).transpose(1, 2).reshape(-1, C*k[0]*k[1])`` for a
    float32 CPU x (N, C, H, W) in eager mode (autograd included), else None (the caller takes that path)."""
    return im2col_rows_scanned(x, k, st, p, d, 0)[0]


def im2col_rows_scanned(x: Tensor, k, st, p, d, tc: int):
    """(``im2col_rows(x, k, st, p, d)``, its scan): where the rows were made here and tc > 0, the scan is
    (amaxes, amax) for 1-D blocks of tc along the rows, what the block quantiser's amax pass finds
    (``emunum.hadamard.rht_scanned`` describes the pair); None otherwise."""
    if x.dtype != torch.float32 or not x.is_cpu or x.dim() != 4 or x.numel() == 0 or not eager_ok(x):
        return None, None
    if min(_geometry(x, k, st, p, d)) <= 0:
        return None, None  # F.unfold's own error for a kernel larger than the padded input
    scans = []
    cols = _Im2Col.apply(x, tuple(k), tuple(st), tuple(p), tuple(d), int(tc), scans)
    return cols, (scans[0] if scans else None)
