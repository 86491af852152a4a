"""IEEE P3109 binary formats: ``P3109Format(k, precision, signed=True, extended=True)``.

Source: IEEE SA P3109 working group, "Interim Report on Binary Floating-point Formats for Machine Learning"
(https://github.com/P3109/Public), as Graphcore's gfloat 0.5.2 implements it (``gfloat.formats.
format_info_p3109``, ``round_float``, ``encode_float``), which the tests compare against bit for bit.

A format ``binaryK pP`` has K bits and precision P (P - 1 trailing significand bits, t):
- signed: 1 sign bit, w = K - P exponent bits, bias 2**(K-P-1); the negative-zero code 2**(K-1) is the only
  NaN (there is no -0); extended formats hold +inf at code 2**(K-1) - 1 and -inf at 2**K - 1.
- unsigned: no sign bit, w = K - P + 1 exponent bits, bias 2**(K-P); code 2**K - 1 is NaN; extended
  formats hold +inf at code 2**K - 2.
Every other code is a number: exponent field 0 is subnormal (f * 2**(1-bias-t)), else (2**t + f) *
2**(e-bias-t). ``max`` is the largest finite code's value (below infinity in extended formats).

The rounding is IEEE's, on the format's precision with unbounded exponent, then:
- a result above ``max`` (or an infinite input): with ``saturate`` -> +-max; otherwise extended -> +-inf,
  finite -> NaN. Toward zero and odd never go past max, up/down only in their own direction (gfloat's
  rules; an infinite input follows ``saturate`` alone).
- a zero result is +0 (no -0 exists); NaN in -> NaN out.
- unsigned formats: x < 0 (-inf included) -> NaN in every mode, with or without ``saturate``; -0 -> +0.
  (gfloat's ``encode_float`` gives the NaN code for x < 0 in finite unsigned formats and raises in extended
  ones; its ``round_float`` returns the negative input's own rounding, which is no value of the format.)
- stochastic: gfloat's ``RoundMode.Stochastic`` with ``srnumbits`` = emunum's ``sr_bits``.
Every number is a float32 value: ``max`` <= float32 max and the smallest subnormal >= 2**-149, else
ValueError. The kernels are the float kernels (``kernels.abi.FloatArgs``: precision, emin, max and overflow
describe the rounding exactly); unsigned formats add the x < 0 -> NaN step (``emunum/kernel_backends.py``).
"""
from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass

import numpy as np
import torch

from ..kernels.abi import FloatArgs
from .base import NumberFormat, Overflow, RoundMode, as_codes, check_bool, check_int
from .exact import round_float_torch

