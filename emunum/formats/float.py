"""Binary floating point: ``FloatFormat`` (sign, exponent, mantissa; IEEE-style special values)."""
from __future__ import annotations

import enum
import math
from dataclasses import KW_ONLY, dataclass
from typing import Union

import numpy as np
import torch

from ..kernels.abi import FloatArgs
from .base import NumberFormat, Overflow, RoundMode, as_codes, check_bool, check_int, parse_enum
from .exact import round_float_torch

FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_TINY_EXP = -149  # exponent of float32's smallest subnormal


class Special(enum.IntEnum):
    """Where a float format keeps its non-finite values."""

    IEEE = 0  # top exponent holds inf (mantissa 0) and NaN (mantissa != 0)
    FN = 1  # finite; only the all-ones code (both signs) is NaN
    FNUZ = 2  # finite; NaN is the negative-zero code; no -0
    NONE = 3  # every code is a finite number

    @classmethod
    def parse(cls, value: Union[str, "Special"]) -> "Special":
        return parse_enum(cls, value, "special", "a special-value policy")


@dataclass(frozen=True)
class FloatFormat(NumberFormat):
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
        check_int("FloatFormat.exp", self.exp, 1, 8)
        check_int("FloatFormat.man", self.man, 0, 23)
        object.__setattr__(self, "special", Special.parse(self.special))
        check_bool("FloatFormat.subnormals", self.subnormals)
        check_bool("FloatFormat.saturate", self.saturate)
        if self.bias is None:
            object.__setattr__(self, "bias", 2 ** (self.exp - 1) - 1 + (self.special == Special.FNUZ))
        check_int("FloatFormat.bias", self.bias, -512, 512)
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

    def to_kernel_args(self) -> FloatArgs:
        """The kernels' record (``kernels.abi.FloatArgs``)."""
        return FloatArgs(man=self.man, emin=self.emin, subnormals=int(self.subnormals), max=self.max,
                         overflow=int(self.overflow), negzero=int(self.has_negative_zero))

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
        c = as_codes(codes, 2**self.bits, self.name)
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
        v = np.asarray(values, dtype=np.float64)
        q = round_float_torch(torch.from_numpy(v.copy()), self, RoundMode.parse(rounding), seed=0).numpy()
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
