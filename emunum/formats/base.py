"""What every number system provides, and the rounding modes they share.

A number system is one module of this package (``float.py``, ``fixed.py``, ...) holding a frozen, hashable
spec that subclasses ``NumberFormat``. The spec validates itself once, at construction, derives its limits
as properties named after ``numpy.finfo`` (``max``, ``eps``, ...), maps values to bit patterns (``encode``)
and back (``decode``), lists its values (``values``, small formats), and flattens to the plain ints and
floats its kernel core takes (``to_kernel_args``). A new number system is one new module here plus its
scalar core in ``kernels/scalar/``.
"""
from __future__ import annotations

import abc
import enum
from typing import Union

import numpy as np


def parse_enum(cls, value, field: str, what: str, aliases: dict | None = None):
    """``value`` as a member of the enum ``cls``: a member, or its name or (string) value, case-insensitive,
    with '-' read as '_' and ``aliases`` applied first. Anything else: ValueError naming the field, the value
    and the choices."""
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        key = value.strip().lower().replace("-", "_")
        key = (aliases or {}).get(key, key)
        for m in cls:
            if key == m.name.lower() or (isinstance(m.value, str) and key == m.value):
                return m
    allowed = ", ".join(m.value if isinstance(m.value, str) else m.name.lower() for m in cls)
    raise ValueError(f"{field}={value!r} is not {what}; allowed: {allowed}")



class RoundMode(enum.IntEnum):
    """Rounding modes. The integer values are the codes the kernels receive."""

    NEAREST = 0  # to nearest, ties to even
    NEAREST_AWAY = 1  # to nearest, ties away from zero
    TOWARD_ZERO = 2
    UP = 3  # toward +inf
    DOWN = 4  # toward -inf
    ODD = 5  # truncate, then set the last bit if inexact ("jamming"; avoids double rounding)
    STOCHASTIC = 6  # up with probability (|x| - lo) / (hi - lo), from a counter-based generator

    @classmethod
    def parse(cls, value: Union[str, "RoundMode"], field: str = "rounding") -> "RoundMode":
        return parse_enum(cls, value, field, "a rounding mode", _ROUND_ALIASES)


_ROUND_ALIASES = {
    "rne": "nearest", "nearest_even": "nearest", "ties_to_even": "nearest",
    "rna": "nearest_away", "ties_to_away": "nearest_away",
    "rtz": "toward_zero", "truncate": "toward_zero",
    "ceil": "up", "toward_positive": "up", "floor": "down", "toward_negative": "down",
    "sr": "stochastic",
}



class Overflow(enum.IntEnum):
    """What a kernel writes for a magnitude beyond ``max`` (kernel code)."""

    INF = 0
    NAN = 1
    SATURATE = 2


def check_int(name: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int in [{lo}, {hi}], got {value!r} ({type(value).__name__})")
    if not lo <= int(value) <= hi:
        raise ValueError(f"{name}={value} is out of range; allowed: {lo}..{hi}")
    return int(value)


def as_codes(codes, limit: int, name: str) -> np.ndarray:
    """``codes`` as int64 bit patterns, each in [0, limit): TypeError for a non-integer array, ValueError naming
    the format ``name`` for a code out of range (every number system's ``decode`` checks its input so)."""
    c = np.asarray(codes)
    if not np.issubdtype(c.dtype, np.integer):
        raise TypeError(f"codes must be integers, got dtype {c.dtype}")
    c = c.astype(np.int64)
    if np.any((c < 0) | (c >= limit)):
        raise ValueError(f"codes must be in [0, {limit}) for {name}")
    return c


def check_bool(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)



class FormatSpec(abc.ABC):
    """What every format spec has, an element format (``NumberFormat``) or a block format (``BlockFormat``,
    whose elements share scales): a canonical name and a largest finite value. Each also has ``bits``, the
    bits per element (a field or a property, so not declared here: a dataclass field cannot override one)."""

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """The canonical name (``get_format(fmt.name) == fmt`` where a name exists)."""

    @property
    @abc.abstractmethod
    def max(self) -> float:
        """The largest finite value."""


class NumberFormat(FormatSpec):
    """The interface of an element format (each one a frozen dataclass): every value stands alone, with a
    code of its own; values, codes and one kernel record (``to_kernel_args``) describe it completely."""

    @abc.abstractmethod
    def decode(self, codes) -> np.ndarray:
        """Bit patterns (integers) -> float64 values."""

    @abc.abstractmethod
    def encode(self, values, rounding: str = "nearest") -> np.ndarray:
        """Values -> bit patterns (int64), after rounding with ``rounding``."""

    @abc.abstractmethod
    def values(self) -> np.ndarray:
        """Every value of the format, as float64 (small formats only)."""

    @abc.abstractmethod
    def to_kernel_args(self) -> tuple:
        """The plain ints and floats the format's kernel core takes."""

