"""Piecewise-linear and lookup-table approximations, shared by tanh and sigmoid.

Both functions saturate at 1 and have a symmetry the hardware exploits: tanh(-a) = -tanh(a),
sigmoid(-a) = 1 - sigmoid(a).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .base import Method, Param, register
from .datapath import Datapath, table

TARGETS = {
    "tanh": np.tanh,
    "sigmoid": lambda a: 1.0 / (1.0 + np.exp(-a)),
}


def split_sign(x: Tensor):
    """(neg, |x|) by a compare and a select (the gradient at 0 flows through the x branch)."""
    neg = x < 0
    return neg, torch.where(neg, -x, x)


def address(t: Tensor, top: int) -> Tensor:
    """Table index floor(t) clamped to [0, top] (NaN selects 0; the caller passes NaN through)."""
    return torch.floor(torch.nan_to_num(t.detach(), nan=0.0)).clamp(0, top).long()


def keep_nan(x: Tensor, y: Tensor) -> Tensor:
    """NaN in, NaN out, for results read from tables."""
    return torch.where(torch.isnan(x), x, y)


def mirror(function: str, y: Tensor, neg: Tensor, one: float, dp: Datapath) -> Tensor:
    """Undo ``split_sign``: -y for tanh, 1 - y (rounded) for sigmoid, where x was negative."""
    if function == "tanh":
        return torch.where(neg, -y, y)
    return torch.where(neg, dp.sub(one, y), y)


class _PWL(Method):
    """Piecewise linear on |x|: ``segments`` equal segments over [0, range], each the chord of f through its
    end points; f = 1 for |x| >= range; the negative side by symmetry. Datapath: segment select, one
    multiply, one add (and 1 - y for sigmoid's negative side)."""

    NAME = "pwl"

    def setup(self, segments, range):
        f = TARGETS[self.FUNCTION]
        self.h = range / segments
        b = np.arange(segments + 1) * self.h
        fb = f(b)
        slope = np.diff(fb) / self.h
        self.slope = self.rom(slope, "slope")
        self.icpt = self.rom(fb[:-1] - slope * b[:-1], "intercept")
        self.range = self.rom(range, "range")
        self.one = self.rom(1.0)
        self.segments = segments

    def evaluate(self, x, dp):
        neg, a = split_sign(x)
        idx = address(a / self.h, self.segments - 1)
        y = keep_nan(a, dp.add(dp.mul(table(self.slope, x)[idx], a), table(self.icpt, x)[idx]))
        y = torch.where(a >= self.range, torch.full_like(y, self.one), y)
        return mirror(self.FUNCTION, y, neg, self.one, dp)


class _LUT(Method):
    """Lookup table of ``entries`` values f(x_k), x_k evenly spaced over [-range, range] (inputs beyond are
    clamped to the ends). Without ``interpolate``: the nearest entry. With it: T[i] + w * (T[i+1] - T[i]),
    where i and the weight w come from the input's position (the weight register is in the format): one
    subtract, one multiply, one add."""

    NAME = "lut"

    def setup(self, entries, range, interpolate):
        f = TARGETS[self.FUNCTION]
        if entries < 2:
            raise ValueError(f"{self.FUNCTION} method 'lut': entries={entries} is out of range; allowed: >= 2")
        self.lo = -range
        self.h = 2 * range / (entries - 1)
        self.table = self.rom(f(self.lo + np.arange(entries) * self.h), "table entry")
        self.rom(range, "range")
        self.entries, self.interpolate = entries, interpolate

    @property
    def piecewise_constant(self) -> bool:
        return not self.interpolate

    def evaluate(self, x, dp):
        t = ((x - self.lo) / self.h).clamp(0, self.entries - 1)
        T = table(self.table, x)
        if not self.interpolate:
            return keep_nan(x, T[address(t + 0.5, self.entries - 1)])
        i = address(t, self.entries - 2)
        w = dp.round(t - i)
        lo = T[i]
        return keep_nan(x, dp.add(lo, dp.mul(w, dp.sub(T[i + 1], lo))))


@register
class TanhPWL(_PWL):
    __doc__ = _PWL.__doc__
    FUNCTION = "tanh"
    PARAMS = {"segments": Param(16, "int", 1), "range": Param(4.0, "float", 1e-3)}
    MAX_ERROR = {"fp32": 0.006, "bf16": 0.0086}


@register
class SigmoidPWL(_PWL):
    __doc__ = _PWL.__doc__
    FUNCTION = "sigmoid"
    PARAMS = {"segments": Param(16, "int", 1), "range": Param(8.0, "float", 1e-3)}
    MAX_ERROR = {"fp32": 0.003, "bf16": 0.0049}


@register
class TanhLUT(_LUT):
    __doc__ = _LUT.__doc__
    FUNCTION = "tanh"
    PARAMS = {"entries": Param(64, "int", 2), "range": Param(4.0, "float", 1e-3),
              "interpolate": Param(True, "bool")}
    MAX_ERROR = {"fp32": 0.0016, "bf16": 0.0047}


@register
class SigmoidLUT(_LUT):
    __doc__ = _LUT.__doc__
    FUNCTION = "sigmoid"
    PARAMS = {"entries": Param(64, "int", 2), "range": Param(8.0, "float", 1e-3),
              "interpolate": Param(True, "bool")}
    MAX_ERROR = {"fp32": 0.00078, "bf16": 0.004}
