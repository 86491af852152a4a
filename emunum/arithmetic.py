"""Emulated arithmetic for user-defined operators: ``with emunum.arithmetic(fmt):`` / ``@emunum.emulated(fmt)``.

Inside the context every listed floating-point ATen operator runs as usual and its result is then rounded
to ``fmt`` (``emunum.quantize`` with ``rounding``): it behaves as if that primitive were computed in fmt with
one rounding. That is exact for + - * / sqrt of format values under nearest rounding for float formats with
man <= 10 on float32 tensors and every float format on float64 tensors (the intermediate has >= 2p + 2 bits),
barring results in float32's subnormal range; otherwise the tensor dtype's own rounded result is rounded
again. (torch's float32 sqrt on CPU, MKL's vector math, is 1 ulp off for about 0.6% of inputs; rounded to a
format with man = 10 it still gave the exact root on every value tried: fp16, e4m10, e3m10, e6m10, e8m10.)
Matrix products and reductions are rounded once at the end (their internal accumulation is torch's; see
``emunum.mad`` for per-operation accumulation). Tensors that enter the context (data, parameters, constants)
are used as they are; only op results are rounded.

It is a ``TorchDispatchMode``, so it sees ATen ops below autograd: composite functions (``torch.matmul``,
``F.linear``, ``torch.softmax``) reach it as the primitives they are built from, and autograd records the
rounded results. ``backward()`` called inside the context runs its ATen ops (``mul``, ``tanh_backward``,
``mm``, gradient accumulation ``add``, ...) through the same list, so gradients are rounded too; called
outside, they run in the tensors' own precision. In-place and ``out=`` variants round the written tensor.

Rounded ops (ATen overload packets, every overload, also in-place/out variants), from ``ROUNDED_OPS``:
{ops}
Everything else (views, copies, indexing, comparisons, where/masking, cat/stack, factories, integer ops) is
left alone. With stochastic rounding, the k-th rounded tensor of a context uses ``derive_seed(seed, k)``
(seed None: a fresh seed each time).
"""
from __future__ import annotations

import functools
import textwrap

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from .formats import RoundMode, get_format
from .ops import derive_seed
from .quantize import FLOAT_DTYPES, check_seed, check_sr_bits, quantize

ROUNDED_OPS: dict[str, tuple[str, ...]] = {
    "arithmetic": ("add", "sub", "rsub", "mul", "div", "neg", "abs", "reciprocal", "square", "pow", "sqrt",
                   "rsqrt", "addcmul", "addcdiv", "lerp", "fmod", "remainder", "clamp", "clamp_min",
                   "clamp_max", "minimum", "maximum"),
    "transcendental": ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "tanh",
                       "sigmoid", "erf", "erfc", "atan"),
    "activations": ("relu", "gelu", "silu", "mish", "softplus", "elu", "leaky_relu", "hardtanh", "hardsigmoid",
                    "hardswish", "_softmax", "_log_softmax", "logsumexp"),
    "reductions": ("sum", "mean", "prod", "cumsum", "var", "std", "linalg_vector_norm", "norm"),
    "linear algebra": ("mm", "bmm", "addmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "convolution"),
    "normalisation": ("native_layer_norm", "native_batch_norm", "_native_batch_norm_legit",
                      "_native_batch_norm_legit_no_training", "native_group_norm"),
    "losses": ("mse_loss", "nll_loss_forward", "nll_loss2d_forward", "binary_cross_entropy",
               "binary_cross_entropy_with_logits", "smooth_l1_loss", "huber_loss"),
    "backward": ("tanh_backward", "sigmoid_backward", "gelu_backward", "silu_backward", "mish_backward",
                 "softplus_backward", "elu_backward", "leaky_relu_backward", "hardtanh_backward",
                 "hardsigmoid_backward", "hardswish_backward", "threshold_backward", "_softmax_backward_data",
                 "_log_softmax_backward_data", "native_layer_norm_backward", "native_batch_norm_backward",
                 "native_group_norm_backward", "convolution_backward", "mse_loss_backward", "nll_loss_backward",
                 "nll_loss2d_backward", "binary_cross_entropy_backward", "smooth_l1_loss_backward",
                 "huber_loss_backward"),
}


