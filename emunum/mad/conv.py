"""``conv1d`` / ``conv2d`` on a MAD unit, through unfold (im2col) and the emulated GEMM, with autograd.

Forward: out[n, o, y, x] = round_acc(dot + b[o]), where dot runs over k = (c, i, j) in C order (input
channel within o's group, kernel row, kernel column; i.e. ``weight.reshape(out_channels, -1)``'s columns),
on the unfolded, zero-padded input: padding positions are terms (products with 0) like any other.
Backward:
- grad_weight[o, c, i, j] = sum over (n, y, x) in C order of grad[n, o, y, x] * input_padded[...]
  (grad-weight unit); grad_bias[o] = the same sum of grad * 1 (a GEMM against ones, grad-weight unit);
- grad_input = the stride-1 convolution of grad (zero-upsampled by ``stride``, padded by
  dilation*(kernel-1) on both sides, plus rows/columns at the end to reach the input size) with the
  flipped kernel, on the grad-input unit: each element's dot runs over (o within the group, i', j') with
  i' = kh-1-i, j' = kw-1-j in C order, the inserted and padded zeros being terms.
Explicit padding (ints, tuples, "valid", "same") is applied with ``F.pad`` before the convolution; its
gradient (a crop) is exact. Where the grad-input unit runs on the fast kernel (``backend.fast_layout``) and no pad
exceeds dilation*(kernel-1), the grad-input convolution computes the unpadded input's positions only (the
elements a crop keeps, each with the same bits). On the fast kernel in float32, each sample's unfolded columns
are made right before its GEMM (``kernels/conv_fast.py``), not for the whole batch at once, and where the products
are exact the weight gradient (groups 1) copies each span's terms of the gradient and the image into its tiles
instead of laying out either operand (``backend.conv_wgrad``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import backend
from .compile_boundary import graph_break
from .functional import (ROLE_GRAD_BIAS, ROLE_GRAD_INPUT, ROLE_GRAD_WEIGHT, _bwd_seed, _resolve_seed,
                         parse_backward_units)
from .unit import MADUnit, as_unit


def _pair(value, name: str, n: int, lo: int) -> tuple:
    vals = (value,) * n if isinstance(value, int) and not isinstance(value, bool) else value
    if (not isinstance(vals, (tuple, list)) or len(vals) != n
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in vals)):
        raise TypeError(f"{name} must be an int or a tuple of {n} ints, got {value!r}")
    if any(v < lo for v in vals):
        raise ValueError(f"{name}={value!r}: every entry must be >= {lo}")
    return tuple(vals)


def explicit_padding(padding, kernel: tuple, dilation: tuple, stride: tuple, n: int) -> tuple:
    """(before, after) per spatial dim of a conv's ``padding`` (an int, ints, "valid" or "same"), as torch pads."""
    if isinstance(padding, str):
        if padding == "valid":
            return tuple((0, 0) for _ in range(n))
        if padding == "same":
            if any(s != 1 for s in stride):
                raise ValueError(f"padding='same' needs stride 1, got stride={stride}")
            out = []
            for k, d in zip(kernel, dilation):
                total = d * (k - 1)
                out.append((total // 2, total - total // 2))  # as torch: the extra one at the end
            return tuple(out)
        raise ValueError(f"padding={padding!r} is not allowed; allowed: an int, a tuple of ints, 'valid', 'same'")
    return tuple((p, p) for p in _pair(padding, "padding", n, 0))


def _patches(x, kh: int, kw: int, stride: tuple, dilation: tuple) -> torch.Tensor:
    """The im2col view of x (N, C, H, W), no copy: (N, C, kh, kw, Ho, Wo) with element [n, c, i, j, y, z] =
    x[n, c, y*sh + i*dh, z*sw + j*dw] (``F.unfold``'s values, before its reshape to (N, C*kh*kw, Ho*Wo))."""
    N, C, H, W = x.shape
    Ho = (H - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    Wo = (W - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    sn, sc, sh, sw = x.stride()
    return x.as_strided((N, C, kh, kw, Ho, Wo),
                        (sn, sc, dilation[0] * sh, dilation[1] * sw, stride[0] * sh, stride[1] * sw), x.storage_offset())


def _patch_rows(x, kh: int, kw: int, stride: tuple, dilation: tuple):
    """``_patches(x, ...)`` as rows, (N*Ho*Wo, C*kh*kw), one per output position (the weight gradient's operand).
    A C-contiguous float32 CPU x goes through ``kernels/im2col_cpu.im2col`` (4x faster than torch's copy of the
    strided view, which moves single elements in this order), anything else through that copy; the same values
    either way."""
    p = _patches(x, kh, kw, stride, dilation)
    N, C, _, _, Ho, Wo = p.shape
    if not backend.kernel_readable(x):
        return p.permute(0, 4, 5, 1, 2, 3).reshape(N * Ho * Wo, C * kh * kw)
    from ..kernels import im2col_cpu  # noqa: PLC0415  (compiled on first use)

    out = torch.empty((N * Ho * Wo, C * kh * kw), dtype=x.dtype)
    im2col_cpu.im2col(x.detach().numpy(), out.numpy(), kh, kw, stride[0], stride[1], dilation[0], dilation[1], 0, 0,
                      Ho, Wo)
    return out


def _patch_cols(x, kh: int, kw: int, stride: tuple, dilation: tuple, side_by_side: bool):
    """``_patches(x, ...)`` as GEMM columns: (N, C*kh*kw, Ho*Wo), one matrix per sample, or with ``side_by_side``
    (C*kh*kw, N*Ho*Wo), every sample's columns next to each other. A C-contiguous float32 CPU x goes through
    ``kernels/im2col_cpu.im2col_cols`` (one copy loop per output row; as fast as torch's copy of the strided view on
    large batches, up to 2.8x faster on small ones), anything else through that copy; the same values either way."""
    p = _patches(x, kh, kw, stride, dilation)
    N, C, _, _, Ho, Wo = p.shape
    K, L = C * kh * kw, Ho * Wo
    if not backend.kernel_readable(x):
        if side_by_side:
            return p.permute(1, 2, 3, 0, 4, 5).reshape(K, N * L)
        return p.reshape(N, K, L)
    from ..kernels import im2col_cpu  # noqa: PLC0415  (compiled on first use)

    out = torch.empty((K, N * L) if side_by_side else (N, K, L), dtype=x.dtype)
    sn, sk = (L, N * L) if side_by_side else (K * L, L)
    im2col_cpu.im2col_cols(x.detach().numpy(), out.numpy(), kh, kw, stride[0], stride[1], dilation[0], dilation[1],
                           Ho, Wo, sn, sk)
    return out


def _narrow() -> int:
    """Output rows narrower than this fill a tile of gemm_fast only when the samples are laid side by side
    (wider ones run per sample, as the kernel reads them best)."""
    from ..kernels.gemm_cpu import TN

    return TN


def _conv_gemm(x, weight, stride, dilation, groups, unit, seed, dtype, bias=None, flops=None, scans=None):
    """Unpadded 2-D convolution as batched GEMMs: x (N, C, H, W), weight (O, C/groups, kh, kw) -> (N, O, Ho, Wo)
    in ``dtype``, each output element the dot over (c, i, j) of ``unit``'s datapath, counters its flat index.
    scans: (weight's, x's) ``backend.scan``s or None (``backend.gemm``)."""
    N = x.shape[0]
    O, Cg, kh, kw = weight.shape
    G = groups
    Og = O // G
    Ho = (x.shape[2] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    Wo = (x.shape[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    L, K = Ho * Wo, Cg * kh * kw
    Am = weight.reshape(G, Og, K)
    if L < _narrow() and backend.fast_layout(unit, x.device):
        # one GEMM per group over every sample's narrow rows (the layout gemm_cpu would build from the
        # per-sample GEMMs by transposing copies), written straight into that layout by one copy; group g's
        # rows (c, i, j) with c in g's channels follow each other, so the (C*kh*kw, N*L) columns are (G, K, N*L)
        Bm = _patch_cols(x, kh, kw, stride, dilation, True).view(G, K, N * L)
        b = None if bias is None else bias.reshape(G, Og, 1)
        out = backend.gemm(Am, Bm, unit, seed, bias=b, flops=flops, scans=scans)
        out = out.view(G, Og, N, Ho, Wo).permute(2, 0, 1, 3, 4)
        return backend.contiguous(out, dtype).view(N, O, Ho, Wo)
    out = backend.conv_gemm(x, Am, unit, (kh, kw, stride[0], stride[1], dilation[0], dilation[1], Ho, Wo), bias, flops,
                            scans)
    if out is not None:
        return out.view(N, O, Ho, Wo).to(dtype)
    b = None
    if bias is not None:
        b = bias.reshape(1, G, Og, 1).expand(N, G, Og, L).reshape(N * G, Og, L)
    Bm = _patch_cols(x, kh, kw, stride, dilation, False).view(N * G, K, L)
    out = backend.gemm(Am, Bm, unit, seed, bias=b, nb=N * G, flops=flops, scans=scans)
    return out.reshape(N, O, Ho, Wo).to(dtype)


class _Conv2dFn(torch.autograd.Function):
    """Convolution of an input padded by ``pads`` ((top, bottom), (left, right)), or None: already padded. With
    pads, backward gives the gradient of the unpadded input, computed over its positions only (``_crops``)."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, dilation, groups, unit, units_bwd, seed, dtype, pads=None):
        if pads is not None:
            x = F.pad(x, (pads[1][0], pads[1][1], pads[0][0], pads[0][1]))
        # each tensor scanned once for the fast kernel's planner, forward and backward (x and weight are saved
        # tensors: autograd refuses a backward after either changed in place)
        sw, sx = backend.scan(weight, unit), backend.scan(x, unit)
        out = _conv_gemm(x, weight, stride, dilation, groups, unit, seed, dtype, bias, scans=(sw, sx))
        ctx.save_for_backward(x, weight)
        ctx.scans = (sw, sx)
        ctx.pads = pads
        ctx.conf = (stride, dilation, groups, units_bwd, seed, bias is not None,
                    None if bias is None else bias.dtype)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        stride, dilation, G, (u_in, u_w), seed, has_bias, bias_dtype = ctx.conf
        N, C, H, W = x.shape
        O, Cg, kh, kw = weight.shape
        Og = O // G
        _, _, Ho, Wo = grad.shape
        L = Ho * Wo
        grad_x = grad_w = grad_b = None
        if any(ctx.needs_input_grad[:3]):
            backend.check_operand(grad, "grad_output")
        sw, sx = ctx.scans
        sx, sw, sg = backend.backward_scans(sx, sw, x, weight, grad, u_in, u_w, ctx.needs_input_grad)
        if ctx.needs_input_grad[0]:
            # zero-upsample by stride, pad by dilation*(k-1) before and up to the input size after (the rows
            # and columns the forward dropped), flip the kernel; one buffer of zeros, grad copied into it
            ph, pw = dilation[0] * (kh - 1), dilation[1] * (kw - 1)
            # with pads, only the unpadded input's positions: the buffer's rows from the first one they read
            (top, bottom), (left, right) = ctx.pads or ((0, 0), (0, 0))
            up = grad.new_zeros((N, O, H - top - bottom + ph, W - left - right + pw))
            y0, x0 = ph - top, pw - left
            up[:, :, y0:y0 + (Ho - 1) * stride[0] + 1:stride[0], x0:x0 + (Wo - 1) * stride[1] + 1:stride[1]] = grad
            wf = weight.reshape(G, Og, Cg, kh, kw).transpose(1, 2).flip(-1, -2).reshape(G * Cg, Og, kh, kw)
            # counted as torch counts an input gradient (the forward's FLOPs), not over the padding and zeros
            grad_x = _conv_gemm(up, wf, (1, 1), dilation, G, u_in, _bwd_seed(u_in, seed, ROLE_GRAD_INPUT), x.dtype,
                                flops=2 * grad.numel() * Cg * kh * kw, scans=(sw, sg))
        if ctx.needs_input_grad[1]:
            gw = None
            if G == 1:  # without laying out either operand, where the fast kernel's exact-product path runs
                gw = backend.conv_wgrad(grad, x, u_w, (kh, kw), stride, dilation, scans=(sg, sx))
            if gw is None:
                Am = grad.reshape(N, G, Og, L).permute(1, 2, 0, 3).reshape(G, Og, N * L)
                if G == 1:
                    Bm = _patch_rows(x, kh, kw, stride, dilation).view(1, N * L, Cg * kh * kw)
                else:
                    p = _patches(x, kh, kw, stride, dilation).reshape(N, G, Cg, kh, kw, Ho, Wo)
                    Bm = p.permute(1, 0, 5, 6, 2, 3, 4).reshape(G, N * L, Cg * kh * kw)
                gw = backend.gemm(Am, Bm, u_w, _bwd_seed(u_w, seed, ROLE_GRAD_WEIGHT), scans=(sg, sx))
            grad_w = gw.reshape(O, Cg, kh, kw).to(weight.dtype)
        if has_bias and ctx.needs_input_grad[2]:
            ones = torch.ones((1, N * L, 1), dtype=torch.float32, device=grad.device)
            if backend.fast_layout(u_w, grad.device):  # ones^T @ grad's rows: the layout gemm_fast takes
                rows = backend.contiguous(grad.permute(0, 2, 3, 1)).view(1, N * L, O)
                gb = backend.gemm(ones.reshape(1, 1, N * L), rows, u_w, _bwd_seed(u_w, seed, ROLE_GRAD_BIAS),
                                  flops=0, scans=(None, sg))  # torch: a sum, not a GEMM
            else:
                Am = grad.permute(1, 0, 2, 3).reshape(1, O, N * L)
                gb = backend.gemm(Am, ones, u_w, _bwd_seed(u_w, seed, ROLE_GRAD_BIAS), flops=0,
                                  scans=(sg, None))  # torch: a sum
            grad_b = gb.reshape(O).to(bias_dtype)
        return grad_x, grad_w, grad_b, None, None, None, None, None, None, None, None


def _crops(pads: tuple, kernel: tuple, dilation: tuple, unit: MADUnit, device) -> bool:
    """Whether ``_Conv2dFn`` takes the padding (``pads``) itself, so that the input gradient is computed over the
    unpadded input's positions only (torch's pad would crop a gradient computed over the padding too): where
    ``unit`` runs on the fast kernel, which computes each output element alone (``backend.fast_layout``: the
    same bits for every element either way) and every pad is at most dilation * (kernel - 1) (then every
    element of the output gradient lies in the rows and columns those positions read)."""
    return (any(p for pair in pads for p in pair) and backend.fast_layout(unit, device)
            and all(p <= d * (k - 1) for pair, k, d in zip(pads, kernel, dilation) for p in pair))


def _check(input, weight, bias, groups, nd: int):
    backend.check_operand(input, "input")
    backend.check_operand(weight, "weight")
    if bias is not None:
        backend.check_tensor(bias, "bias")
    backend.check_same_device(input=input, weight=weight, bias=bias)
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"groups must be a positive int, got {groups!r}")
    if input.dim() != nd + 2:
        dims = "L" if nd == 1 else "H, W"
        raise ValueError(f"input must be {nd + 2}-D (N, C, {dims}), got shape {tuple(input.shape)}")
    if weight.dim() != nd + 2:
        raise ValueError(f"weight must be {nd + 2}-D, got shape {tuple(weight.shape)}")
    O, C = weight.shape[0], input.shape[1]
    if O % groups or C % groups or weight.shape[1] != C // groups:
        raise ValueError(f"groups={groups}: in_channels={C} and out_channels={O} must divide by groups and "
                         f"weight.shape[1]={weight.shape[1]} must be in_channels/groups")
    if bias is not None and bias.shape != (O,):
        raise ValueError(f"bias must have shape ({O},), got {tuple(bias.shape)}")


@graph_break
def conv2d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride=1, padding=0,
           dilation=1, groups: int = 1, *, unit: MADUnit = None, backward_units=None,
           seed: int | None = None) -> torch.Tensor:
    """``torch.nn.functional.conv2d`` on a MAD unit (zero padding; datapath in this module's docstring).

    Operands (input, weight): float32-representable values, used as given; bias: any values, added last
    with one rounding. Stochastic counters: the output's flat C-order index (backward: that of each
    gradient's GEMM output). ``backward_units`` as in ``emunum.linear``.
    """
    if unit is None:
        raise TypeError("conv2d() needs unit=MADUnit(...)")
    unit = as_unit(unit)
    units_bwd = parse_backward_units(unit, backward_units)
    _check(input, weight, bias, groups, 2)
    stride = _pair(stride, "stride", 2, 1)
    dilation = _pair(dilation, "dilation", 2, 1)
    kernel = tuple(weight.shape[2:])
    pads = explicit_padding(padding, kernel, dilation, stride, 2)
    for d in range(2):
        if input.shape[2 + d] + sum(pads[d]) < dilation[d] * (kernel[d] - 1) + 1:
            shape = tuple(input.shape[:2]) + tuple(input.shape[2 + i] + sum(pads[i]) for i in range(2))
            raise ValueError(f"the (padded) input {shape} is smaller than the dilated kernel")
    seed = _resolve_seed((unit, *units_bwd), seed)
    dtype = backend.output_dtype(unit, input, weight, bias)
    if _crops(pads, kernel, dilation, units_bwd[0], input.device):
        return _Conv2dFn.apply(input, weight, bias, stride, dilation, groups, unit, units_bwd, seed, dtype, pads)
    if any(p for pair in pads for p in pair):
        input = F.pad(input, (pads[1][0], pads[1][1], pads[0][0], pads[0][1]))
    return _Conv2dFn.apply(input, weight, bias, stride, dilation, groups, unit, units_bwd, seed, dtype)


@graph_break
def conv1d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride=1, padding=0,
           dilation=1, groups: int = 1, *, unit: MADUnit = None, backward_units=None,
           seed: int | None = None) -> torch.Tensor:
    """``torch.nn.functional.conv1d`` on a MAD unit: ``conv2d`` on (N, C, 1, L) with a (1, k) kernel, so the
    dot runs over (c, j) in C order and the stochastic counters are the output's flat C-order index."""
    if unit is None:
        raise TypeError("conv1d() needs unit=MADUnit(...)")
    _check(input, weight, bias, groups, 1)
    stride = _pair(stride, "stride", 1, 1)[0]
    dilation = _pair(dilation, "dilation", 1, 1)[0]
    if isinstance(padding, str):
        pad2 = padding
    else:
        pad2 = (0, _pair(padding, "padding", 1, 0)[0])
    out = conv2d(input.unsqueeze(2), weight.unsqueeze(2), bias, (1, stride), pad2, (1, dilation), groups,
                 unit=unit, backward_units=backward_units, seed=seed)
    return out.squeeze(2)
