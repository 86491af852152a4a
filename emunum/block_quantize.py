"""``quantize`` for block-scaled formats (``BlockFormat``): lay the tensor out as (P, R, C) with the blocks
along its last axis (or as tiles over its last two), and hand it to the block kernel for its device.

Stochastic rounding draws element i's bits from (seed, i), i the flat C-order index in that working layout
(the block axis moved last), so CPU and CUDA agree for any thread count.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from . import buffers
from .formats import BlockFormat, FloatFormat, RoundMode, TableFormat
from .formats.block import _axis
from .formats.mxplus import MXPlusFormat

_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}


def block_args(fmt: BlockFormat, t: float) -> tuple:
    """The plain ints and floats the block cores take (kernels/scalar/block.py), tensor scale ``t`` last."""
    el, sc = fmt.element, fmt.scale
    if isinstance(el, FloatFormat):
        kind, p0, p1, p2, negzero = 0, el.man, el.emin, int(el.subnormals), int(el.has_negative_zero)
    else:
        kind, p0, p1, p2, negzero = 1, el.frac_bits, el.code_min, el.code_max, 0
    lo, hi = fmt.scale_exp_range
    if isinstance(sc, FloatFormat):
        s = (sc.man, sc.emin, int(sc.subnormals), float(sc.max), float(sc.min_subnormal))
    else:
        s = (0, 0, 0, float(sc.max), float(sc.min_subnormal))
    rule = fmt.scale_rule.code  # kernels/scalar/block.py's rule codes
    return (kind, p0, p1, p2, fmt.element_emax, float(el.max), negzero, rule, lo, hi, *s, float(t))


def tensor_scale(work: torch.Tensor, fmt: BlockFormat, amax: float | None = None) -> float:
    """NVFP4's per-tensor scale T (see BlockFormat) from work's largest finite |v| (``amax`` when the caller
    has it); 1.0 without tensor_scale."""
    if not fmt.tensor_scale:
        return 1.0
    if amax is None and work.device.type == "cpu" and work.dtype == torch.float32 and work.is_contiguous():
        from .kernels import block_cpu
        amax = block_cpu.finite_amax(work.detach().numpy())  # one vectorised pass over the bits
    elif amax is None:
        a = work.detach().abs()
        amax = float(torch.where(torch.isfinite(a), a, 0.0).max()) if a.numel() else 0.0
    return fmt.tensor_scale_for(amax)


def working_layout(x: torch.Tensor, fmt: BlockFormat, axis: int):
    """(work, tile, restore): work is a contiguous (P, R, C) tensor (float32 for 16-bit x), tile its block
    shape, restore(w) maps a (P, R, C) result back to x's shape."""
    r, c = fmt.tile
    w = x.detach()
    if w.is_neg():  # a lazily negated view is read by value (the kernels read memory)
        w = w.resolve_neg()
    if w.dtype not in _NUMPY:
        w = w.float()
    if r == 0:
        ax = _axis(axis, x.dim()) if x.dim() else 0
        if x.dim() == 0:
            w = w.reshape(1)
            ax = 0
        moved = w.movedim(ax, -1)
        mshape = moved.shape
        # explicit sizes: reshape cannot infer a -1 beside a zero-size axis (an empty tensor is valid input)
        work = moved.reshape(1, math.prod(mshape[:-1]), mshape[-1]).contiguous()
        return work, (1, c), lambda t: t.reshape(mshape).movedim(-1, ax).reshape(x.shape)
    if x.dim() < 2:
        raise ValueError(f"block_size={fmt.block_size}: 2-D tiles need a tensor of at least 2 dimensions, "
                         f"got shape {tuple(x.shape)}")
    work = w.reshape(math.prod(x.shape[:-2]), x.shape[-2], x.shape[-1]).contiguous()
    return work, (r, c), lambda t: t.reshape(x.shape)