def _op_list(width: int = 110) -> str:
    return "\n".join(textwrap.fill(f"{group}: {', '.join(names)}.", width, initial_indent="- ",
                                   subsequent_indent="  ") for group, names in ROUNDED_OPS.items())


__doc__ = __doc__.replace("{ops}", _op_list())


@functools.lru_cache(maxsize=1)
def _packets() -> frozenset:
    """The ``ROUNDED_OPS`` names (and their in-place ``name_`` forms) as ATen overload packets."""
    out = set()
    for names in ROUNDED_OPS.values():
        for name in names:
            for n in (name, name + "_"):
                try:
                    out.add(getattr(torch.ops.aten, n))
                except (AttributeError, RuntimeError):
                    pass
    return frozenset(out)


def _storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class EmulatedArithmetic(TorchDispatchMode):
    """The mode behind ``arithmetic``; use that function (or ``emulated``)."""

    def __init__(self, fmt, rounding="nearest", *, seed=None, sr_bits=None):
        super().__init__()
        self.fmt = get_format(fmt)
        self.mode = RoundMode.parse(rounding)
        self.seed = check_seed(seed)
        self.sr_bits = check_sr_bits(sr_bits)
        self.count = 0
        self.rounded_ops = _packets()

    def _seed(self):
        if self.mode != RoundMode.STOCHASTIC:
            return None
        s = derive_seed(self.seed, self.count)
        self.count += 1
        return s

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket not in self.rounded_ops:
            return out
        inputs = set()
        if not func._schema.is_mutable:
            tree_map(lambda a: inputs.add(_storage_ptr(a)) if isinstance(a, torch.Tensor) else None,
                     (args, kwargs))

        def rnd(t):
            if not isinstance(t, torch.Tensor) or t.dtype not in FLOAT_DTYPES or t.numel() == 0:
                return t
            if _storage_ptr(t) in inputs:  # a functional op handed back an input: never round that in place
                return quantize(t, self.fmt, self.mode, seed=self._seed(), sr_bits=self.sr_bits)
            return quantize(t, self.fmt, self.mode, seed=self._seed(), out=t, sr_bits=self.sr_bits)

        return tree_map(rnd, out)

    def __repr__(self) -> str:
        return f"arithmetic({self.fmt.name}, rounding={self.mode.name.lower()})"


def arithmetic(fmt, rounding="nearest", *, seed=None, sr_bits=None) -> EmulatedArithmetic:
    """A context manager in which every op of ``ROUNDED_OPS`` has its result rounded to ``fmt`` (module doc).

    ``with emunum.arithmetic("bf16"): y = a * b + c`` gives quantize(quantize(a * b) + c). fmt: a format or
    name; rounding: as in ``emunum.quantize``; seed/sr_bits: for stochastic rounding. Use a fresh context
    per ``with`` (the stochastic op counter starts at 0 in each)."""
    return EmulatedArithmetic(fmt, rounding, seed=seed, sr_bits=sr_bits)


def emulated(fmt, rounding="nearest", *, seed=None, sr_bits=None):
    """Decorator: run the function inside ``arithmetic(fmt, rounding, seed=seed, sr_bits=sr_bits)``.

    Arguments are checked when decorating; each call gets a fresh context."""
    arithmetic(fmt, rounding, seed=seed, sr_bits=sr_bits)  # validate now

    def decorate(fn):
        if not callable(fn):
            raise TypeError(f"emulated(...) decorates a callable, got {type(fn).__name__}")

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with arithmetic(fmt, rounding, seed=seed, sr_bits=sr_bits):
                return fn(*args, **kwargs)

        return wrapper

    return decorate