K_MAX = 16  # the widest K whose formats can all be listed (values(), encode tables)
_FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class P3109Format(NumberFormat):
    """An IEEE P3109 format (module docstring): K = ``k`` bits (3..16: P3109 starts at 3 bits), precision P = ``precision`` (signed
    1..K-1, unsigned 1..K), ``signed``, ``extended`` (infinities) or finite, and ``saturate`` (overflow to
    +-max instead of inf/NaN)."""

    k: int
    precision: int
    signed: bool = True
    extended: bool = True
    _: KW_ONLY
    saturate: bool = False

    def __post_init__(self):
        check_int("P3109Format.k", self.k, 3, K_MAX)
        check_bool("P3109Format.signed", self.signed)
        check_bool("P3109Format.extended", self.extended)
        check_bool("P3109Format.saturate", self.saturate)
        top = self.k - 1 if self.signed else self.k
        kind = "signed" if self.signed else "unsigned"
        if isinstance(self.precision, bool) or not isinstance(self.precision, (int, np.integer)):
            raise TypeError(f"P3109Format.precision must be an int in [1, {top}], got {self.precision!r}")
        if not 1 <= int(self.precision) <= top:
            raise ValueError(f"P3109Format.precision={self.precision} is out of range for a {kind} format with "
                             f"k={self.k}; allowed: 1..{top}")
        emax = (self._max_code >> self.man) - self.bias  # exponent of max (integers: max may not fit a float)
        if emax > 127 or self.max > _FLOAT32_MAX or self.emin - self.man < -149:
            raise ValueError(f"{self.name}: its values (max about 2**{emax}, smallest 2**{self.emin - self.man}) "
                             "do not fit a float32; allowed: formats whose values do (larger precision for this k)")

    # ---- structure ---------------------------------------------------------------------------------------
    @property
    def bits(self) -> int:
        return self.k

    @property
    def man(self) -> int:
        """Trailing significand bits, t = P - 1."""
        return self.precision - 1

    @property
    def exp(self) -> int:
        """Exponent field bits, w."""
        return self.k - self.precision + (0 if self.signed else 1)

    @property
    def bias(self) -> int:
        return 2 ** (self.k - self.precision - 1) if self.signed else 2 ** (self.k - self.precision)

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number, 1 - bias."""
        return 1 - self.bias

    @property
    def subnormals(self) -> bool:
        return True

    @property
    def has_inf(self) -> bool:
        return self.extended

    @property
    def has_nan(self) -> bool:
        return True

    @property
    def has_negative_zero(self) -> bool:
        return False

    @property
    def nan_code(self) -> int:
        return 2 ** (self.k - 1) if self.signed else 2**self.k - 1

    @property
    def _max_code(self) -> int:
        """Code of the largest finite value."""
        top = 2 ** (self.k - 1) - 1 if self.signed else 2**self.k - 2
        return top - int(self.extended)

    def _magnitude(self, c: int) -> float:
        e, f = c >> self.man, c & (2**self.man - 1)
        if e == 0:
            return math.ldexp(f, 1 - self.bias - self.man)
        return math.ldexp(2**self.man + f, e - self.bias - self.man)

    @property
    def max(self) -> float:
        return self._magnitude(self._max_code)

    @property
    def min(self) -> float:
        """The smallest finite value: -max, or 0 for unsigned formats."""
        return -self.max if self.signed else 0.0

    @property
    def min_subnormal(self) -> float:
        return math.ldexp(1.0, self.emin - self.man)

    @property
    def min_normal(self) -> float:
        return math.ldexp(1.0, self.emin)

    @property
    def eps(self) -> float:
        return math.ldexp(1.0, -self.man)

    @property
    def overflow(self) -> Overflow:
        if self.saturate:
            return Overflow.SATURATE
        return Overflow.INF if self.extended else Overflow.NAN

    @property
    def name(self) -> str:
        base = f"p3109_k{self.k}p{self.precision}{'' if self.signed else 'u'}{'' if self.extended else 'f'}"
        return base + ("[sat]" if self.saturate else "")

    def __str__(self) -> str:
        return self.name

    def to_kernel_args(self) -> FloatArgs:
        """The float kernels' record: they round to this precision, emin and max with this overflow code (x < 0
        in unsigned formats is the backend's extra step)."""
        return FloatArgs(man=self.man, emin=self.emin, subnormals=1, max=self.max, overflow=int(self.overflow),
                         negzero=0)

    # ---- codes -------------------------------------------------------------------------------------------
    def decode(self, codes) -> np.ndarray:
        """Codes (ints in [0, 2**k)) -> float64 values (module docstring)."""
        c = as_codes(codes, 2**self.k, self.name)
        return _value_table(self)[c]

    def encode(self, values, rounding: str = "nearest") -> np.ndarray:
        """Values -> codes (int64), after rounding with ``rounding`` (stochastic: the bits of seed 0, 32 of them)."""
        v = np.asarray(values, dtype=np.float64)
        q = round_p3109_torch(torch.from_numpy(v.copy()), self, RoundMode.parse(rounding)).numpy()
        table = _value_table(self)
        finite = np.isfinite(table) | np.isinf(table)
        order = np.flatnonzero(finite)[np.argsort(table[finite], kind="stable")]
        idx = np.searchsorted(table[order], q)
        codes = order[np.clip(idx, 0, order.size - 1)]
        return np.where(np.isnan(q), self.nan_code, codes).astype(np.int64)

    def values(self) -> np.ndarray:
        """Every finite value, sorted ascending, as float64."""
        t = _value_table(self)
        return np.unique(t[np.isfinite(t)])


def round_p3109_torch(x: torch.Tensor, fmt: P3109Format, mode: RoundMode, seed: int = 0,
                      sr_bits: int = 32) -> torch.Tensor:
    """x rounded to ``fmt`` in exact float64 torch arithmetic (float64 out): the float rounding of
    ``exact.round_float_torch`` on fmt's precision, emin, max and overflow, then x < 0 -> NaN if unsigned."""
    r = round_float_torch(x, fmt, mode, seed, sr_bits)
    if not fmt.signed:
        r = torch.where(x.to(torch.float64) < 0, float("nan"), r)
    return r


_TABLES: dict = {}


def _value_table(fmt: P3109Format) -> np.ndarray:
    """float64 value of every code 0 .. 2**k - 1, built once per (k, precision, signed, extended)."""
    key = (fmt.k, fmt.precision, fmt.signed, fmt.extended)
    t = _TABLES.get(key)
    if t is None:
        half = 2 ** (fmt.k - 1) if fmt.signed else 2**fmt.k
        mags = np.array([fmt._magnitude(c) for c in range(half)], dtype=np.float64)
        if fmt.extended:
            mags[fmt._max_code + 1] = np.inf
        if not fmt.signed:
            mags[-1] = np.nan
            t = mags
        else:
            t = np.concatenate([mags, -mags])
            t[half] = np.nan
        t.setflags(write=False)
        _TABLES[key] = t
    return t
