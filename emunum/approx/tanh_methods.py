"""tanh approximations: hard tanh, rational (Pade / Lambert continued fraction), clamped odd polynomial
(Taylor or minimax), and 2 * sigmoid(2x) - 1 through a sigmoid approximation (PLAN by default).
Piecewise-linear and lookup-table methods live in ``piecewise.py``."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from .base import REGISTRY, Method, Param, register
from .fit import best_clip, lambert_tanh, remez, tanh_taylor
from .piecewise import split_sign


def _horner_np(coeffs, u):
    acc = np.zeros_like(u) + coeffs[-1]
    for c in reversed(coeffs[:-1]):
        acc = acc * u + c
    return acc


@register
class TanhHard(Method):
    """Hard tanh: clamp(x, -1, 1) (two compare/selects; exact on format values)."""

    FUNCTION = "tanh"
    NAME = "hard"
    PARAMS = {}
    MAX_ERROR = {"fp32": 0.24, "bf16": 0.24}

    def setup(self):
        self.one = self.rom(1.0)

    def evaluate(self, x, dp):
        return x.clamp(-self.one, self.one)


class _Clamped(Method):
    """Common part of the rational and polynomial methods: evaluate on a = min(|x|, clip), then
    y = min(model(a), 1) with the sign of x. ``clip=None`` picks the clamp that minimises the max error of
    the unrounded model over all x (``fit.best_clip``)."""

    FUNCTION = "tanh"

    def evaluate(self, x, dp):
        neg, a = split_sign(x)
        a = a.clamp(max=self.clip)
        y = self.model(a, dp).clamp(max=self.one)
        return torch.where(neg, -y, y)


@lru_cache(maxsize=None)
def _rational_clip(depth):
    p, q = lambert_tanh(depth)
    return best_clip(lambda c: lambda a: a * _horner_np(p, a * a) / _horner_np(q, a * a), np.tanh)


@register
class TanhRational(_Clamped):
    """Depth-``depth`` truncation of Lambert's continued fraction tanh x = x/(1 + x^2/(3 + x^2/(5 + ...))), a
    Pade approximant. ``form="pade"``: x * P(x^2) / Q(x^2) by Horner (one divide); ``form="cf"``: the
    continued fraction itself (depth - 1 divides, plus one). Clamped as in ``_Clamped``."""

    NAME = "rational"
    PARAMS = {"depth": Param(5, "int", 1), "form": Param("pade", ("pade", "cf")), "clip": Param(None, "float", 0.0)}
    MAX_ERROR = {"fp32": 0.0011, "bf16": 0.011}

    def setup(self, depth, form, clip):
        p, q = lambert_tanh(depth)
        self.clip = self.rom(_rational_clip(depth) if clip is None else clip, "clip")
        self.one = self.rom(1.0)
        self.form, self.depth = form, depth
        if form == "pade":
            self.p, self.q = self.rom(p, "coefficient"), self.rom(q, "coefficient")
        else:
            self.odd = self.rom([2 * j - 1 for j in range(1, depth + 1)], "constant")

    def model(self, a, dp):
        u = dp.mul(a, a)
        if self.form == "pade":
            return dp.div(dp.mul(a, dp.horner(self.p, u)), dp.horner(self.q, u))
        d = torch.full_like(u, self.odd[-1])
        for c in reversed(self.odd[:-1]):
            d = dp.add(dp.div(u, d), c)
        return dp.div(a, d)


@lru_cache(maxsize=None)
def _poly_fit(degree, coeffs, clip):
    powers = list(range(1, degree + 1, 2))

    def fit(c):
        if coeffs == "taylor":
            return list(tanh_taylor(len(powers)))
        return list(remez(np.tanh, powers, 0.0, c)[0])

    def model(c):
        k = fit(c)
        return lambda a: a * _horner_np(k, a * a)

    if clip is None:
        clip = best_clip(model, np.tanh, lo=0.25, hi=6.0, step=1 / 16)
    return clip, tuple(fit(clip))


@register
class TanhPoly(_Clamped):
    """Odd polynomial x * Q(x^2) of degree ``degree`` (Horner in x^2), ``coeffs="minimax"`` (Remez on
    [0, clip]) or ``"taylor"``. Clamped as in ``_Clamped``."""

    NAME = "poly"
    PARAMS = {"degree": Param(9, "int", 1, odd=True), "coeffs": Param("minimax", ("minimax", "taylor")),
              "clip": Param(None, "float", 0.0)}
    MAX_ERROR = {"fp32": 0.0041, "bf16": 0.035}

    def setup(self, degree, coeffs, clip):
        c, k = _poly_fit(degree, coeffs, clip)
        self.clip, self.k, self.one = self.rom(c, "clip"), self.rom(k, "coefficient"), self.rom(1.0)

    def model(self, a, dp):
        return dp.mul(a, dp.horner(self.k, dp.mul(a, a)))


@register
class TanhViaSigmoid(Method):
    """tanh(x) = 2 * sigmoid(2x) - 1 with the sigmoid approximation ``sigmoid`` (default PLAN): two
    multiplies by 2 (exact shifts unless they overflow), the sigmoid datapath, one subtract."""

    FUNCTION = "tanh"
    NAME = "sigmoid"
    PARAMS = {"sigmoid": Param("plan", ("plan", "pwl", "lut", "hard", "exp2"))}
    MAX_ERROR = {"fp32": 0.038, "bf16": 0.041}

    def setup(self, sigmoid):
        self.sig = REGISTRY["sigmoid"][sigmoid](self.fmt)
        self.two, self.one = self.rom(2.0), self.rom(1.0)

    @property
    def piecewise_constant(self) -> bool:
        return self.sig.piecewise_constant

    def evaluate(self, x, dp):
        s = self.sig.evaluate(dp.mul(x, self.two), dp)
        return dp.sub(dp.mul(s, self.two), self.one)
