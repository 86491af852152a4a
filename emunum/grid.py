"""Grid tags: which tensors hold only values that rounding to a format leaves unchanged, so that rounding them
again can be skipped without changing a bit (``docs/elision.md``).

A tag is ``(format, version)`` stored on the tensor object: ``mark(t, fmt)`` after t was filled by a rounding to
``fmt`` (or by an op that keeps values on fmt's grid); ``grid_of(t)`` gives the format while t's version counter
(``t._version``, bumped by every in-place write torch records, through any view) still has the value it had
when t was marked. A view is on the grid of its base while the base's tag holds (a view shares its base's
version counter). Rounding a value that a rounding to F produced, again to F, in any mode (nearest, directed,
odd, stochastic) gives that value back bit for bit: finite values are representable, infinities stay, and NaNs
come back as the quiet NaNs they already are (tests/test_grid.py checks every code of the formats it names).

Only element formats of ``FloatFormat`` are tagged, on float32 and float64 tensors: their grids contain +0, and
every value a rounding to them returns is a float32 value. (A float16/bfloat16 result is a rounding cast back to
its dtype, which need not be a value of the format, so those tensors are never tagged.) Writes that bypass the version counter (``t.data`` of another tensor, raw ``data_ptr`` writes) are not
seen: code that makes them should run with elision off.

The switch: ``EMUNUM_ELIDE=0`` in the environment turns elision off for the process (default on);
``set_elision(False)`` / ``with elision(False):`` at run time; ``emunum.patch(model, ..., elide=False)`` for
one model's layers.
"""
from __future__ import annotations

import functools
import os
from collections import Counter

import torch
from torch import Tensor

from .formats import FloatFormat

ENV = "EMUNUM_ELIDE"
_ATTR = "_emunum_grid"


def _env_default() -> bool:
    v = os.environ.get(ENV, "1").strip().lower()
    if v in ("1", "true", "yes", "on", ""):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{ENV}={v!r}: allowed: 1/true/yes/on or 0/false/no/off")


_enabled = [_env_default()]
# Roundings of tensors with fewer elements than this take the plain path (not elided, their results not tagged):
# there the bookkeeping (tags, the history walk and hooks for gradients) costs more than the roundings it skips.
# Measured on element-wise steps: benchmarks/RESULTS.md, "Elision only from 2**16 elements".
DEFAULT_MIN_ELEMENTS = 1 << 16
_min_elements = [DEFAULT_MIN_ELEMENTS]
# elided roundings since the last reset: "forward" (values), "backward" (gradients)
elided: Counter = Counter()


def enabled() -> bool:
    """Whether elision is on for the process (``EMUNUM_ELIDE``, ``set_elision``)."""
    return _enabled[0]


def set_elision(on: bool) -> bool:
    """Turn elision on or off for the process; returns the previous setting."""
    if not isinstance(on, bool):
        raise TypeError(f"on must be a bool, got {on!r}")
    prev, _enabled[0] = _enabled[0], on
    return prev


def set_min_elements(n: int) -> int:
    """Elide only the roundings of tensors of at least ``n`` elements (0: every size); returns the previous value.
    Smaller tensors are rounded as with elision off (the same bits either way)."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int, got {n!r}")
    if n < 0:
        raise ValueError(f"n={n} must be >= 0")
    prev, _min_elements[0] = _min_elements[0], n
    return prev


class elision:
    """``with elision(False):`` run with elision off (or on), then restore the previous setting."""

    def __init__(self, on: bool):
        if not isinstance(on, bool):
            raise TypeError(f"on must be a bool, got {on!r}")
        self.on = on

    def __enter__(self):
        self.prev = set_elision(self.on)
        return self

    def __exit__(self, *exc):
        set_elision(self.prev)
        return False


_DTYPES = (torch.float32, torch.float64)


def taggable(fmt, t: Tensor) -> bool:
    """Whether t, rounded to fmt, may be tagged: a FloatFormat and a float32/float64 tensor."""
    return type(fmt) is FloatFormat and t.dtype in _DTYPES


def mark(t: Tensor, fmt) -> Tensor:
    """Record that every element of t is on fmt's grid now (t as it is at its current version); returns t."""
    t.__dict__[_ATTR] = (fmt, t._version)
    return t


def unmark(t: Tensor) -> None:
    t.__dict__.pop(_ATTR, None)


def grid_of(t: Tensor):
    """The format whose grid holds every element of t (t's own tag, or its base's for a view), or None."""
    tag = t.__dict__.get(_ATTR)
    if tag is not None:
        return tag[0] if tag[1] == t._version else None
    b = t._base
    if b is not None:
        tag = b.__dict__.get(_ATTR)
        if tag is not None and tag[1] == b._version:
            return tag[0]
    return None


def nests(inner, outer) -> bool:
    """Whether every value a rounding to ``inner`` returns is one that every rounding mode of ``outer`` returns
    unchanged: the same format, or ``nested(inner, outer)``."""
    return inner is not None and (inner is outer or inner == outer or nested(inner, outer))


@functools.lru_cache(maxsize=256)
def nested(inner, outer) -> bool:
    """Whether the FloatFormat ``inner`` (16 bits or fewer) has all its values in ``outer``'s grid: each finite
    value (and -0 where inner has it) is returned unchanged by rounding to ``outer`` (to nearest, which then holds
    for every mode), and an inner infinity stays one in outer. Decided once per pair by the rounding kernel on
    every value of ``inner``."""
    if type(inner) is not FloatFormat or type(outer) is not FloatFormat or inner.bits > 16:
        return False
    if inner.has_inf and not (outer.has_inf and not outer.saturate):
        return False
    if inner.has_negative_zero and not outer.has_negative_zero:
        return False
    from .quantize import quantize  # noqa: PLC0415  (only when two different formats meet)

    v = torch.from_numpy(inner.values())
    neg = -v[v != 0]
    v = torch.cat([v, neg, torch.tensor([-0.0], dtype=v.dtype)] if inner.has_negative_zero else [v, neg])
    for dt, bits in ((torch.float32, torch.int32), (torch.float64, torch.int64)):
        x = v.to(dt)
        if not torch.equal(quantize(x, outer).view(bits), x.view(bits)):
            return False
    return True
