"""An emulated hardware datapath: values live in one format, and every primitive's result is rounded to it.

Values travel as float64 tensors holding values of ``fmt``. Each arithmetic primitive (``add``, ``sub``,
``mul``, ``div``, ``ldexp``) is computed in float64 and rounded once to ``fmt`` with the datapath's rounding
mode, through the custom op ``emunum::quantize`` (straight-through gradient, so autograd differentiates the
approximation itself). Float-format operands (at most 24 significant bits) multiply exactly in float64, and
for +, -, *, / under nearest rounding the float64 step does not change the correctly rounded result
(53 >= 2p + 2); fixed-point operands likewise when their codes have at most 26 bits.
Compare/select, min/max, floor and negation of format values are exact and are not rounded again.

Constants and table entries are design-time ROM contents: rounded once, to nearest, at construction
(``DesignRounder``), whatever the run-time rounding mode. Address decoding (which segment or table entry
an input selects) is exact logic on the input's value, done in float64.

With stochastic rounding, the k-th rounding of a call uses seed ``derive_seed(seed, k)`` (seed None: fresh).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..formats import FloatFormat, PositFormat, RoundMode, get_format
from ..ops import derive_seed, format_to_args
from ..quantize import check_seed, check_sr_bits
from ..reference import round_fixed_reference, round_float_reference


class DesignRounder:
    """Rounds a method's constants to ``fmt`` (nearest) and checks each lies within the format's range."""

    def __init__(self, fmt, owner: str):
        self.fmt = get_format(fmt)
        self.owner = owner

    def __call__(self, values, what: str = "constant"):
        v = np.asarray(values, dtype=np.float64)
        bad = np.abs(v) > self.fmt.max
        if np.any(bad):
            first = float(v[bad].reshape(-1)[0])
            raise ValueError(
                f"fmt={self.fmt.name} cannot hold the {what} {first:.6g} of {self.owner} (format max "
                f"{self.fmt.max:.6g}); allowed: a format whose range covers it"
            )
        if isinstance(self.fmt, FloatFormat):
            r = round_float_reference(v, self.fmt, RoundMode.NEAREST)
        elif isinstance(self.fmt, PositFormat):
            r = self.fmt.decode(self.fmt.encode(v))
        else:
            r = round_fixed_reference(v, self.fmt, RoundMode.NEAREST)
        return float(r) if r.ndim == 0 else tuple(float(t) for t in r.reshape(-1))


class Datapath:
    """One evaluation's arithmetic in ``fmt`` (see module doc). Create one per call."""

    def __init__(self, fmt, rounding="nearest", seed=None, sr_bits=None):
        self.fmt = get_format(fmt)
        self.args = format_to_args(self.fmt)
        self.mode = int(RoundMode.parse(rounding))
        self.stochastic = self.mode == RoundMode.STOCHASTIC
        self.seed = check_seed(seed)
        self.sr_bits = check_sr_bits(sr_bits)
        self.count = 0

    def round(self, t: Tensor) -> Tensor:
        """Round one primitive's result to the format."""
        seed = None
        if self.stochastic:
            seed = derive_seed(self.seed, self.count)
            self.count += 1
        return torch.ops.emunum.quantize(t, self.args, self.mode, seed, self.sr_bits)

    def input(self, x: Tensor) -> Tensor:
        """The input register: x in float64, rounded to the format."""
        return self.round(x.to(torch.float64))

    def add(self, a, b):
        return self.round(a + b)

    def sub(self, a, b):
        return self.round(a - b)

    def mul(self, a, b):
        return self.round(a * b)

    def div(self, a, b):
        return self.round(a / b)

    def ldexp(self, a: Tensor, e: Tensor) -> Tensor:
        """a * 2**e for integer-valued e (an exponent shift), rounded (matters only on under/overflow)."""
        return self.round(a * torch.exp2(e))

    def horner(self, coeffs, u: Tensor) -> Tensor:
        """sum coeffs[k] * u**k by Horner's rule, rounding after every multiply and add."""
        acc = torch.full_like(u, coeffs[-1])
        for c in reversed(coeffs[:-1]):
            acc = self.add(self.mul(acc, u), c)
        return acc

    def tree_sum(self, a: Tensor, dim: int) -> Tensor:
        """Sum along ``dim`` (kept, size 1) by a pairwise adder tree, rounding after every level."""
        a = a.movedim(dim, -1)
        n = a.shape[-1]
        width = 1 << max(n - 1, 0).bit_length()
        if width > n:
            a = torch.nn.functional.pad(a, (0, width - n))
        while a.shape[-1] > 1:
            a = self.add(a[..., 0::2], a[..., 1::2])
        return a.movedim(-1, dim)


def table(values, like: Tensor) -> Tensor:
    """A ROM table as a float64 tensor on ``like``'s device."""
    return torch.tensor(values, dtype=torch.float64, device=like.device)
