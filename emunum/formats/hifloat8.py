"""HiFloat8 (HiF8): ``HiFloat8Format(*, saturate=False)``, names ``hifloat8`` / ``hif8`` (``hifloat8_sat``).

Source: Luo et al., "Ascend HiFloat8 Format for Deep Learning", arXiv:2409.16626 (2024), as Huawei's
``en_dtypes`` 0.0.4 implements it (``en_dtypes.hifloat8``, which the tests compare against bit for bit).

Codes. Bit 7 is the sign; the rest is a prefix-coded *dot* field, then the exponent, then the mantissa. The
dot field gives the exponent's stored width D and so the mantissa's width:
- ``11`` D=4 (4 exponent bits, 1 mantissa bit), ``10`` D=3 (3, 2), ``01`` D=2 (2, 3), ``001`` D=1 (1, 3),
  ``0001`` D=0 (0, 3): the value is 2**E * 1.M with E in sign-magnitude: the exponent field's first bit is
  E's sign and the other D-1 bits follow an implicit leading 1 of |E| (so |E| = 2**(D-1) .. 2**D - 1; D=0: E=0).
- ``0000`` denormal: the 3 mantissa bits M give 2**(M-23) (2**-22 .. 2**-16); M=0 is zero.
- ``0x00`` is the only zero (no -0); ``0x80`` (the would-be -0) is the only NaN; ``0x6F`` / ``0xEF`` (the
  would-be +-1.5 * 2**15) are +-inf. Largest finite value 2**15 = 32768; smallest 2**-22.
So a value whose binade is e (2**e <= |v| < 2**(e+1)) has ``mantissa_bits(e)`` = 3 for |e| <= 3, 2 for
4 <= |e| <= 7, 1 for 8 <= |e| <= 15 and 0 in the denormal binades -22 .. -16.

Rounding: see ``HiFloat8Format``.
The kernels (``kernels/scalar/hifloat8.py``) are the float cores with the exponent-dependent mantissa width.
"""
from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass

import numpy as np

from ..kernels.abi import HiF8Args
from .base import NumberFormat, Overflow, RoundMode, as_codes, check_bool

EMIN = -22  # the smallest binade (2**-22, the smallest nonzero value)
EMAX = 15  # the largest binade with a finite value (2**15 = max)
NAN_CODE = 0x80
INF_CODE = 0x6F


def mantissa_bits(e: int) -> int:
    """Fraction bits of the values in binade e (2**e <= |v| < 2**(e+1)); 0 outside -15..15."""
    a = abs(int(e))
    return int(a <= 3) + int(a <= 7) + int(a <= 15)


def _magnitude(c: int) -> float:
    """The magnitude of code c in [0, 128) (module docstring), inf for INF_CODE."""
    if c == INF_CODE:
        return math.inf
    if c >> 5 in (1, 2, 3):  # dot 01 / 10 / 11: D = 2, 3, 4
        d = (c >> 5) + 1
        man = 5 - d  # 5 bits follow a 2-bit dot field
        field = (c >> man) & ((1 << d) - 1)
        neg, mag = field >> (d - 1), (field & ((1 << (d - 1)) - 1)) | (1 << (d - 1))
    elif c >> 4 == 1:  # dot 001: D = 1
        man, neg, mag = 3, (c >> 3) & 1, 1
    elif c >> 3 == 1:  # dot 0001: D = 0
        man, neg, mag = 3, 0, 0
    else:  # dot 0000: denormal
        return 0.0 if c == 0 else math.ldexp(1.0, c - 23)
    f = c & ((1 << man) - 1)
    return math.ldexp(1.0 + f / (1 << man), -mag if neg else mag)


def _value_table() -> np.ndarray:
    mags = np.array([_magnitude(c) for c in range(128)], dtype=np.float64)
    t = np.concatenate([mags, -mags])
    t[NAN_CODE] = np.nan
    t.setflags(write=False)
    return t


_TABLE = _value_table()
_FINITE = np.flatnonzero(np.isfinite(_TABLE))
_ORDER = _FINITE[np.argsort(_TABLE[_FINITE], kind="stable")]  # codes of the finite values, ascending (0x00 once)


