"""Approximate operators as hardware builds them, emulated bit for bit in a chosen number format.

Every intermediate value is a value of ``fmt``: the input is rounded to it, every multiply, add, subtract,
divide and exponent shift is rounded to it with ``rounding``, constants and table entries are rounded to it
(to nearest) once, at construction (see ``datapath.py``). Results have the input's dtype.

- ``tanh(x, method, ...)``: hard, pwl, lut, rational, poly, sigmoid (2 * sigmoid(2x) - 1, PLAN by default)
- ``sigmoid(x, method, ...)``: plan, hard, pwl, lut, exp2
- ``exp2(x, method, ...)``: poly, lut (exponent shift of the integer part, approximation of the fraction)
- ``softmax(x, dim, exp2=..., ...)``: exp2(x * log2 e - max) / adder-tree sum
- modules ``Tanh``, ``Sigmoid``, ``Softmax`` with the same arguments.

``grad="approx"`` differentiates the approximation (straight-through rounding, zero derivative of floor and
table addresses; for a step function, a table without interpolation, that would be 0 everywhere, so it
raises ValueError when a gradient is wanted); ``grad="exact"`` returns the exact
function's derivative at x (1 - tanh(x)**2, s(1 - s), ln2 * 2**x, the softmax Jacobian). Each method's
docstring gives its parameters and its maximum error, measured by ``python -m emunum.approx.errors``.
Unknown methods, parameters or choices raise ValueError naming the allowed ones; non-float tensors TypeError.
"""
from __future__ import annotations

from torch import Tensor

from . import exp2_methods, piecewise, sigmoid_methods, tanh_methods  # noqa: F401  (register the methods)
from .base import REGISTRY, Grad, Method, apply, build
from .datapath import Datapath
from .modules import Sigmoid, Softmax, Tanh
from .softmax_method import softmax_datapath

TANH_METHODS = tuple(REGISTRY["tanh"])
SIGMOID_METHODS = tuple(REGISTRY["sigmoid"])
EXP2_METHODS = tuple(REGISTRY["exp2"])


def tanh(x: Tensor, method: str = "pwl", *, fmt="fp32", rounding="nearest", grad="approx", seed=None,
         sr_bits=None, **params) -> Tensor:
    """Approximate tanh of x computed in ``fmt`` (see the module doc and each method's docstring)."""
    return apply(build("tanh", method, fmt, params), x, rounding, grad, seed, sr_bits, "tanh")


def sigmoid(x: Tensor, method: str = "plan", *, fmt="fp32", rounding="nearest", grad="approx", seed=None,
            sr_bits=None, **params) -> Tensor:
    """Approximate logistic sigmoid of x computed in ``fmt``."""
    return apply(build("sigmoid", method, fmt, params), x, rounding, grad, seed, sr_bits, "sigmoid")


def exp2(x: Tensor, method: str = "poly", *, fmt="fp32", rounding="nearest", grad="approx", seed=None,
         sr_bits=None, **params) -> Tensor:
    """Approximate 2**x computed in ``fmt``."""
    return apply(build("exp2", method, fmt, params), x, rounding, grad, seed, sr_bits, "exp2")


def softmax(x: Tensor, dim: int = -1, *, exp2: str = "poly", fmt="fp32", rounding="nearest", grad="approx",
            seed=None, sr_bits=None, **params) -> Tensor:
    """exp2-based softmax of x along ``dim`` computed in ``fmt``; ``params`` go to the exp2 method."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"dim must be an int, got {dim!r}")
    return apply(softmax_datapath(fmt, exp2, params), x, rounding, grad, seed, sr_bits, "softmax", dim)


__all__ = [
    "tanh", "sigmoid", "exp2", "softmax", "Tanh", "Sigmoid", "Softmax", "Grad", "Method", "Datapath",
    "TANH_METHODS", "SIGMOID_METHODS", "EXP2_METHODS",
]
