"""Measure the maximum error of every approximation with its default parameters (the figures in the
docstrings): ``python -m emunum.approx.errors`` prints them; the tests recompute them.

Inputs are rounded to the format first, so the figure is the error of the approximation on format values,
against the exact function of those values (float64): absolute for tanh, sigmoid and softmax, relative for
exp2 (see ``base.ERROR_MEASURE``). Nearest rounding throughout.
"""
from __future__ import annotations

import torch

from ..quantize import quantize
from .base import REGISTRY, apply, build
from .softmax_method import MAX_ERROR as SOFTMAX_MAX_ERROR
from .softmax_method import softmax_datapath

FORMATS = ("fp32", "bf16")
EXACT = {"tanh": torch.tanh, "sigmoid": torch.sigmoid, "exp2": torch.exp2}


def inputs(function: str, fmt) -> torch.Tensor:
    """The measurement inputs (float32 tensors holding values of ``fmt``)."""
    if function == "softmax":
        g = torch.Generator().manual_seed(0)
        x = 4 * torch.randn(1024, 32, generator=g, dtype=torch.float64)
    else:
        r = 16.0 if function == "exp2" else 8.0
        x = torch.linspace(-r, r, 65537, dtype=torch.float64)
    return quantize(x, fmt).float()


def max_error(function: str, method: str | None, fmt) -> float:
    """Max error of ``function`` by ``method`` (default parameters) in ``fmt``; method None for softmax."""
    x = inputs(function, fmt)
    if function == "softmax":
        y = apply(softmax_datapath(fmt, "poly", {}), x, "nearest", "approx", None, None, "softmax", -1)
        return float((y.double() - torch.softmax(x.double(), -1)).abs().max())
    y = apply(build(function, method, fmt, {}), x, "nearest", "approx", None, None, function).double()
    ref = EXACT[function](x.double())
    err = (y - ref).abs()
    if function == "exp2":
        err = err / ref
    return float(err.max())


def documented(function: str, method: str | None, fmt: str) -> float:
    """The documented bound for (function, method, fmt)."""
    if function == "softmax":
        return SOFTMAX_MAX_ERROR[fmt]
    return REGISTRY[function][method].MAX_ERROR[fmt]


def cases():
    for function in ("tanh", "sigmoid", "exp2"):
        for method in REGISTRY[function]:
            yield function, method
    yield "softmax", None


def main() -> None:
    print(f"{'function':8s} {'method':9s} " + " ".join(f"{f:>21s}" for f in FORMATS))
    for function, method in cases():
        cells = []
        for fmt in FORMATS:
            cells.append(f"{max_error(function, method, fmt):10.3e} ({documented(function, method, fmt):7.2g})")
        print(f"{function:8s} {str(method):9s} " + " ".join(cells))
    print("columns: measured max error (documented bound)")


if __name__ == "__main__":
    main()