@dataclass(frozen=True)
class HiFloat8Format(NumberFormat):
    """HiFloat8 (codes in the module docstring): 8 bits, tapered precision, max 32768, smallest 2**-22, +-inf,
    one NaN. ``saturate``: overflow (and +-inf inputs) to +-32768 in every mode instead of +-inf.

    Rounding x (float32 and float64 from their own value; float16/bfloat16 through float32, exact), for x in the
    binade e, among the values of that binade and 2**(e+1), i.e. as a float with mantissa_bits(e) fraction bits
    (below 2**-22: the multiples of 2**-22, namely 0 and 2**-22):
    - ``nearest``: to nearest, ties away from zero: the paper's TA, and the only rounding ``en_dtypes`` does
      (its ``RoundBitsHalfToAway``). HiF8 defines no ties-to-even, so ``nearest_away`` is the same rounding.
      Midpoints are arithmetic: 15.5 (between 15 and 16) goes to 16, 1.5 * 2**-17 to 2**-16, 2**-23 to 2**-22.
    - ``toward_zero``, ``up``, ``down``: the neighbour in that direction. ``odd``: toward zero, then, when x is
      not a value, the neighbour whose *code* is odd (its last mantissa bit; in the denormal binades M's parity,
      and 2**-22 (code 1) rather than 0 below 2**-22): rounding to odd at 53 bits, then to HiF8, equals rounding
      once (the MAD units rely on it).
    - ``stochastic``: to the upper neighbour with probability (|x| - lo) / (hi - lo), quantised to ``sr_bits``
      bits as for every float format (``FloatFormat``): unbiased for |x| <= max.
    - Overflow (a rounded magnitude above 32768): ``nearest``, ``nearest_away``, ``stochastic``, and ``up`` /
      ``down`` away from zero -> +-inf, as en_dtypes (so |x| >= 40960, the midpoint of 32768 and 1.5 * 2**15,
      is inf in nearest; en_dtypes' own threshold test at 49152 is reached only after its rounding); ``toward_zero``,
      ``odd`` and ``up`` / ``down`` toward zero -> +-32768. With ``saturate=True`` every mode gives +-32768, for
      +-inf inputs too (``en_dtypes``' unexposed ``kSaturate`` keeps inf inputs infinite; emunum follows its own
      ``FloatFormat(saturate=True)``).
    - A zero result is +0 (-0 and negative underflow included); NaN in -> NaN out (the input NaN, quietened).
    ``en_dtypes`` rounds float64 (and float16/bfloat16) through float32 first, so a float64 input within one float32
    rounding of a midpoint can differ there; emunum rounds float64 once (tests check both against the definition).
    The paper's hybrid rounding (HR) is not offered: en_dtypes implements none, so there is no reference to test
    it against; ``stochastic`` is plain stochastic rounding.
    """

    _: KW_ONLY
    saturate: bool = False

    def __post_init__(self):
        check_bool("HiFloat8Format.saturate", self.saturate)

    @property
    def bits(self) -> int:
        return 8

    @property
    def name(self) -> str:
        return "hifloat8_sat" if self.saturate else "hifloat8"

    def __str__(self) -> str:
        return self.name

    @property
    def max(self) -> float:
        return math.ldexp(1.0, EMAX)

    @property
    def min(self) -> float:
        """The smallest finite value, -max."""
        return -self.max

    @property
    def min_subnormal(self) -> float:
        """The smallest positive value, 2**-22 (a denormal code)."""
        return math.ldexp(1.0, EMIN)

    @property
    def min_normal(self) -> float:
        """The smallest value of a normal (dot-coded) code, 2**-15."""
        return math.ldexp(1.0, -EMAX)

    @property
    def eps(self) -> float:
        """The distance from 1 to the next value (3 mantissa bits there)."""
        return 0.125

    @property
    def has_inf(self) -> bool:
        return True

    @property
    def has_nan(self) -> bool:
        return True

    @property
    def has_negative_zero(self) -> bool:
        return False

    @property
    def nan_code(self) -> int:
        return NAN_CODE

    @property
    def overflow(self) -> Overflow:
        return Overflow.SATURATE if self.saturate else Overflow.INF

    def to_kernel_args(self) -> HiF8Args:
        """``kernels.abi.HiF8Args``: the overflow code (inf or saturate); the rest is fixed by the format."""
        return HiF8Args(overflow=int(self.overflow))

    # ---- codes -------------------------------------------------------------------------------------------
    def decode(self, codes) -> np.ndarray:
        """Codes (ints in [0, 256)) -> float64 values (NaN for 0x80, +-inf for 0x6F / 0xEF)."""
        return _TABLE[as_codes(codes, 256, self.name)]

    def encode(self, values, rounding: str = "nearest") -> np.ndarray:
        """Values -> codes (int64) after rounding with ``rounding`` (module docstring; stochastic: the bits of
        seed 0, 32 of them). NaN -> 0x80; a zero result -> 0x00."""
        q = round_hifloat8_np(np.asarray(values, dtype=np.float64), self, RoundMode.parse(rounding))
        fin = np.where(np.isfinite(q), q, 0.0)
        codes = _ORDER[np.searchsorted(_TABLE[_ORDER], fin)]
        codes = np.where(np.isinf(q), np.where(q > 0, INF_CODE, INF_CODE | 0x80), codes)
        return np.where(np.isnan(q), NAN_CODE, codes).astype(np.int64)

    def values(self) -> np.ndarray:
        """Every finite value (253: one zero, no NaN or inf), sorted ascending, as float64."""
        return _TABLE[_ORDER].copy()


