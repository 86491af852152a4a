"""Straight-through quantisation with separate forward and backward formats: ``quantize_ste`` and ``Quantizer``.

Forward: y = quantize(x, forward, forward_rounding, seed). Backward: dL/dx = quantize(m * dL/dy, backward,
backward_rounding, derive_seed(seed, 1)), where m = 1 (``ste="identity"``) or, for ``ste="clipped"``,
m = 0 where x lay beyond the forward format's range (|x| > max for floats, which is exactly where the result
saturated or overflowed to inf/NaN; x outside [min, max] for fixed point, where it saturated or wrapped)
and 1 elsewhere (NaN included). A None format skips rounding in that direction. Both are the custom op
``emunum::quantize_ste``, so they trace under ``torch.compile(fullgraph=True)``; in plain eager mode
(``ops.eager_ok``) they run its implementation and gradient formula without the op's dispatch cost.
"""
from __future__ import annotations

import enum
from typing import Union

import torch
from torch import Tensor, nn

from .backends import GENERATION as _GENERATION
from .buffers import HUGE_MIN_BYTES
from .formats import FixedFormat, FloatFormat, RoundMode, format_or_none, parse_enum
from .ops import derive_seed, eager_ok, format_to_args, ste_gradient
from .quantize import (_KEY0, _NUMPY_DTYPES, _cpu_runner, check_seed, check_sr_bits, check_tensor, quantize_checked,
                       resolve_seed)
from .rng import seed_key

_FAST_FORMATS = (FloatFormat, FixedFormat)


class STE(enum.Enum):
    """Straight-through estimator of the forward rounding's gradient."""

    IDENTITY = "identity"  # pass the gradient unchanged
    CLIPPED = "clipped"  # zero it where the forward value saturated, overflowed or wrapped

    @classmethod
    def parse(cls, value: Union[str, "STE"], field: str = "ste") -> "STE":
        return parse_enum(cls, value, field, "a straight-through estimator")




class _Plan:
    """Validated, op-ready arguments of one straight-through quantiser (parsed once)."""

    __slots__ = ("forward", "backward", "forward_mode", "backward_mode", "ste", "seed", "sr_bits", "args",
                 "clipped", "backward_seed")

    def __init__(self, forward, backward, forward_rounding, backward_rounding, ste, seed, sr_bits):
        self.forward = format_or_none(forward, "forward")
        self.backward = format_or_none(backward, "backward")
        self.forward_mode = RoundMode.parse(forward_rounding, "forward_rounding")
        self.backward_mode = RoundMode.parse(backward_rounding, "backward_rounding")
        self.ste = STE.parse(ste)
        if self.ste == STE.CLIPPED and self.forward is None:
            raise ValueError("ste='clipped' needs a forward format (the range to clip to); got forward=None; "
                             "allowed: ste='identity' with forward=None")
        self.seed = check_seed(seed)
        self.sr_bits = check_sr_bits(sr_bits)
        self.clipped = self.ste == STE.CLIPPED
        self.backward_seed = derive_seed(self.seed, 1)
        self.args = (format_to_args(self.forward), int(self.forward_mode), format_to_args(self.backward),
                     int(self.backward_mode), self.clipped, self.seed, self.sr_bits)

    def __call__(self, x: Tensor) -> Tensor:
        check_tensor(x)
        if eager_ok(x):  # the op's own implementation and autograd formula, without its dispatch
            if x.requires_grad and torch.is_grad_enabled():
                return _eager_ste_apply(_unwrap_if_dead(x), self)
            return self.forward_value(x)
        return torch.ops.emunum.quantize_ste(x, *self.args)

    def forward_value(self, x: Tensor) -> Tensor:
        """What ``emunum::quantize_ste`` returns: x rounded to ``forward``, or a contiguous copy of x."""
        if self.forward is None:
            return x.clone(memory_format=torch.contiguous_format)
        y = _round_cpu(x, self.forward, self.forward_mode, self.seed, self.sr_bits)
        return y if y is not None else quantize_checked(x, self.forward, self.forward_mode, self.seed, self.sr_bits)


