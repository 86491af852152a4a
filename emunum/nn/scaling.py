"""Per-tensor power-of-two scaling of a role: the scale, and the straight-through quantisers that apply it."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ..autograd import Quantizer
from ..formats import get_format
from ..ops import format_to_args
from ..quantize import check_sr_bits

# the normal powers of two of each dtype: the scale and its reciprocal are exact there
_SCALE_EXPONENTS = {torch.float32: (-126, 127), torch.bfloat16: (-126, 127), torch.float16: (-14, 15),
                    torch.float64: (-1022, 1023)}


def per_tensor_scale(x: Tensor, fmt) -> Tensor:
    """The per-tensor scale of x for ``fmt``: a 0-dim tensor of x's dtype and device holding the power of two
    ``s = 2**floor(log2(fmt.max / amax))``, ``amax = max |x|`` (so ``amax * s`` lies in
    ``(fmt.max / 2, fmt.max]``), clamped to x's dtype's normal powers of two; ``s = 1`` when x is empty or
    amax is 0 or not finite. Computed exactly (frexp and integer compares; no division, no ``.item()``)."""
    fmt = get_format(fmt)
    return _pow2_scale(x, float(fmt.max))


def _pow2_scale(x: Tensor, max_value: float) -> Tensor:
    if x.dtype not in _SCALE_EXPONENTS:
        raise TypeError(f"per-tensor scaling: x.dtype={x.dtype} is not supported; allowed: "
                        f"{', '.join(str(d) for d in _SCALE_EXPONENTS)}")
    if x.numel() == 0:
        return torch.ones((), dtype=x.dtype, device=x.device)
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    amax = x.detach().abs().amax().to(wide)  # exact widening; NaN propagates
    mm, em = math.frexp(max_value)  # max = mm * 2**em, mm in [0.5, 1)
    ma, ea = torch.frexp(amax)  # amax = ma * 2**ea
    # max / amax = (mm / ma) * 2**(em - ea) with mm / ma in (1/2, 2): floor(log2) is em - ea, less 1 if ma > mm
    e = (em - ea.to(torch.int64)) - (ma > mm).to(torch.int64)
    lo, hi = _SCALE_EXPONENTS[x.dtype]
    ok = (amax > 0) & (amax < math.inf)  # False for 0, inf and NaN: then e = 0, s = 1
    e = e.clamp(lo, hi) * ok  # (cheaper than isfinite/where on 0-dim CPU tensors)
    if wide == torch.float64:
        s = ((e + 1023) << 52).view(torch.float64)  # the bits of 2**e
    else:
        s = ((e + 127).to(torch.int32) << 23).view(torch.float32)
    return s.to(x.dtype)


class _MulStraightThrough(torch.autograd.Function):
    """``x * s`` for a power of two s, with the gradient passed unchanged (the scaling is part of the
    straight-through rounding, whose derivative is taken to be 1)."""

    @staticmethod
    def forward(ctx, x, s):
        return x * s

    @staticmethod
    def backward(ctx, g):
        return g, None


class ScaledQuantizer:
    """A forward-role quantiser with per-tensor scaling: ``x -> q(x * s) / s``, ``s = per_tensor_scale(x)``,
    where q is the role's ``Quantizer``; the gradient passes straight through the scaling into q's."""

    def __init__(self, quantizer: Quantizer, fmt):
        self.quantizer, self.max_value = quantizer, float(get_format(fmt).max)

    def __call__(self, x: Tensor) -> Tensor:
        s = _pow2_scale(x, self.max_value)
        y = self.quantizer(_MulStraightThrough.apply(x, s))
        return _MulStraightThrough.apply(y, torch.reciprocal(s))


class _ScaledGradRound(torch.autograd.Function):
    """Forward: a copy of x (a fresh tensor, as the unscaled gradient quantiser returns: a view returned from
    a Function could not be modified in place, as in ``out += identity`` or ``ReLU(inplace=True)``).
    Backward: the gradient g rounded as ``quantize(g * s) / s``, ``s = per_tensor_scale(g)``, through the
    ``emunum::quantize`` op with a fresh seed."""

    @staticmethod
    def forward(ctx, x, max_value, fmt_args, mode, sr_bits):
        ctx.max_value, ctx.fmt_args, ctx.mode, ctx.sr_bits = max_value, fmt_args, mode, sr_bits
        return x.clone(memory_format=torch.contiguous_format)

    @staticmethod
    def backward(ctx, g):
        s = _pow2_scale(g, ctx.max_value)
        gq = torch.ops.emunum.quantize(g * s, ctx.fmt_args, ctx.mode, None, ctx.sr_bits)
        return gq * torch.reciprocal(s), None, None, None, None


class ScaledGradQuantizer:
    """A gradient-role quantiser with per-tensor scaling of the gradient (see ``_ScaledGradRound``)."""

    def __init__(self, fmt, rounding, sr_bits):
        fmt = get_format(fmt)
        self.args = (float(fmt.max), format_to_args(fmt), int(rounding), check_sr_bits(sr_bits))

    def __call__(self, x: Tensor) -> Tensor:
        return _ScaledGradRound.apply(x, *self.args)