def round_hifloat8_np(x: np.ndarray, fmt: HiFloat8Format, mode: RoundMode, sr_bits: int = 32) -> np.ndarray:
    """x (float64, any shape) rounded to HiF8 in exact float64 numpy arithmetic (float64 out): the scaled
    magnitude t = |x| / quantum of x's binade (a power of two: exact), its floor and remainder, the module
    docstring's decision per mode. Stochastic rounding draws the bits of seed 0 (``rng``)."""
    x = np.asarray(x, dtype=np.float64)
    flat = x.reshape(-1)
    a = np.abs(flat)
    neg = np.signbit(flat)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        _, e2 = np.frexp(np.where(np.isfinite(a) & (a > 0), a, 1.0))
        e = e2.astype(np.int64) - 1  # the binade: 2**e <= a < 2**(e+1)
        man = (np.abs(e) <= 3).astype(np.int64) + (np.abs(e) <= 7) + (np.abs(e) <= 15)
        qe = np.maximum(e, EMIN) - man
        t = np.ldexp(a, -qe)
        k = np.floor(t)
        r = t - k
        odd = _code_is_odd(k, qe)
        if mode in (RoundMode.NEAREST, RoundMode.NEAREST_AWAY):
            up = r >= 0.5
        elif mode == RoundMode.TOWARD_ZERO:
            up = np.zeros(a.shape, bool)
        elif mode == RoundMode.UP:
            up = (r > 0) & ~neg
        elif mode == RoundMode.DOWN:
            up = (r > 0) & neg
        elif mode == RoundMode.ODD:
            up = (r > 0) & ~odd
        else:
            from ..rng import random_bits_reference, seed_key
            rnd = random_bits_reference(seed_key(0), a.size, sr_bits).astype(np.float64)
            up = np.round(r * 2.0**sr_bits) + rnd >= 2.0**sr_bits  # np.round: ties to even
        mag = np.ldexp(k + up, qe)
        to_max = fmt.saturate | (mode in (RoundMode.TOWARD_ZERO, RoundMode.ODD)) | (
            (mode == RoundMode.UP) & neg) | ((mode == RoundMode.DOWN) & ~neg)
        big = np.where(to_max, fmt.max, np.inf)
        mag = np.where(mag > fmt.max, big, mag)
        mag = np.where(np.isinf(a), fmt.max if fmt.saturate else np.inf, mag)
    out = np.where(mag == 0, 0.0, np.where(neg, -mag, mag))
    return np.where(np.isnan(flat), np.nan, out).reshape(x.shape)


def _code_is_odd(k: np.ndarray, qe: np.ndarray) -> np.ndarray:
    """Whether the code of the lower neighbour k * 2**qe is odd: its last mantissa bit, or for a power of two
    in a binade without mantissa bits (denormal codes M = e + 23, and 2**-22 = code 1) M's parity; 0 is even."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        v = np.ldexp(k, qe)
        _, e2 = np.frexp(np.where(v > 0, v, 1.0))
        e = e2.astype(np.int64) - 1
        man = (np.abs(e) <= 3).astype(np.int64) + (np.abs(e) <= 7) + (np.abs(e) <= 15)
        last = np.ldexp(v, man - e)  # 2**man * 1.f, an integer: its parity is the code's last bit
        odd_normal = np.fmod(last, 2.0) == 1.0
        odd_denormal = ((e + 23) % 2) == 1
    return (v > 0) & np.where(man > 0, odd_normal, odd_denormal)
