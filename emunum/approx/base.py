"""The machinery shared by every approximate operator: parameters, method registry, gradient choice, apply.

A ``Method`` subclass approximates one function (``FUNCTION``: "tanh", "sigmoid", "exp2") in one format:
its constructor validates the parameters, fits coefficients in float64 and rounds them to the format
(``DesignRounder``); ``evaluate(x, dp)`` runs the datapath on a float64 tensor of format values.
``MAX_ERROR`` holds the maximum error measured for the default parameters (``errors.py``; nearest
rounding), which ``documented`` appends to the class docstring.
"""
from __future__ import annotations

import enum
import textwrap
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Union

import torch
from torch import Tensor

from ..formats import get_format, parse_enum
from ..quantize import check_tensor
from .datapath import Datapath, DesignRounder


class Grad(enum.Enum):
    """Which gradient an approximate operator returns."""

    APPROX = "approx"  # differentiate the approximation itself (straight-through rounding)
    EXACT = "exact"  # the exact function's derivative at x (e.g. 1 - tanh(x)**2)

    @classmethod
    def parse(cls, value: Union[str, "Grad"], field: str = "grad") -> "Grad":
        return parse_enum(cls, value, field, "a gradient choice")


@dataclass(frozen=True)
class Param:
    """A method parameter: default, type ("int", "float", "bool" or a tuple of allowed strings), lower bound."""

    default: Any
    kind: Any
    low: float | None = None
    odd: bool = False

    def check(self, owner: str, name: str, value):
        if value is None and self.default is None:
            return None
        if isinstance(self.kind, tuple):
            if value not in self.kind:
                raise ValueError(f"{owner}: {name}={value!r} is not allowed; allowed: {', '.join(self.kind)}")
            return value
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise TypeError(f"{owner}: {name} must be a bool, got {value!r}")
            return value
        ok = (int,) if self.kind == "int" else (int, float)
        if isinstance(value, bool) or not isinstance(value, ok):
            raise TypeError(f"{owner}: {name} must be {'an int' if self.kind == 'int' else 'a number'}, "
                            f"got {value!r}")
        if self.low is not None and not value >= self.low:
            raise ValueError(f"{owner}: {name}={value!r} is out of range; allowed: >= {self.low}")
        if self.odd and value % 2 != 1:
            raise ValueError(f"{owner}: {name}={value!r} must be odd")
        return int(value) if self.kind == "int" else float(value)


class Method:
    """Base class; see module doc."""

    FUNCTION = ""
    NAME = ""
    PARAMS: dict[str, Param] = {}
    MAX_ERROR: dict[str, float] = {}

    def __init__(self, fmt, **params):
        self.fmt = get_format(fmt)
        owner = f"{self.FUNCTION} method {self.NAME!r}"
        unknown = sorted(set(params) - set(self.PARAMS))
        if unknown:
            raise ValueError(f"{owner} has no parameter {', '.join(unknown)}; "
                             f"allowed: {', '.join(self.PARAMS) or 'none'}")
        self.params = {k: p.check(owner, k, params.get(k, p.default)) for k, p in self.PARAMS.items()}
        self.rom = DesignRounder(self.fmt, owner)
        self.setup(**self.params)

    def setup(self, **params) -> None:
        """Fit and round the constants (subclasses)."""

    def evaluate(self, x: Tensor, dp: Datapath) -> Tensor:
        raise NotImplementedError

    @property
    def piecewise_constant(self) -> bool:
        """True if the approximation is a step function, whose own derivative is 0 almost everywhere."""
        return False

    def __repr__(self) -> str:
        ps = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({self.NAME!r}, fmt={self.fmt.name}{', ' if ps else ''}{ps})"


def documented(cls):
    """Append the parameters and the measured error bounds (``MAX_ERROR``) to the class docstring."""
    params = ", ".join(f"{k}={p.default!r}" for k, p in cls.PARAMS.items()) or "none"
    errors = "; ".join(f"{fmt}: {err:.2g}" for fmt, err in cls.MAX_ERROR.items())
    text = (f"Parameters (defaults): {params}. Max error with the default parameters, nearest rounding "
            f"({ERROR_MEASURE[cls.FUNCTION]}): {errors}.")
    cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n\n" + textwrap.fill(
        text, 110, initial_indent="    ", subsequent_indent="    ") + "\n"
    return cls


ERROR_MEASURE = {
    "tanh": "absolute, over 65537 evenly spaced x in [-8, 8] rounded to the format",
    "sigmoid": "absolute, over 65537 evenly spaced x in [-8, 8] rounded to the format",
    "exp2": "relative, over 65537 evenly spaced x in [-16, 16] rounded to the format",
    "softmax": "absolute, over 1024 rows of 32 values 4*N(0,1) (seed 0) rounded to the format",
}

REGISTRY: dict[str, dict[str, type[Method]]] = {"tanh": {}, "sigmoid": {}, "exp2": {}}


def register(cls):
    REGISTRY[cls.FUNCTION][cls.NAME] = cls
    return documented(cls)


def method_class(function: str, method: str) -> type[Method]:
    table = REGISTRY[function]
    if not isinstance(method, str) or method.strip().lower() not in table:
        raise ValueError(f"method={method!r} is not a {function} approximation; allowed: {', '.join(table)}")
    return table[method.strip().lower()]


@lru_cache(maxsize=256)
def _build_cached(function: str, method: str, fmt, items: tuple) -> Method:
    return method_class(function, method)(fmt, **dict(items))


def build(function: str, method: str, fmt, params: dict) -> Method:
    """The method object for (function, method, fmt, params), built once and cached."""
    fmt = get_format(fmt)
    try:
        items = tuple(sorted(params.items()))
        hash(items)
    except TypeError:
        return method_class(function, method)(fmt, **params)
    return _build_cached(function, method, fmt, items)


def check_grad(m, grad, x: Tensor | None = None) -> Grad:
    """Parse ``grad``. "approx" does not apply to a step function (its own gradient is 0 everywhere): that
    raises once a gradient is wanted, i.e. for an ``x`` that requires grad while grad mode is on."""
    g = Grad.parse(grad)
    wanted = x is not None and x.requires_grad and torch.is_grad_enabled()
    if g == Grad.APPROX and wanted and m.piecewise_constant:
        raise ValueError(f"grad='approx' does not apply to {m!r}: it is piecewise constant, so its own gradient is "
                         "0 everywhere; allowed: grad='exact', or interpolate=True")
    return g


def apply(m, x: Tensor, rounding, grad, seed, sr_bits, exact: str, dim: int | None = None) -> Tensor:
    """Evaluate ``m`` (along ``dim``, for softmax) on x in its format; the result has x's dtype (cast from
    float64, nearest). grad "approx": autograd through the datapath; "exact": the derivative of the exact
    function ``exact`` ("tanh", "sigmoid", "exp2", "softmax")."""
    check_tensor(x)
    g = check_grad(m, grad, x)
    dp = Datapath(m.fmt, rounding, seed, sr_bits)

    def run():
        xin = dp.input(x)
        y = m.evaluate(xin, dp) if dim is None else m.evaluate(xin, dp, dim)
        return y.to(x.dtype)

    if g == Grad.EXACT:
        with torch.no_grad():
            y = run()
        return torch.ops.emunum.exact_grad(y, x, exact, 0 if dim is None else dim)
    return run()