def _round_cpu(x: Tensor, fmt, mode: RoundMode, seed, nbits: int):
    """``quantize_checked(x, fmt, mode, seed, nbits)`` for the common case, with less Python: a contiguous CPU
    float32/float64 tensor (not a negative view, not empty, below the huge-page buffer size) and a
    Float/FixedFormat; the same kernel, seed draw and fresh result. None for anything else (the caller then
    calls ``quantize_checked``)."""
    if not x.is_cpu or x.is_neg() or not x.is_contiguous():
        return None
    dtype = x.dtype
    entry = _mode_runners.get((id(fmt), dtype, mode))
    if entry is None or entry[0] is not fmt or entry[2] != _GENERATION[0]:
        if dtype not in _ELEMENT_BYTES or not isinstance(fmt, _FAST_FORMATS):
            return None
        entry = _new_mode_runner(fmt, dtype, mode)
    n = x.numel()
    if n == 0 or n >= entry[3]:
        return None
    key = seed_key(resolve_seed(seed)) if mode is _STOCHASTIC else _KEY0
    y = torch.empty_like(x)
    entry[1](x.data_ptr(), y.data_ptr(), n, key, nbits)
    return y


_STOCHASTIC = RoundMode.STOCHASTIC
_ELEMENT_BYTES = {dt: torch.empty(0, dtype=dt).element_size() for dt in _NUMPY_DTYPES}
_runners: dict = {}  # (id(fmt), dtype) -> (fmt, runner, backends.GENERATION): no dataclass hash per rounding
# (id(fmt), dtype, mode) -> (fmt, call(src, dst, n, key, nbits), backends.GENERATION, elements below the huge size)
_mode_runners: dict = {}


def _runner(fmt, dtype):
    """``backends.cpu_runner(fmt, dtype)``, looked up by the format's identity."""
    entry = _runners.get((id(fmt), dtype))
    if entry is not None and entry[0] is fmt and entry[2] == _GENERATION[0]:
        return entry[1]
    if len(_runners) > 256:
        _runners.clear()
    run = _cpu_runner(fmt, dtype)
    _runners[(id(fmt), dtype)] = (fmt, run, _GENERATION[0])
    return run


def _mode_runner(fmt, dtype, mode: RoundMode):
    """``call(src, dst, n, key, nbits)`` = ``_runner(fmt, dtype)(src, dst, n, mode, key, nbits)``: the runner's own
    caller for one mode where it has one (``for_mode``, kernels/cpu.py), looked up by identity."""
    entry = _mode_runners.get((id(fmt), dtype, mode))
    if entry is not None and entry[0] is fmt and entry[2] == _GENERATION[0]:
        return entry[1]
    return _new_mode_runner(fmt, dtype, mode)[1]


