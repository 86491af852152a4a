"""Codebooks: ``TableFormat``, any finite, strictly increasing set of at most 2**16 values (NF4, AF4, ...).

Sources of the presets (the constants exactly as bitsandbytes stores them, as float32):
- ``nf4``: NormalFloat-4, Dettmers et al., "QLoRA: Efficient Finetuning of Quantized LLMs" (NeurIPS 2023,
  arXiv:2305.14314), appendix E; the 16 values of bitsandbytes ``functional.get_4bit_type("nf4")``.
- ``af4``: AbnormalFloat-4 for blocks of 64, Yoshida, "NF4 Isn't Information Theoretically Optimal (and
  that's Good)" (arXiv:2306.06965); bitsandbytes ``get_4bit_type("af4", blocksize=64)``.
- ``fp4_bnb``: bitsandbytes' FP4 (``get_4bit_type("fp4")``: 0, 0.0625, 2, 3, 4, 6, 8, 12 and their
  negatives, divided by 12 in float32). Its codes +0 and -0 are one value here, so the set has 15 values.
Codes of a TableFormat are indices into the sorted values (NF4: bitsandbytes' own codes; AF4 and FP4 order
theirs differently).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from ..kernels.abi import TableArgs
from .base import NumberFormat, RoundMode, as_codes

MAX_VALUES = 1 << 16


@dataclass(frozen=True)
class TableFormat(NumberFormat):
    """A codebook: the values ``values`` (finite, strictly increasing, 2..65536 of them), code i = values[i].

    Rounding of x (in float64; float32/float16/bfloat16 inputs are exact there) to its neighbours
    lo = values[i] <= x < hi = values[i+1]:
    - nearest: the closer one; an exact midpoint (compared exactly) goes to the neighbour with the EVEN code
      index i or i+1. nearest_away: a midpoint goes to the neighbour of larger magnitude (x's sign decides
      when both have the same magnitude).
    - up: hi; down: lo; toward_zero: down for x >= 0, up for x < 0; odd: the neighbour with the odd index.
    - stochastic: hi with probability (x - lo) / (hi - lo) (computed in float64, quantised to ``sr_bits``
      bits as for the other formats), else lo.
    - Out of range: x below values[0] or above values[-1] (infinities too) saturates to that end, in every
      mode. NaN stays NaN. A value in the table comes back unchanged (-0.0 as +0.0 if 0.0 is the value),
      in a float32 tensor also its float32 rounding (so rounding a float32 tensor twice changes nothing).
    The result is the float64 table value, cast to x's dtype (nearest-even: exact when the table values are
    representable there, as the float32 presets are).
    """

    values_: tuple
    name_: str | None = None
    _hash: int = field(init=False, repr=False, compare=False)

    def __init__(self, values, name: str | None = None):
        object.__setattr__(self, "values_", _checked_values(values))
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise TypeError(f"TableFormat.name must be a non-empty str or None, got {name!r}")
        object.__setattr__(self, "name_", name)
        object.__setattr__(self, "_hash", hash(("TableFormat", self.values_, name)))
        _midpoints(self.values_)  # raises for tables whose midpoints are not exact in float64 pairs

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        return (TableFormat, (self.values_, self.name_))  # rebuilt, so the cached hash is this process's

    @property
    def n(self) -> int:
        return len(self.values_)

    @property
    def bits(self) -> int:
        """Bits per code: ceil(log2(number of values))."""
        return max(1, (self.n - 1).bit_length())

    @property
    def name(self) -> str:
        return self.name_ if self.name_ is not None else f"table{self.n}[{self.values_[0]:g}..{self.values_[-1]:g}]"

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        if self.name_ is not None:
            return f"TableFormat(<{self.n} values>, name={self.name_!r})"
        return f"TableFormat({list(self.values_)!r})" if self.n <= 16 else f"TableFormat(<{self.n} values>)"

    @property
    def max(self) -> float:
        return self.values_[-1]

    @property
    def min(self) -> float:
        return self.values_[0]

    def values(self) -> np.ndarray:
        return np.array(self.values_, dtype=np.float64)

    def to_kernel_args(self) -> TableArgs:
        """``kernels.abi.TableArgs``: table = float64 [values (n), midpoint high parts (n-1), low parts (n-1)],
        each midpoint (values[i] + values[i+1]) / 2 being exactly high + low."""
        return TableArgs(n=self.n, table=kernel_table(self))

    def decode(self, codes) -> np.ndarray:
        return self.values()[as_codes(codes, self.n, self.name)]

    def encode(self, values, rounding: str = "nearest") -> np.ndarray:
        """Values -> codes (indices into the sorted values, int64), rounded as the class docstring says
        (a numpy implementation; stochastic rounding draws the bits of seed 0). NaN has no code."""
        mode = RoundMode.parse(rounding)
        v = np.array(values, dtype=np.float64)
        if np.any(np.isnan(v)):
            raise ValueError(f"{self.name} has no code for NaN")
        q = round_table_np(self, v.reshape(-1), mode).reshape(v.shape)
        return np.searchsorted(self.values(), q).astype(np.int64)


def stochastic_up_np(p: np.ndarray, rnd: np.ndarray, nbits: int = 32) -> np.ndarray:
    """The kernels' stochastic decision (kernels/scalar/table.py ``stochastic_up``), vectorised."""
    d = p * 2.0**nbits
    f = np.floor(d)
    dd = d - f
    f = f + ((dd > 0.5) | ((dd == 0.5) & (np.fmod(f, 2.0) == 1.0)))
    return f + rnd.astype(np.float64) >= 2.0**nbits


def seed0_bits(n: int) -> np.ndarray:
    from ..rng import random_bits_reference, seed_key
    return random_bits_reference(seed_key(0), n, 32)


