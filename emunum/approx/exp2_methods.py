"""Approximate 2**x as hardware computes it: the integer part of x becomes an exponent shift, the fractional
part f in [0, 1) goes through a small polynomial or a lookup table: 2**x = 2**floor(x) * 2**f.

Datapath: i = floor(x) (exact), f = x - i (rounded), p ~ 2**f, result = p * 2**i (rounded, which matters
only on under/overflow). x is first clamped to [-1100, 1100] (the shifter saturates: -inf gives 0).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .base import Method, Param, register
from .datapath import table
from .fit import remez
from .piecewise import address, keep_nan

SHIFT_LIMIT = 1100.0


class _Exp2(Method):
    FUNCTION = "exp2"

    def evaluate(self, x, dp):
        xc = x.clamp(-SHIFT_LIMIT, SHIFT_LIMIT)
        i = torch.floor(xc.detach())
        f = dp.sub(xc, i)
        return dp.ldexp(self.fraction(f, dp), i)

    def fraction(self, f, dp):
        raise NotImplementedError


@register
class Exp2Poly(_Exp2):
    """2**f by a degree-``degree`` polynomial in Horner form (one multiply and one add per degree):
    ``coeffs="minimax"`` (Remez, absolute error on [0, 1]) or ``"taylor"`` (sum (f ln2)**k / k!)."""

    NAME = "poly"
    PARAMS = {"degree": Param(3, "int", 1), "coeffs": Param("minimax", ("minimax", "taylor"))}
    MAX_ERROR = {"fp32": 0.00011, "bf16": 0.0054}

    def setup(self, degree, coeffs):
        if coeffs == "minimax":
            c, _ = remez(np.exp2, list(range(degree + 1)), 0.0, 1.0)
        else:
            c = [math.log(2) ** k / math.factorial(k) for k in range(degree + 1)]
        self.coeffs = self.rom(c, "coefficient")

    def fraction(self, f, dp):
        return dp.horner(self.coeffs, f)


@register
class Exp2LUT(_Exp2):
    """2**f from a table of 2**(k/entries), k = 0..entries: the entry below f, or with ``interpolate``
    T[k] + w * (T[k+1] - T[k]) with the weight w = f*entries - k in the format."""

    NAME = "lut"
    PARAMS = {"entries": Param(32, "int", 1), "interpolate": Param(True, "bool")}
    MAX_ERROR = {"fp32": 5.9e-05, "bf16": 0.0066}

    def setup(self, entries, interpolate):
        self.entries, self.interpolate = entries, interpolate
        self.table = self.rom(np.exp2(np.arange(entries + 1) / entries), "table entry")

    @property
    def piecewise_constant(self) -> bool:
        return not self.interpolate

    def fraction(self, f, dp):
        t = f * self.entries
        T = table(self.table, f)
        k = address(t, self.entries if not self.interpolate else self.entries - 1)
        if not self.interpolate:
            return keep_nan(f, T[k])
        lo = T[k]
        return keep_nan(f, dp.add(lo, dp.mul(dp.round(t - k), dp.sub(T[k + 1], lo))))
