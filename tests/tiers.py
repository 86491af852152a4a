"""The default and exhaustive tiers of one parameter grid.

``grid`` parametrises a test over the product of its axes. The default tier (``make test``) runs one case per
value of the *lead* axes (their product), the other axes' values taken in turn: the i-th lead case gets value
``i % len(axis)`` of every other axis. Every value of every axis therefore runs by default wherever the lead
cases outnumber it, and so does every kernel variant those values select; the remaining cases of the product are
marked ``exhaustive`` (``pytest -m exhaustive``), so the two tiers together run the whole product once.
"""
from __future__ import annotations

import itertools
from typing import Callable, Sequence

import pytest


def grid(axes: Sequence[Sequence], lead: int = 1, ids: Sequence[Callable | None] | None = None) -> list:
    """``pytest.param`` cases of the product of ``axes`` (in order), the non-default ones marked exhaustive; ids:
    one function per axis that names a value (None: pytest's own id for that value)."""
    if not 1 <= lead <= len(axes):
        raise ValueError(f"lead must be 1..{len(axes)} (the number of axes); got {lead}")
    ids = list(ids) if ids is not None else [None] * len(axes)
    if len(ids) != len(axes):
        raise ValueError(f"ids must name one function per axis ({len(axes)}); got {len(ids)}")
    name = [f if f is not None else _default_id for f in ids]
    rest = axes[lead:]
    cases = []
    for i, head in enumerate(itertools.product(*axes[:lead])):
        default = tuple(i % len(axis) for axis in rest)
        for at in itertools.product(*(range(len(axis)) for axis in rest)):
            values = (*head, *(axis[j] for axis, j in zip(rest, at)))
            marks = () if at == default else (pytest.mark.exhaustive,)
            cases.append(pytest.param(*values, marks=marks, id="-".join(f(v) for f, v in zip(name, values))))
    return cases


def _default_id(value) -> str:
    if isinstance(value, tuple):
        return "_".join(map(str, value))
    return str(value)
