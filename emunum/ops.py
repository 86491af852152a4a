"""torch custom ops (``torch.library.custom_op``) that carry emunum's rounding into autograd and torch.compile.

Formats reach the ops as a plain ``int[]`` (``format_to_args`` / ``format_from_args``), rounding modes as
their ``RoundMode`` code, and seeds as ``int?``. Every op has a fake (meta) implementation and an autograd
formula, so ``torch.compile(fullgraph=True)`` traces through it and ``torch.library.opcheck`` passes.

- ``emunum::quantize(x, fmt, mode, seed, sr_bits)``: ``emunum.quantize``; gradient straight through
  (identity).
- ``emunum::quantize_ste(x, fwd, fwd_mode, bwd, bwd_mode, clipped, seed, sr_bits)``: rounds x to ``fwd``
  (``[]``: not at all); its backward rounds the incoming gradient to ``bwd`` (``[]``: not at all), after
  zeroing it where |x| was beyond the forward format's range if ``clipped``.
- ``emunum::exact_grad(value, x, fn, dim)``: returns ``value``; its backward is the exact derivative of
  ``fn`` ("tanh", "sigmoid", "exp2", "softmax" along ``dim``) at x; approximate operators use it for
  ``grad="exact"``.

Eager fast path: dispatching a custom op from Python costs ~25-100 us, so where the dispatch provably only
routes to the Python implementation (``eager_ok``: a plain CPU/CUDA tensor, no compile/export tracing, no
torch-function or dispatch mode, no functorch transform, no autocast, no forward-mode AD), ``Quantizer`` /
``quantize_ste`` run the same implementation and gradient formula directly (``autograd._EagerSTE``), and
``quantize_args`` calls ``quantize`` for ``emunum::quantize``. Values, gradients and seed draws are the same.

Seeds: ``seed=None`` draws a fresh seed from torch's default CPU generator each time the op runs (eager or
compiled alike, so ``torch.manual_seed`` makes runs repeatable); an int seed gives the same bits every time.
The backward of ``quantize_ste`` rounds with ``derive_seed(seed, 1)`` (or a fresh seed if seed is None).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Optional

import torch
import torch.autograd.forward_ad as _fwd_ad
from torch import Tensor

from .formats import FixedFormat, FloatFormat, Format, PositFormat, RoundMode, Special
from .formats.interned import lookup
from .quantize import format_to_args, quantize, quantize_checked  # noqa: F401  (format_to_args: re-exported)
from .rng import mix64_int

SEED_BITS = 62
_SEED_MASK = (1 << SEED_BITS) - 1
_GOLDEN = 0x9E3779B97F4A7C15


# ---- plain-value encodings ---------------------------------------------------------------------------
def format_from_args(args) -> Format | None:
    """Inverse of ``format_to_args``: ``format_from_args(format_to_args(f)) == f``; ``[]`` gives None."""
    return _format_from_args(tuple(int(a) for a in args))


@lru_cache(maxsize=1024)
def _format_from_args(args: tuple) -> Format | None:
    if not args:
        return None
    if args[0] == 0 and len(args) == 7:
        _, exp, man, bias, sub, special, sat = args
        return FloatFormat(exp, man, bias=bias, subnormals=bool(sub), special=Special(special), saturate=bool(sat))
    if args[0] == 1 and len(args) == 5:
        _, bits, frac, signed, sat = args
        return FixedFormat(bits, frac, signed=bool(signed), saturate=bool(sat))
    if args[0] == 2 and len(args) == 3:
        try:
            return PositFormat(args[1], args[2])
        except ValueError as e:
            raise ValueError(f"format args {args!r} are not an encoded format: {e}") from None
    if args[0] == 3 and len(args) == 2:
        return lookup(args[1])
    raise ValueError(f"format args {args!r} are not an encoded format; expected [0, exp, man, bias, subnormals, "
                     "special, saturate], [1, bits, frac_bits, signed, saturate], [2, nbits, es] or [3, interned id]")


def derive_seed(seed: Optional[int], stream: int) -> Optional[int]:
    """The seed of sub-stream ``stream`` of ``seed``: ``mix64(seed + (stream+1) * golden) mod 2**62``.

    Used for the backward pass (stream 1) and for the k-th rounding inside an emulated datapath.
    None stays None (fresh randomness)."""
    if seed is None:
        return None
    return mix64_int(seed + (stream + 1) * _GOLDEN) & _SEED_MASK


def _mode(mode: int) -> RoundMode:
    return RoundMode(int(mode))


# ---- eager fast path ---------------------------------------------------------------------------------
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_C = torch._C


def eager_ok(x: Tensor) -> bool:
    """Whether calling an op's Python implementation directly is the same as dispatching the op.

    True for a plain CPU/CUDA tensor (not a subclass: no FakeTensor, functorch wrapper or DTensor) outside
    torch.compile / export tracing, with no torch-function or dispatch mode, no functorch transform, no
    autocast and no forward-mode AD level active. There the op's dispatch (~30-100 us in eager) only routes
    to that implementation, so skipping it cannot change a value, a seed draw or a gradient. Anywhere
    else the op is dispatched as usual (``torch.compiler.is_compiling()`` is tested first, so dynamo folds
    the test to False while tracing)."""
    return (not _is_compiling()
            and type(x) in _PLAIN_TENSORS
            and not _len_function_stack()
            and not _len_dispatch_stack()
            and not _functorch_active()
            and not _autocast_enabled()
            and _fwd_ad._current_level < 0
            and (x.is_cpu or x.is_cuda))


def has_values(x: Tensor) -> bool:
    """Whether x's values can steer Python (a data-dependent branch): a plain CPU/CUDA tensor outside
    torch.compile / export tracing and functorch transforms (a FakeTensor or a batched wrapper has none)."""
    return not _is_compiling() and type(x) in _PLAIN_TENSORS and not _functorch_active() and (x.is_cpu or x.is_cuda)


# bound once: each costs a module attribute lookup per call otherwise, and eager_ok runs on every rounding
_is_compiling = torch.compiler.is_compiling
_len_function_stack = _C._len_torch_function_stack
_len_dispatch_stack = _C._len_torch_dispatch_stack
_functorch_active = _C._are_functorch_transforms_active
_autocast_enabled = _C._is_any_autocast_enabled


def quantize_args(x: Tensor, fmt: Format, fmt_args, mode: int, seed: Optional[int], sr_bits: int) -> Tensor:
    """``torch.ops.emunum.quantize(x, fmt_args, mode, seed, sr_bits)``, where ``fmt`` is
    ``format_from_args(fmt_args)``; its implementation is called directly where that gives the same result
    (``eager_ok`` and no autograd graph to record), else the op is dispatched."""
    if eager_ok(x) and not (x.requires_grad and torch.is_grad_enabled()):
        return quantize_checked(x, fmt, RoundMode(mode), seed, sr_bits)
    return torch.ops.emunum.quantize(x, fmt_args, mode, seed, sr_bits)


# ---- emunum::quantize ----------------------------------------------------------------------------------
@torch.library.custom_op("emunum::quantize", mutates_args=())
def quantize_op(x: Tensor, fmt: list[int], mode: int, seed: Optional[int], sr_bits: int) -> Tensor:
    """Round x to ``format_from_args(fmt)`` with rounding mode code ``mode`` (a fresh, contiguous tensor)."""
    return quantize(x, format_from_args(fmt), _mode(mode), seed=seed, sr_bits=sr_bits)


@quantize_op.register_fake
def _(x, fmt, mode, seed, sr_bits):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _quantize_backward(ctx, grad):
    return grad, None, None, None, None


quantize_op.register_autograd(_quantize_backward)


# ---- emunum::quantize_ste ------------------------------------------------------------------------------
@torch.library.custom_op("emunum::quantize_ste", mutates_args=())
def quantize_ste_op(x: Tensor, fwd: list[int], fwd_mode: int, bwd: list[int], bwd_mode: int, clipped: bool,
                    seed: Optional[int], sr_bits: int) -> Tensor:
    """Forward rounding to ``fwd`` (``[]``: a copy of x); the backward rounds the gradient to ``bwd``."""
    fmt = format_from_args(fwd)
    if fmt is None:
        return x.clone(memory_format=torch.contiguous_format)
    return quantize(x, fmt, _mode(fwd_mode), seed=seed, sr_bits=sr_bits)


@quantize_ste_op.register_fake
def _(x, fwd, fwd_mode, bwd, bwd_mode, clipped, seed, sr_bits):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def in_range_mask(x: Tensor, fmt: Format) -> Tensor:
    """True where x lies within fmt's range (|x| <= max for floats and posits, min <= x <= max for fixed point),
    or is NaN.

    Compared in float64, so that the format's limits are exact."""
    xd = x.to(torch.float64)
    if isinstance(fmt, (FloatFormat, PositFormat)):
        return ~(xd.abs() > fmt.max)
    return ~((xd > fmt.max) | (xd < fmt.min))


