"""Number-format specs and rounding modes: frozen, hashable data, validated once at construction.

A ``FloatFormat`` is a sign bit, ``exp`` exponent bits and ``man`` stored mantissa bits. A ``FixedFormat``
is a two's-complement (or unsigned) integer code scaled by ``2**-frac_bits``. Both derive their limits
(``max``, ``min_normal``, ``min_subnormal``, ``eps``) as properties named after ``numpy.finfo``, map values
to bit patterns (``encode``) and back (``decode``), and flatten to plain ints and floats for kernels and
torch custom ops (``to_kernel_args``).
"""
from __future__ import annotations

import enum
import math
from dataclasses import KW_ONLY, dataclass
from typing import Union

import numpy as np

FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_TINY_EXP = -149  # exponent of float32's smallest subnormal


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


class Special(enum.IntEnum):
    """Where a float format keeps its non-finite values."""

    IEEE = 0  # top exponent holds inf (mantissa 0) and NaN (mantissa != 0)
    FN = 1  # finite; only the all-ones code (both signs) is NaN
    FNUZ = 2  # finite; NaN is the negative-zero code; no -0
    NONE = 3  # every code is a finite number

    @classmethod
    def parse(cls, value: Union[str, "Special"]) -> "Special":
        return parse_enum(cls, value, "special", "a special-value policy")


class Overflow(enum.IntEnum):
    """What a kernel writes for a magnitude beyond ``max`` (kernel code)."""

    INF = 0
    NAN = 1
    SATURATE = 2


