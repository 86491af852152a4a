"""Straight-through quantisation with separate forward and backward formats: ``quantize_ste`` and ``Quantizer``.

Forward: y = quantize(x, forward, forward_rounding, seed). Backward: dL/dx = quantize(m * dL/dy, backward,
backward_rounding, derive_seed(seed, 1)), where m = 1 (``ste="identity"``) or, for ``ste="clipped"``,
m = 0 where x lay beyond the forward format's range (|x| > max for floats, which is exactly where the result
saturated or overflowed to inf/NaN; x outside [min, max] for fixed point, where it saturated or wrapped)
and 1 elsewhere (NaN included). A None format skips rounding in that direction. Both go through the custom
op ``emunum::quantize_ste``, so they trace under ``torch.compile(fullgraph=True)``.
"""
from __future__ import annotations

import enum
from typing import Union

import torch
from torch import Tensor, nn

from .formats import get_format
from .ops import check_seed, format_to_args
from .quantize import check_sr_bits, check_tensor
from .spec import RoundMode


class STE(enum.Enum):
    """Straight-through estimator of the forward rounding's gradient."""

    IDENTITY = "identity"  # pass the gradient unchanged
    CLIPPED = "clipped"  # zero it where the forward value saturated, overflowed or wrapped

    @classmethod
    def parse(cls, value: Union[str, "STE"], field: str = "ste") -> "STE":
        if isinstance(value, STE):
            return value
        if isinstance(value, str):
            for m in cls:
                if m.value == value.strip().lower():
                    return m
        raise ValueError(f"{field}={value!r} is not a straight-through estimator; allowed: "
                         f"{', '.join(m.value for m in cls)}")


def _fmt_or_none(fmt, field: str):
    if fmt is None:
        return None
    try:
        return get_format(fmt)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{field}: {e}") from None


class _Plan:
    """Validated, op-ready arguments of one straight-through quantiser (parsed once)."""

    __slots__ = ("forward", "backward", "forward_mode", "backward_mode", "ste", "seed", "sr_bits", "args")

    def __init__(self, forward, backward, forward_rounding, backward_rounding, ste, seed, sr_bits):
        self.forward = _fmt_or_none(forward, "forward")
        self.backward = _fmt_or_none(backward, "backward")
        self.forward_mode = RoundMode.parse(forward_rounding, "forward_rounding")
        self.backward_mode = RoundMode.parse(backward_rounding, "backward_rounding")
        self.ste = STE.parse(ste)
        if self.ste == STE.CLIPPED and self.forward is None:
            raise ValueError("ste='clipped' needs a forward format (the range to clip to); got forward=None; "
                             "allowed: ste='identity' with forward=None")
        self.seed = check_seed(seed)
        self.sr_bits = check_sr_bits(sr_bits)
        self.args = (format_to_args(self.forward), int(self.forward_mode), format_to_args(self.backward),
                     int(self.backward_mode), self.ste == STE.CLIPPED, self.seed, self.sr_bits)

    def __call__(self, x: Tensor) -> Tensor:
        check_tensor(x)
        return torch.ops.emunum.quantize_ste(x, *self.args)


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