def _ste_setup(ctx, inputs, output):
    x, fwd, fwd_mode, bwd, bwd_mode, clipped, seed, sr_bits = inputs
    ctx.fwd, ctx.bwd, ctx.bwd_mode, ctx.clipped, ctx.sr_bits = fwd, bwd, bwd_mode, clipped, sr_bits
    ctx.bwd_seed = derive_seed(seed, 1)
    ctx.save_for_backward(x if clipped else None)


def ste_gradient(grad: Tensor, x: Optional[Tensor], fwd: Format | None, bwd: Format | None, bwd_args,
                 bwd_mode: int, bwd_seed: Optional[int], sr_bits: int) -> Tensor:
    """The gradient ``quantize_ste`` passes to x: ``grad`` masked to fwd's range where ``x`` is given (the
    clipped estimator), then rounded to ``bwd`` (``bwd_args`` its ``format_to_args``) unless None."""
    g = grad
    if x is not None:
        g = torch.where(in_range_mask(x, fwd), g, torch.zeros_like(g))
    if bwd is not None:
        g = quantize_args(g, bwd, bwd_args, bwd_mode, bwd_seed, sr_bits)
    return g


def _ste_backward(ctx, grad):
    x = ctx.saved_tensors[0] if ctx.clipped else None
    g = ste_gradient(grad, x, format_from_args(ctx.fwd), format_from_args(ctx.bwd), ctx.bwd, ctx.bwd_mode,
                     ctx.bwd_seed, ctx.sr_bits)
    return g, None, None, None, None, None, None, None


