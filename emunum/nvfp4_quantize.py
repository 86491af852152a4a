"""``quantize`` for the NVFP4 family's per-row outer scales and 4/6 selection (``BlockFormat.nvfp4_path``):
the per-row arrays the kernels take (kernels/nvfp4_cpu.py, kernels/nvfp4_cuda.py), computed with torch ops on
the tensor's device from the (P, R, C) working layout of emunum/block_quantize.py, where a row of blocks is
one (p, r) line.

Plain amax rule with ``outer_scale='row'``: T_r = float32(amax_r / (element max * scale max)), amax_r the
row's largest finite |x| (T_r = 1 if it is 0), and each block as ``BlockFormat`` describes with T_r for T.

4/6 (``four_over_six``), as TransformerEngine's reference_nvfp4.py, in float32 (x read as float32): with an
outer scale, gamax = the largest finite |x| of the tensor (``tensor``) or of the row (``row``) as float32,
ges = min(float32(6 * bound) / gamax, FLT_MAX), replaced by 1 if it is 0, and gds = 1 / ges (float32); the
result is element * S * gds. Single level: ges = gds = 1 and gamax = 6 * bound (so the error's dequantised value
is element * S). The block rule itself: kernels/nvfp4_scalar.py. On the CPU, float32 4/6 with a tensor outer
scale in blocks of 16 columns (rounded to nearest), or rounded stochastically, finds the amax in the kernel path and
makes the same values there (``nvfp4_cpu.quantize_fos_tensor``), without these torch ops.
"""
from __future__ import annotations

import numpy as np
import torch

from .formats import BlockFormat, OuterScale, RoundMode
from .formats.nvfp4 import TENSOR_SCALE_MIN, Metric

_METRIC = {Metric.MAE: 0, Metric.MSE: 1, Metric.ABSMAX: 2}
_FLT_MAX = float(np.finfo(np.float32).max)


def _finite_amax(work: torch.Tensor, per_row: bool) -> torch.Tensor:
    """float64 largest finite |v| per (p, r) row (flat, P * R) or of the whole tensor (one value)."""
    if work.device.type == "cpu" and work.dtype == torch.float32 and work.is_contiguous() and work.numel():
        from .kernels import block_cpu, nvfp4_cpu  # one pass over the bits
        src = work.detach().numpy()
        if per_row:
            return torch.from_numpy(nvfp4_cpu.row_amax(src))
        return torch.tensor([block_cpu.finite_amax(src)], dtype=torch.float64)
    a = work.detach().abs().to(torch.float64)
    a = torch.where(torch.isfinite(a), a, 0.0)
    if per_row:
        return a.amax(dim=2).reshape(-1) if a.shape[2] else torch.zeros(a.shape[0] * a.shape[1], dtype=a.dtype,
                                                                         device=a.device)
    return a.amax().reshape(1)


def line_arrays(work: torch.Tensor, fmt: BlockFormat) -> tuple:
    """(fos, t, ges, gds, gamax, denom, metric): the kernels' per-row arguments for ``work`` (P, R, C)."""
    P, R, _ = work.shape
    n = P * R
    dev = work.device
    per_row = fmt.outer_scale == OuterScale.ROW
    fos = fmt.four_over_six
    if fos is None:
        if fmt.outer_scale == OuterScale.NONE:
            t = torch.ones(n, dtype=torch.float64, device=dev)
        else:
            amax = _finite_amax(work, per_row)
            t = (amax / (fmt.element.max * fmt.scale.max)).to(torch.float32).to(torch.float64)
            t = torch.where(amax == 0, 1.0, t.clamp(min=TENSOR_SCALE_MIN)).expand(n).contiguous()
        dummy = torch.ones(n, dtype=torch.float32, device=dev)
        return (False, t, dummy, dummy, dummy, np.float32(1.0), 0)
    denom = np.float32(6 * fos.bound)
    if fmt.outer_scale == OuterScale.NONE:
        ones = torch.ones(n, dtype=torch.float32, device=dev)
        gamax = torch.full((n,), float(denom), dtype=torch.float32, device=dev)
        return (True, torch.ones(n, dtype=torch.float64, device=dev), ones, ones, gamax, denom, _METRIC[fos.metric])
    gamax = _finite_amax(work.to(torch.float32), per_row).to(torch.float32)
    ges = torch.clamp(torch.tensor(float(denom), dtype=torch.float32, device=dev) / gamax, max=_FLT_MAX)
    ges = torch.where(ges == 0, torch.ones_like(ges), ges)
    gds = torch.tensor(1.0, dtype=torch.float32, device=dev) / ges
    expand = (lambda v: v.expand(n).contiguous())
    return (True, torch.ones(n, dtype=torch.float64, device=dev), expand(ges), expand(gds), expand(gamax), denom,
            _METRIC[fos.metric])


def quantize_lines(work: torch.Tensor, dst: torch.Tensor, scales: torch.Tensor, fmt: BlockFormat, tile,
                   args: tuple, mode: RoundMode, key: int, nbits: int) -> None:
    """Run the NVFP4-family kernel for work's device (args: ``block_args`` of fmt, its tensor scale dropped)."""
    if work.device.type == "cpu" and fmt.four_over_six is None:
        from .kernels import nvfp4_cpu
        if nvfp4_cpu.quantize_rows(work.numpy(), dst.numpy(), scales.numpy(), tile, args, int(mode), key, nbits):
            return  # the float32 fast path, which computes each row's outer scale itself
    fos = fmt.four_over_six
    if work.device.type == "cpu" and fos is not None and fmt.outer_scale == OuterScale.TENSOR:
        from .kernels import nvfp4_cpu
        if nvfp4_cpu.quantize_fos_tensor(work.numpy(), dst.numpy(), scales.numpy(), tile, 6 * fos.bound,
                                         _METRIC[fos.metric], args, int(mode), key, nbits):
            return  # the float32 fast path, which finds the tensor's amax itself
    lines = line_arrays(work, fmt)
    if work.device.type == "cuda":
        from .kernels import cuda as kc, nvfp4_cuda
        dev = [kc.as_device_array(v) if isinstance(v, torch.Tensor) else v for v in lines]
        with kc.device_of(work):
            nvfp4_cuda.quantize_nvfp4(kc.as_device_array(work), kc.as_device_array(dst), kc.as_device_array(scales),
                                      tile, tuple(dev), args, int(mode), key, nbits, stream=kc.torch_stream(work.device))
    elif work.device.type == "cpu":
        from .kernels import nvfp4_cpu
        host = tuple(v.numpy() if isinstance(v, torch.Tensor) else v for v in lines)
        nvfp4_cpu.quantize_nvfp4(work.numpy(), dst.numpy(), scales.numpy(), tile, host, args, int(mode), key, nbits)
    else:
        raise ValueError(f"block formats have kernels for cpu and cuda tensors; x is on {work.device}")


def outer_scale_values(work: torch.Tensor, fmt: BlockFormat) -> torch.Tensor:
    """The outer scale of each (p, r) row of ``work`` (float64, P * R): T_r, gds, or 1."""
    fos, t, _, gds, *_ = line_arrays(work, fmt)
    return gds.to(torch.float64) if fos else t