def _new_mode_runner(fmt, dtype, mode: RoundMode) -> tuple:
    """The ``_mode_runners`` entry of (fmt, dtype, mode), made and stored."""
    if len(_mode_runners) > 256:
        _mode_runners.clear()
    run, m = _runner(fmt, dtype), int(mode)
    for_mode = getattr(run, "for_mode", None)
    call = for_mode(m) if for_mode is not None else (lambda src, dst, n, key, nbits: run(src, dst, n, m, key, nbits))
    entry = _mode_runners[(id(fmt), dtype, mode)] = (fmt, call, _GENERATION[0],
                                                      -(-HUGE_MIN_BYTES // _ELEMENT_BYTES[dtype]))
    return entry


class _EagerSTE(torch.autograd.Function):
    """``emunum::quantize_ste`` in eager mode where ``ops.eager_ok`` holds: the same forward value, the same
    backward (``ops.ste_gradient``, shared with the op's registered formula) and the same seed draws in the
    same order, at a tenth of the op's dispatch cost. torch.compile and every other tracer see the op."""

    @staticmethod
    def forward(ctx, x: Tensor, plan: _Plan) -> Tensor:
        ctx.plan = plan
        if plan.clipped:
            ctx.save_for_backward(x)
        return plan.forward_value(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        p = ctx.plan
        return eager_ste_gradient(p, grad, ctx.saved_tensors[0] if p.clipped else None), None


def eager_ste_gradient(p: _Plan, grad: Tensor, x) -> Tensor:
    """The gradient ``_EagerSTE`` passes to its input: ``grad`` (masked where the saved input x lay out of range,
    for a clipped plan; x is None otherwise) rounded to ``p.backward``."""
    if not p.clipped and p.backward is not None and not (grad.requires_grad and torch.is_grad_enabled()) \
            and eager_ok(grad):  # what ste_gradient -> quantize_args do here, less their Python
        g = _round_cpu(grad, p.backward, p.backward_mode, p.backward_seed, p.sr_bits)
        if g is not None:
            return g
    return ste_gradient(grad, x, p.forward, p.backward, p.args[2], p.backward_mode, p.backward_seed, p.sr_bits)


# ``_EagerSTE.apply`` less its Python preamble: with ``eager_ok`` (no functorch transform active) and no
# ``setup_context``, ``Function.apply`` only unwraps dead functorch wrappers (done here for the one tensor
# argument) and calls the C++ ``_FunctionBase.apply``; about 3 us less per call.
_eager_ste_apply = super(torch.autograd.Function, _EagerSTE).apply
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead


def quantize_ste(x: Tensor, forward=None, backward=None, *, forward_rounding="nearest",
                 backward_rounding="stochastic", ste="identity", seed=None, sr_bits=None) -> Tensor:
    """Round x to ``forward`` and, in the backward pass, its gradient to ``backward`` (see module doc).

    forward/backward: a format, a format name, or None (no rounding in that direction). Roundings as in
    ``emunum.quantize`` (the backward defaults to stochastic). ste: "identity" or "clipped". seed: None draws
    fresh seeds from torch's default generator on every call (forward and backward separately); an int makes
    the forward use ``seed`` and the backward ``emunum.ops.derive_seed(seed, 1)``. sr_bits: random bits per
    stochastic rounding (1..32, default 32). The result has x's dtype and shape; x is never modified.
    """
    return _Plan(forward, backward, forward_rounding, backward_rounding, ste, seed, sr_bits)(x)


class Quantizer(nn.Module):
    """``quantize_ste`` as a module: ``Quantizer(forward=fmt, backward=grad_fmt, ...)``; arguments as there.

    The arguments are parsed once, at construction. With an int ``seed`` every call uses the same bits
    (repeatable, for tests and inference); with None (the default) every call draws fresh ones.
    """

    def __init__(self, forward=None, backward=None, *, forward_rounding="nearest", backward_rounding="stochastic",
                 ste="identity", seed=None, sr_bits=None):
        super().__init__()
        self._plan = _Plan(forward, backward, forward_rounding, backward_rounding, ste, seed, sr_bits)

    @property
    def forward_format(self):
        return self._plan.forward

    @property
    def backward_format(self):
        return self._plan.backward

    def forward(self, x: Tensor) -> Tensor:
        return self._plan(x)

    def extra_repr(self) -> str:
        p = self._plan
        parts = [f"forward={p.forward.name if p.forward is not None else None}",
                 f"backward={p.backward.name if p.backward is not None else None}",
                 f"forward_rounding={p.forward_mode.name.lower()}",
                 f"backward_rounding={p.backward_mode.name.lower()}",
                 f"ste={p.ste.value}"]
        if p.seed is not None:
            parts.append(f"seed={p.seed}")
        if p.sr_bits != 32:
            parts.append(f"sr_bits={p.sr_bits}")
        return ", ".join(parts)