quantize_ste_op.register_autograd(_ste_backward, setup_context=_ste_setup)


# ---- emunum::exact_grad --------------------------------------------------------------------------------
EXACT_GRAD_FUNCTIONS = ("tanh", "sigmoid", "exp2", "softmax")


@torch.library.custom_op("emunum::exact_grad", mutates_args=())
def exact_grad_op(value: Tensor, x: Tensor, fn: str, dim: int) -> Tensor:
    """Returns a copy of ``value``; the gradient w.r.t. x is that of the exact ``fn`` at x (value gets none)."""
    if fn not in EXACT_GRAD_FUNCTIONS:
        raise ValueError(f"fn={fn!r} is not supported; allowed: {', '.join(EXACT_GRAD_FUNCTIONS)}")
    return value.clone(memory_format=torch.contiguous_format)


@exact_grad_op.register_fake
def _(value, x, fn, dim):
    return torch.empty_like(value, memory_format=torch.contiguous_format)


def _exact_setup(ctx, inputs, output):
    value, x, fn, dim = inputs
    ctx.fn, ctx.dim = fn, dim
    ctx.save_for_backward(x)


def _exact_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    if ctx.fn == "tanh":
        t = torch.tanh(x)
        gx = grad * (1 - t * t)
    elif ctx.fn == "sigmoid":
        s = torch.sigmoid(x)
        gx = grad * (s * (1 - s))
    elif ctx.fn == "exp2":
        gx = grad * (torch.exp2(x) * 0.6931471805599453)
    else:
        s = torch.softmax(x, ctx.dim)
        gx = s * (grad - (grad * s).sum(ctx.dim, keepdim=True))
    return None, gx, None, None


exact_grad_op.register_autograd(_exact_backward, setup_context=_exact_setup)