def round_table_np(fmt: "TableFormat", x: np.ndarray, mode: RoundMode) -> np.ndarray:
    """Flat float64 x rounded to ``fmt`` (float64 values), numpy; the same decisions as the kernel core."""
    v = fmt.values()
    n = len(v)
    hi_m, lo_m = (np.array(a) for a in _midpoints(fmt.values_))
    with np.errstate(invalid="ignore"):
        i = np.clip(np.searchsorted(v, x, side="right") - 1, 0, n - 2)
        a, b = v[i], v[i + 1]
        c = x - hi_m[i]
        low = lo_m[i]
        odd_lo = (i % 2) == 1
        if mode == RoundMode.NEAREST:
            up = (c > low) | ((c == low) & odd_lo)
        elif mode == RoundMode.NEAREST_AWAY:
            larger = (np.abs(b) > np.abs(a)) | ((np.abs(b) == np.abs(a)) & ~np.signbit(x))
            up = (c > low) | ((c == low) & larger)
        elif mode == RoundMode.TOWARD_ZERO:
            up = x < 0
        elif mode == RoundMode.UP:
            up = np.ones(x.shape, bool)
        elif mode == RoundMode.DOWN:
            up = np.zeros(x.shape, bool)
        elif mode == RoundMode.ODD:
            up = ~odd_lo
        else:
            up = stochastic_up_np((x - a) / (b - a), seed0_bits(x.size))
        q = np.where(x == a, a, np.where(up, b, a))
        q = np.where(x <= v[0], v[0], np.where(x >= v[-1], v[-1], q))
    return np.where(np.isnan(x), np.nan, q)


def _checked_values(values) -> tuple:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(f"TableFormat.values must be a sequence of floats, got {type(values).__name__}")
    try:
        a = np.asarray(values, dtype=np.float64)
    except OverflowError:  # a Python int beyond float64 (2**1024): name it rather than numpy's bare message
        big = next((i for i, v in enumerate(values) if isinstance(v, int) and abs(v) >= 2**1024), None)
        where = f"values[{big}]=2**{abs(values[big]).bit_length() - 1}..." if big is not None else "a value"
        raise ValueError(f"TableFormat: {where} is beyond the float64 range (max {float(np.finfo(np.float64).max)!r}); "
                         "all values must be finite float64 numbers") from None
    except (TypeError, ValueError):
        raise TypeError(f"TableFormat.values must be a sequence of real numbers, got {values!r}") from None
    if a.ndim != 1:
        raise ValueError(f"TableFormat.values must be 1-D, got shape {a.shape}")
    if not 2 <= a.size <= MAX_VALUES:
        raise ValueError(f"TableFormat.values has {a.size} values; allowed: 2..{MAX_VALUES}")
    bad = np.flatnonzero(~np.isfinite(a))
    if bad.size:
        raise ValueError(f"TableFormat.values[{bad[0]}]={a[bad[0]]} is not finite; all values must be finite")
    step = np.flatnonzero(~(a[1:] > a[:-1]))
    if step.size:
        i = int(step[0]) + 1
        what = "a duplicate of" if a[i] == a[i - 1] else "smaller than"
        raise ValueError(f"TableFormat.values must be strictly increasing: values[{i}]={float(a[i])!r} is {what} "
                         f"values[{i - 1}]={float(a[i - 1])!r}")
    return tuple(0.0 if x == 0.0 else float(x) for x in a)  # -0.0 and 0.0 are one value: store +0.0


_KERNEL_TABLES: dict = {}


def _midpoints(v: tuple):
    hi, lo = [], []
    for i in range(len(v) - 1):
        m = (Fraction(v[i]) + Fraction(v[i + 1])) / 2
        h = float(m)
        r = m - Fraction(h)
        if Fraction(float(r)) != r:
            raise ValueError(f"TableFormat.values[{i}]={v[i]!r}, values[{i + 1}]={v[i + 1]!r}: their midpoint is "
                             "not a sum of two float64 numbers (values too deep in the subnormal range)")
        hi.append(h)
        lo.append(float(r))
    return hi, lo


def kernel_table(fmt: TableFormat) -> np.ndarray:
    """The float64 array the kernels search (see ``to_kernel_args``), built once per format."""
    t = _KERNEL_TABLES.get(fmt)
    if t is None:
        hi, lo = _midpoints(fmt.values_)
        t = np.array(list(fmt.values_) + hi + lo, dtype=np.float64)
        t.setflags(write=False)
        if len(_KERNEL_TABLES) > 256:
            _KERNEL_TABLES.clear()
        _KERNEL_TABLES[fmt] = t
    return t


def _f32(values) -> tuple:
    return tuple(float(np.float32(x)) for x in values)


NF4_VALUES = _f32([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                   -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                   0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                   0.7229568362236023, 1.0])
AF4_VALUES = _f32([-1.0, -0.69441008, -0.51243739, -0.3736951, -0.25607552, -0.14982478, -0.04934812, 0.0,
                   0.04273164, 0.12934483, 0.21961274, 0.31675666, 0.42563882, 0.55496234, 0.72424863, 1.0])
FP4_BNB_VALUES = tuple(sorted({float(np.float32(x) / np.float32(12.0))
                               for x in (0, 0.0625, 8, 12, 4, 6, 2, 3, -0.0625, -8, -12, -4, -6, -2, -3)}))

TABLE_PRESETS: dict[str, TableFormat] = {
    "nf4": TableFormat(NF4_VALUES, name="nf4"),
    "af4": TableFormat(AF4_VALUES, name="af4"),
    "fp4_bnb": TableFormat(FP4_BNB_VALUES, name="fp4_bnb"),
}
