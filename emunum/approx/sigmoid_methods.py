"""Sigmoid approximations: PLAN (Amin, Curtis and Hayes-Gill 1997), hard sigmoid, and 1 / (1 + 2**(-x log2 e))
with an approximate exp2. The piecewise-linear and lookup-table methods live in ``piecewise.py``."""
from __future__ import annotations

import math

import torch

from .base import REGISTRY, Method, Param, register
from .piecewise import mirror, split_sign

LOG2E = 1.0 / math.log(2.0)


@register
class SigmoidPLAN(Method):
    """PLAN: on a = |x|, y = 1 (a >= 5), 0.03125 a + 0.84375 (2.375 <= a < 5), 0.125 a + 0.625 (1 <= a < 2.375),
    0.25 a + 0.5 (a < 1); 1 - y for x < 0. Slopes are powers of two (shifts in hardware): per input three
    compares, one shift and one add."""

    FUNCTION = "sigmoid"
    NAME = "plan"
    PARAMS = {}
    MAX_ERROR = {"fp32": 0.019, "bf16": 0.021}
    SEGMENTS = ((5.0, 0.0, 1.0), (2.375, 0.03125, 0.84375), (1.0, 0.125, 0.625), (0.0, 0.25, 0.5))

    def setup(self):
        self.segs = [(self.rom(lo), self.rom(m), self.rom(c)) for lo, m, c in self.SEGMENTS]
        self.one = self.rom(1.0)

    def evaluate(self, x, dp):
        neg, a = split_sign(x)
        y = dp.add(dp.mul(a, self.segs[-1][1]), self.segs[-1][2])
        for lo, m, c in reversed(self.segs[:-1]):
            seg = torch.full_like(a, c) if m == 0.0 else dp.add(dp.mul(a, m), c)
            y = torch.where(a >= lo, seg, y)
        return mirror("sigmoid", y, neg, self.one, dp)


@register
class SigmoidHard(Method):
    """Hard sigmoid (torch.nn.Hardsigmoid): clamp(x * slope + 1/2, 0, 1), slope 1/6: one multiply, one add,
    two compare/selects."""

    FUNCTION = "sigmoid"
    NAME = "hard"
    PARAMS = {"slope": Param(1 / 6, "float", 0.0)}
    MAX_ERROR = {"fp32": 0.07, "bf16": 0.071}

    def setup(self, slope):
        self.slope, self.half, self.one = self.rom(slope, "slope"), self.rom(0.5), self.rom(1.0)

    def evaluate(self, x, dp):
        return dp.add(dp.mul(x, self.slope), self.half).clamp(0.0, self.one)


@register
class SigmoidExp2(Method):
    """1 / (1 + 2**(-x * log2 e)) with the approximate exp2 ``exp2`` (its default parameters): one multiply,
    the exp2 datapath, one add, one divide."""

    FUNCTION = "sigmoid"
    NAME = "exp2"
    PARAMS = {"exp2": Param("poly", ("poly", "lut"))}
    MAX_ERROR = {"fp32": 2.7e-05, "bf16": 0.0053}

    def setup(self, exp2):
        self.exp2 = REGISTRY["exp2"][exp2](self.fmt)
        self.mlog2e, self.one = self.rom(-LOG2E), self.rom(1.0)

    @property
    def piecewise_constant(self) -> bool:
        return self.exp2.piecewise_constant

    def evaluate(self, x, dp):
        e = self.exp2.evaluate(dp.mul(x, self.mlog2e), dp)
        return dp.div(self.one, dp.add(e, self.one))