def quantize_block_checked(x: torch.Tensor, fmt: BlockFormat, mode: RoundMode, key: int, nbits: int,
                           axis: int = -1, out: torch.Tensor | None = None, return_scales: bool = False,
                           scan=None):
    """``emunum.quantize`` for a BlockFormat, arguments already checked (key: the seed's key). scan: None, or
    (amaxes, amax) from the pass that produced x (``emunum.hadamard.rht_scanned``): each block's largest |v|
    (float64 ndarray, one per block in the scales' order) and the largest finite |v|, taken in place of the
    amax pass where that pass would run (then ``amaxes`` becomes the scales' storage)."""
    work, tile, restore = working_layout(x, fmt, axis)
    P, R, C = work.shape
    scanned = (fmt.tensor_scale and x.device.type == "cpu" and work.dtype == torch.float32 and tile[0] == 1
               and not isinstance(fmt.element, TableFormat) and not isinstance(fmt, MXPlusFormat)
               and not fmt.nvfp4_path)  # the amax pass's branch below
    nbr, nbc = -(-R // tile[0]), -(-C // tile[1])
    if scanned and scan is not None and scan[0].shape == (P * nbr * nbc,) and scan[0].dtype == np.float64:
        scales = torch.from_numpy(scan[0]).view(P, nbr, nbc)
    else:
        scan = None
        scales = torch.empty((P, nbr, nbc), dtype=torch.float64, device=x.device)
        buffers.advise_huge_pages(scales)  # 1/16 (MX) or 1/8 (NVFP4) of float32 x's bytes
    direct = (out is not None and out.dtype == work.dtype and out.is_contiguous()
              and (fmt.tile[0] != 0 or x.dim() == 0 or _axis(axis, x.dim()) == x.dim() - 1))
    dst = out.view(work.shape) if direct else buffers.empty_like(work)  # the layout of x, and of a contiguous out
    back = None
    if direct and work.device.type == "cpu" and work.numel() and dst.data_ptr() == work.data_ptr():
        # in place (out is x; ``quantize`` refuses a partial overlap): the CPU kernels' loops vectorise only where
        # source and destination lie apart (2-3.5x slower in place, benchmarks/RESULTS.md), so they write a
        # fresh buffer, copied into out after
        back, dst = dst, buffers.empty_like(work)
    if x.is_meta:  # shape propagation, as for element formats: a meta tensor has no values to round
        pass
    elif x.numel() and isinstance(fmt.element, TableFormat):
        if x.device.type not in ("cpu", "cuda"):
            raise ValueError(f"block formats have kernels for cpu and cuda tensors; x is on {x.device}")
        q, s = table_blocks(work, fmt, tile, mode, key, nbits)
        dst.copy_(q)
        scales.copy_(s)
    elif x.numel() and isinstance(fmt, MXPlusFormat):  # the MX+ block max (emunum/mxplus_quantize.py)
        from .mxplus_quantize import quantize_mxplus
        quantize_mxplus(work, dst, scales, fmt, tile, mode, key, nbits)
    elif x.numel() and fmt.nvfp4_path:  # per-row outer scales, 4/6 selection (emunum/nvfp4_quantize.py)
        from .nvfp4_quantize import quantize_lines
        quantize_lines(work, dst, scales, fmt, tile, block_args(fmt, 1.0)[:-1], mode, key, nbits)
    elif x.numel():
        amax = None if scan is None else scan[1]
        if scanned and scan is None:
            from .kernels import block_cpu
            amax = block_cpu.block_amaxes(work.numpy(), scales.numpy(), tile[1])  # T's amax and each block's
        t = tensor_scale(work, fmt, amax)
        args = block_args(fmt, t)
        if x.device.type == "cuda":
            from .kernels import block_cuda, cuda as kc
            with kc.device_of(x):
                block_cuda.quantize_blocks(kc.as_device_array(work), kc.as_device_array(dst),
                                           kc.as_device_array(scales), tile, args, int(mode), key, nbits,
                                           stream=kc.torch_stream(x.device))
        elif x.device.type == "cpu":
            from .kernels import block_cpu
            block_cpu.quantize_blocks(work.numpy(), dst.numpy(), scales.numpy(), tile, args, int(mode), key, nbits,
                                      scanned=scanned)
        else:
            raise ValueError(f"block formats have kernels for cpu and cuda tensors; x is on {x.device}")
    if back is not None:
        back.copy_(dst)
    if direct:
        torch.autograd.graph.increment_version(out)
        return (out, scales) if return_scales else out
    result = restore(dst).to(x.dtype)
    if out is not None:
        with torch.no_grad():
            out.copy_(result)
        torch.autograd.graph.increment_version(out)
        result = out
    return (result, scales) if return_scales else result


def table_blocks(work: torch.Tensor, fmt: BlockFormat, tile, mode: RoundMode, key: int, nbits: int):
    """(values, scales) of a (P, R, C) tensor for a BlockFormat with a codebook element (``nf4_b64``): the
    scales by torch ops on work's device (BlockFormat's amax rule), the elements x / (S*T) (float64) by the
    table kernel with the stochastic bits of the flat (P, R, C) index, as the block kernels use."""
    from .reference import quantize_torch
    P, R, C = work.shape
    tr, tc = tile
    nbr, nbc = -(-R // tr), -(-C // tc)
    w = work.to(torch.float64)
    pad = torch.zeros((P, nbr * tr, nbc * tc), dtype=torch.float64, device=work.device)
    pad[:, :R, :C] = w
    blocks = pad.view(P, nbr, tr, nbc, tc)
    isnan = torch.isnan(blocks)
    nan = isnan.any(dim=4).any(dim=2)
    amax = torch.where(isnan, 0.0, blocks).abs().amax(dim=(2, 4))
    t = tensor_scale(work, fmt)
    el, sc = fmt.element, fmt.scale
    want = torch.clamp(amax / el.max / t, max=sc.max)
    s = quantize_torch(want, sc, RoundMode.NEAREST).clamp(min=sc.min_subnormal, max=sc.max)
    s = torch.where(nan, torch.nan, s)
    full = (s * t).repeat_interleave(tr, dim=1).repeat_interleave(tc, dim=2)[:, :R, :C]
    scaled = (w / full).contiguous().view(-1)
    q = torch.empty_like(scaled)
    n, tab = el.to_kernel_args()  # kernels.abi.TableArgs
    if work.device.type == "cuda":
        from .kernels import cuda as kc, table_cuda
        with kc.device_of(work):
            table_cuda.quantize_table(kc.as_device_array(scaled), kc.as_device_array(q), n,
                                      table_cuda.device_table(tab), int(mode), key, nbits,
                                      stream=kc.torch_stream(work.device))
    else:
        from .kernels import table_cpu
        table_cpu.quantize_table(scaled.numpy(), q.numpy(), n, tab, int(mode), key, nbits)
    return (q.view(P, R, C) * full).to(work.dtype), s