def _check_int(name: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int in [{lo}, {hi}], got {value!r} ({type(value).__name__})")
    if not lo <= int(value) <= hi:
        raise ValueError(f"{name}={value} is out of range; allowed: {lo}..{hi}")
    return int(value)


def _check_bool(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format: 1 sign bit, ``exp`` exponent bits, ``man`` stored mantissa bits.

    ``bias`` None means IEEE's ``2**(exp-1) - 1`` (one higher for ``special="fnuz"``). ``subnormals=False``
    removes the subnormal codes: the value set is then {0, +-min_normal, ...}, and a value below
    ``min_normal`` rounds to 0 or ``min_normal`` by the rounding mode (round-to-set, not flush-to-zero).
    Overflow (a rounded magnitude above ``max``, or an infinite input): with ``saturate`` -> +-max;
    otherwise ieee -> +-inf, fn/fnuz -> NaN, none -> +-max. Directed modes follow IEEE 754: toward zero
    and odd never overflow past +-max; up/down overflow only in their own direction. A NaN comes back as
    the same NaN, quietened.
    Every value must fit a float32: exp 1..8, man 0..23, max <= float32 max, min_subnormal >= 2**-149.
    """

    exp: int
    man: int
    _: KW_ONLY
    bias: int | None = None
    subnormals: bool = True
    special: Special = Special.IEEE
    saturate: bool = False

    def __post_init__(self):
        _check_int("FloatFormat.exp", self.exp, 1, 8)
        _check_int("FloatFormat.man", self.man, 0, 23)
        object.__setattr__(self, "special", Special.parse(self.special))
        _check_bool("FloatFormat.subnormals", self.subnormals)
        _check_bool("FloatFormat.saturate", self.saturate)
        if self.bias is None:
            object.__setattr__(self, "bias", 2 ** (self.exp - 1) - 1 + (self.special == Special.FNUZ))
        _check_int("FloatFormat.bias", self.bias, -512, 512)
        if self.special == Special.IEEE and self.exp < 2:
            raise ValueError("FloatFormat.exp=1 with special='ieee' leaves no normal numbers; allowed: exp >= 2")
        if self.special == Special.FN and self.exp == 1 and self.man == 0:
            raise ValueError("FloatFormat e1m0 with special='fn' has no finite nonzero value")
        if self.max > FLOAT32_MAX:
            raise ValueError(
                f"{self.name}: max={self.max:.6g} does not fit a float32 (max {FLOAT32_MAX:.6g}); "
                f"lower exp or raise bias={self.bias}"
            )
        smallest_exp = self.emin - (self.man if self.subnormals else 0)
        if smallest_exp < FLOAT32_TINY_EXP:
            raise ValueError(
                f"{self.name}: smallest value 2**{smallest_exp} is below float32's 2**{FLOAT32_TINY_EXP}; "
                f"lower bias={self.bias} or man={self.man}"
            )

    # ---- structure -------------------------------------------------------------------------------
    @property
    def bits(self) -> int:
        return 1 + self.exp + self.man

    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal number."""
        return 1 - self.bias

    @property
    def _top_code(self) -> tuple[int, int]:
        """(biased exponent, mantissa) of the largest finite magnitude."""
        e_all, m_all = 2**self.exp - 1, 2**self.man - 1
        if self.special == Special.IEEE:
            return e_all - 1, m_all
        if self.special == Special.FN:
            return (e_all, m_all - 1) if self.man > 0 else (e_all - 1, 0)
        return e_all, m_all

    @property
    def emax(self) -> int:
        """Unbiased exponent of the largest finite number."""
        return self._top_code[0] - self.bias

    @property
    def max(self) -> float:
        e, m = self._top_code
        return math.ldexp(1.0 + m / 2**self.man, e - self.bias) if e > 0 else math.ldexp(m, self.emin - self.man)

    @property
    def min_normal(self) -> float:
        return math.ldexp(1.0, self.emin)

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value (``min_normal`` when subnormals are off)."""
        return math.ldexp(1.0, self.emin - self.man) if self.subnormals else self.min_normal

    @property
    def eps(self) -> float:
        """Distance from 1.0 to the next larger value."""
        return math.ldexp(1.0, -self.man)

    @property
    def has_inf(self) -> bool:
        return self.special == Special.IEEE

    @property
    def has_nan(self) -> bool:
        return self.special != Special.NONE

    @property
    def has_negative_zero(self) -> bool:
        return self.special != Special.FNUZ

    @property
    def overflow(self) -> Overflow:
        if self.saturate or self.special == Special.NONE:
            return Overflow.SATURATE
        return Overflow.INF if self.special == Special.IEEE else Overflow.NAN

    @property
    def name(self) -> str:
        suffix = {Special.IEEE: "", Special.FN: "fn", Special.FNUZ: "fnuz", Special.NONE: "none"}[self.special]
        default_bias = 2 ** (self.exp - 1) - 1 + (self.special == Special.FNUZ)
        extra = []
        if self.bias != default_bias:
            extra.append(f"bias={self.bias}")
        if not self.subnormals:
            extra.append("nosub")
        if self.saturate:
            extra.append("sat")
        return f"e{self.exp}m{self.man}{suffix}" + (f"[{','.join(extra)}]" if extra else "")

    def __str__(self) -> str:
        return self.name

    def to_kernel_args(self) -> tuple:
        """Plain values for kernels and custom ops: (kind=0, man, emin, subnormals, max, overflow, negzero)."""
        return (0, self.man, self.emin, int(self.subnormals), self.max, int(self.overflow),
                int(self.has_negative_zero))

    # ---- codes -----------------------------------------------------------------------------------
    @property
    def nan_code(self) -> int | None:
        n = self.bits
        if self.special == Special.IEEE:
            return ((2**self.exp - 1) << self.man) | (1 << max(self.man - 1, 0)) if self.man > 0 else None
        if self.special == Special.FN:
            return (1 << (n - 1)) - 1
        if self.special == Special.FNUZ:
            return 1 << (n - 1)
        return None

    def decode(self, codes) -> np.ndarray:
        """Bit patterns (unsigned ints < 2**bits) -> float64 values."""
        c = np.asarray(codes)
        if not np.issubdtype(c.dtype, np.integer):
            raise TypeError(f"codes must be integers, got dtype {c.dtype}")
        c = c.astype(np.int64)
        if np.any((c < 0) | (c >= 2**self.bits)):
            raise ValueError(f"codes must be in [0, {2**self.bits}) for {self.name}")
        sign = (c >> (self.bits - 1)) & 1
        e = (c >> self.man) & (2**self.exp - 1)
        m = c & (2**self.man - 1)
        mag = np.where(e > 0, np.ldexp(1.0 + m / 2.0**self.man, e - self.bias), np.ldexp(m.astype(np.float64), self.emin - self.man))
        if not self.subnormals:
            mag = np.where((e == 0) & (m != 0), np.nan, mag)  # unused codes
        if self.special == Special.IEEE:
            top = e == 2**self.exp - 1
            mag = np.where(top & (m == 0), np.inf, mag)
            mag = np.where(top & (m != 0), np.nan, mag)
        elif self.special == Special.FN:
            mag = np.where((e == 2**self.exp - 1) & (m == 2**self.man - 1), np.nan, mag)
        elif self.special == Special.FNUZ:
            mag = np.where(c == (1 << (self.bits - 1)), np.nan, mag)
        return np.where(sign == 1, -mag, mag)

    def encode(self, values, rounding: str = "nearest") -> np.ndarray:
        """Values -> bit patterns (int64, unsigned in ``bits`` bits), after rounding with ``rounding``."""
        from .reference import round_float_reference

        v = np.asarray(values, dtype=np.float64)
        q = round_float_reference(v, self, RoundMode.parse(rounding), seed=0)
        sign = np.signbit(q).astype(np.int64)
        a = np.abs(q)
        with np.errstate(divide="ignore", invalid="ignore"):
            safe = np.where(np.isfinite(a) & (a > 0), a, 1.0)
            _, fe = np.frexp(safe)
            e = (fe - 1).astype(np.int64)
            normal = e >= self.emin
            biased = np.where(normal, e + self.bias, 0)
            mant = np.where(normal, np.ldexp(safe, -e) - 1.0, np.ldexp(safe, self.man - self.emin) / 2.0**self.man)
            m = np.rint(mant * 2.0**self.man).astype(np.int64)
        codes = (sign << (self.bits - 1)) | (biased << self.man) | m
        codes = np.where(a == 0, sign << (self.bits - 1), codes)
        if self.special == Special.IEEE:
            codes = np.where(np.isinf(a), (sign << (self.bits - 1)) | ((2**self.exp - 1) << self.man), codes)
        if self.nan_code is not None:
            codes = np.where(np.isnan(q), self.nan_code, codes)
        if self.special == Special.FNUZ:
            codes = np.where(a == 0, 0, codes)
        return codes.astype(np.int64)

    def values(self) -> np.ndarray:
        """Every finite value, sorted ascending, as float64 (one zero, +0). Formats of 16 bits or fewer."""
        if self.bits > 16:
            raise ValueError(f"values() lists formats of at most 16 bits; {self.name} has {self.bits}")
        v = self.decode(np.arange(2**self.bits))
        return np.unique(v[np.isfinite(v)]) + 0.0  # + 0.0: np.unique may keep -0 as the zero


@dataclass(frozen=True)
class FixedFormat:
    """Fixed point: value = integer code * 2**-frac_bits.

    Codes lie in [-2**(bits-1), 2**(bits-1)-1] (signed) or [0, 2**bits-1]. Overflow saturates to the end
    of the range, or with ``saturate=False`` wraps modulo 2**bits as two's-complement hardware does.
    Infinite inputs saturate either way; NaN passes through as NaN (there is no NaN code). Zero is +0.
    bits 1..32; results are exact in float64 and, for float32 tensors, whenever bits <= 24.
    """

    bits: int
    frac_bits: int
    _: KW_ONLY
    signed: bool = True
    saturate: bool = True

    def __post_init__(self):
        _check_int("FixedFormat.bits", self.bits, 1, 32)
        _check_int("FixedFormat.frac_bits", self.frac_bits, -64, 64)
        _check_bool("FixedFormat.signed", self.signed)
        _check_bool("FixedFormat.saturate", self.saturate)

    @property
    def code_min(self) -> int:
        return -(2 ** (self.bits - 1)) if self.signed else 0

    @property
    def code_max(self) -> int:
        return 2 ** (self.bits - 1) - 1 if self.signed else 2**self.bits - 1

    @property
    def max(self) -> float:
        return math.ldexp(self.code_max, -self.frac_bits)

    @property
    def min(self) -> float:
        return math.ldexp(self.code_min, -self.frac_bits)

    @property
    def eps(self) -> float:
        """The step between neighbouring values, 2**-frac_bits."""
        return math.ldexp(1.0, -self.frac_bits)

    min_normal = eps
    min_subnormal = eps

    @property
    def name(self) -> str:
        base = f"{'fixed' if self.signed else 'ufixed'}{self.bits}_{self.frac_bits}"
        return base + ("" if self.saturate else "[wrap]")

    def __str__(self) -> str:
        return self.name

    def to_kernel_args(self) -> tuple:
        """Plain values for kernels and custom ops: (kind=1, frac_bits, code_min, code_max, saturate)."""
        return (1, self.frac_bits, self.code_min, self.code_max, int(self.saturate))

    def decode(self, codes) -> np.ndarray:
        """Bit patterns (unsigned ints < 2**bits, two's complement when signed) -> float64 values."""
        c = np.asarray(codes)
        if not np.issubdtype(c.dtype, np.integer):
            raise TypeError(f"codes must be integers, got dtype {c.dtype}")
        c = c.astype(np.int64)
        if np.any((c < 0) | (c >= 2**self.bits)):
            raise ValueError(f"codes must be in [0, {2**self.bits}) for {self.name}")
        if self.signed:
            c = np.where(c >= 2 ** (self.bits - 1), c - 2**self.bits, c)
        return np.ldexp(c.astype(np.float64), -self.frac_bits)

    def encode(self, values, rounding: str = "nearest") -> np.ndarray:
        """Values -> bit patterns (int64 in [0, 2**bits)), after rounding with ``rounding``."""
        from .reference import round_fixed_reference

        q = round_fixed_reference(np.asarray(values, dtype=np.float64), self, RoundMode.parse(rounding), seed=0)
        if np.any(np.isnan(q)):
            raise ValueError(f"{self.name} has no code for NaN")
        k = np.rint(np.ldexp(q, self.frac_bits)).astype(np.int64)
        return np.where(k < 0, k + 2**self.bits, k)

    def values(self) -> np.ndarray:
        if self.bits > 16:
            raise ValueError(f"values() lists formats of at most 16 bits; {self.name} has {self.bits}")
        return np.ldexp(np.arange(self.code_min, self.code_max + 1, dtype=np.float64), -self.frac_bits)


Format = Union[FloatFormat, FixedFormat]
