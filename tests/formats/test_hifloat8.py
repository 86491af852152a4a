"""HiFloat8 against two oracles, zero tolerance:

- Huawei's ``en_dtypes`` 0.0.4 (``en_dtypes.hifloat8``, an ml_dtypes fork): every code's value, and its float32 ->
  hifloat8 cast (round to nearest, ties away) of every value, every midpoint between neighbours, the float32
  numbers just below and above each, the overflow thresholds, the denormal range, +-0, +-inf and NaN.
- The paper's definition, transcribed here from its field layout (Luo et al., "Ascend HiFloat8 Format for Deep
  Learning", arXiv:2409.16626, https://arxiv.org/abs/2409.16626; also the Wikipedia draft "Draft:HiFloat8"): the
  dot-field prefix codes, the sign-magnitude exponent with an implicit leading 1, the denormal mode 2**(M-23);
  rounding chosen among the neighbours by exact rational arithmetic (``fractions``) in every emunum mode, as
  ``HiFloat8Format``'s docstring defines them, on float32 and float64 inputs (float64 near midpoints too).
Stochastic rounding: only the two neighbours come out, and the mean is x within a statistical bound.
"""
from __future__ import annotations

import bisect
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import emunum
from emunum import HiFloat8Format
from emunum.formats import RoundMode

en_dtypes = pytest.importorskip("en_dtypes")

MODES = [m.name.lower() for m in RoundMode if m != RoundMode.STOCHASTIC]
FMT = HiFloat8Format()
SAT = HiFloat8Format(saturate=True)

# ---- the paper's definition, transcribed ------------------------------------------------------------------
# Dot field (prefix code) -> D, the stored exponent width; the mantissa takes the bits that are left of 7.
DOT = (("11", 4), ("10", 3), ("01", 2), ("001", 1), ("0001", 0))
DENORMAL_DOT = "0000"


def paper_value(code: int):
    """The value of an 8-bit code: a Fraction, or math.inf / -math.inf / math.nan for the special codes."""
    sign = -1 if code >> 7 else 1
    bits = format(code & 0x7F, "07b")
    if code == 0b1_0000_000:
        return math.nan  # the would-be -0
    if bits == "1101111":
        return sign * math.inf  # the would-be 1.5 * 2**15
    for prefix, d in DOT:
        if bits.startswith(prefix):
            rest = bits[len(prefix):]
            ebits, mbits = rest[:d], rest[d:]
            exp = 0 if d == 0 else (-1 if ebits[0] == "1" else 1) * int("1" + ebits[1:], 2)
            frac = Fraction(int(mbits, 2), 2 ** len(mbits))
            return sign * (1 + frac) * Fraction(2) ** exp
    assert bits.startswith(DENORMAL_DOT)
    m = int(bits[4:], 2)
    return Fraction(0) if m == 0 else sign * Fraction(2) ** (m - 23)


CODES = {c: paper_value(c) for c in range(256)}
FINITE = {c: v for c, v in CODES.items() if isinstance(v, Fraction)}
POS = sorted({v for v in FINITE.values() if v >= 0})  # 0 and the 126 positive values
CODE_OF = {v: c for c, v in FINITE.items() if v >= 0}
MAX = POS[-1]
BEYOND = Fraction(3, 2) * MAX  # where code 0x6F would be: the grid point past max (rounds to inf)
GRID = POS + [BEYOND]


def _odd(v: Fraction) -> bool:
    return v == BEYOND or CODE_OF[v] & 1 == 1  # 0x6F is odd


def definition(x: float, mode: str, saturate: bool = False) -> float:
    """x rounded to HiF8 by its neighbours on the grid (exact rationals), then overflow and sign rules."""
    if math.isnan(x):
        return math.nan
    neg = math.copysign(1.0, x) < 0
    if math.isinf(x):
        r = float(MAX) if saturate else math.inf
        return -r if neg else r
    a = abs(Fraction(x))
    i = bisect.bisect_right(GRID, a) - 1
    lo = GRID[i]
    hi = GRID[i + 1] if i + 1 < len(GRID) else None  # None: beyond the grid
    if a == lo:
        q = lo
    elif hi is None:
        q = None
    elif mode in ("nearest", "nearest_away"):
        q = hi if a - lo >= hi - a else lo
    elif mode == "toward_zero":
        q = lo
    elif mode == "up":
        q = lo if neg else hi
    elif mode == "down":
        q = hi if neg else lo
    elif mode == "odd":
        q = lo if _odd(lo) else hi
    else:
        raise ValueError(mode)
    if q is None or q > MAX:
        toward_zero = mode in ("toward_zero", "odd") or (mode == "up" and neg) or (mode == "down" and not neg)
        r = float(MAX) if (saturate or toward_zero) else math.inf
    else:
        r = float(q)
    if r == 0:
        return 0.0
    return -r if neg else r


def probes32() -> np.ndarray:
    """float32: every value, every midpoint of neighbours (0 and 2**-22, max and the grid point past it), the
    float32 numbers just below and above each, overflow and underflow thresholds, +-0, +-inf, NaN."""
    pts = [Fraction(v) for v in GRID] + [(a + b) / 2 for a, b in zip(GRID, GRID[1:])]
    pts += [Fraction(40960), Fraction(49152), Fraction(65536), Fraction(10**9), Fraction(1, 2**23), Fraction(1, 2**24),
            Fraction(3, 2**25), Fraction(1, 2**40)]
    x = np.array([float(p) for p in pts], dtype=np.float32)
    x = np.concatenate([x, np.nextafter(x, np.float32(np.inf)), np.nextafter(x, np.float32(0))])
    x = np.concatenate([x, -x, np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45, 3e38], np.float32)])
    return np.unique(x)


def probes64() -> np.ndarray:
    """float64: the float32 probes, and points within 2**-40 (relative) of every midpoint, where a rounding
    through float32 would land on the midpoint itself."""
    mids = np.array([float((a + b) / 2) for a, b in zip(GRID, GRID[1:])])
    near = np.concatenate([mids * (1 + 2.0**-40), mids * (1 - 2.0**-40)])
    x = np.concatenate([probes32().astype(np.float64), near, -near])
    return x


def en_round(x: np.ndarray) -> np.ndarray:
    return x.astype(en_dtypes.hifloat8)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal values with equal zero signs, NaN where NaN."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return bool(np.array_equal(a, b, equal_nan=True) and np.array_equal(np.signbit(a) & (a == 0),
                                                                           np.signbit(b) & (b == 0)))


# ---- codes ------------------------------------------------------------------------------------------------
def test_every_code_decodes_as_en_dtypes_does():
    want = np.arange(256, dtype=np.uint8).view(en_dtypes.hifloat8).astype(np.float64)
    assert same(FMT.decode(np.arange(256)), want)


def test_every_code_decodes_as_the_papers_field_definition():
    got = FMT.decode(np.arange(256))
    want = np.array([float(v) for v in CODES.values()])
    assert same(got, want)
    assert np.flatnonzero(np.isnan(got)).tolist() == [0x80]


def test_values_are_the_definitions_finite_values_and_max_is_two_to_the_15():
    want = sorted(float(v) for v in FINITE.values())
    assert FMT.values().tolist() == want
    assert FMT.max == float(MAX) == 2.0**15 and FMT.min == -FMT.max and FMT.min_subnormal == float(POS[1])


@pytest.mark.parametrize("fmt", [FMT, SAT], ids=str)
def test_encode_of_every_value_gives_its_code(fmt):
    codes = np.array(sorted(FINITE))
    assert np.array_equal(fmt.encode(fmt.decode(codes)), codes)
    assert fmt.encode([np.nan]).tolist() == [0x80] and fmt.encode([-0.0]).tolist() == [0]


# ---- nearest (ties away) against en_dtypes ----------------------------------------------------------------
def test_quantize_nearest_float32_matches_en_dtypes_bit_for_bit():
    x = probes32()
    want = en_round(x).astype(np.float32)
    got = emunum.quantize(torch.from_numpy(x), "hifloat8").numpy()
    assert same(got, want)
    assert np.array_equal(got.view(np.uint32)[~np.isnan(got)], want.view(np.uint32)[~np.isnan(want)])


def test_encode_nearest_matches_en_dtypes_codes():
    x = probes32()
    assert np.array_equal(FMT.encode(x), en_round(x).view(np.uint8).astype(np.int64))


def test_quantize_nearest_matches_en_dtypes_on_random_float32_bit_patterns():
    u = np.random.default_rng(0).integers(0, 2**32, 1 << 18, dtype=np.uint64).astype(np.uint32)
    x = u.view(np.float32)
    with np.errstate(invalid="ignore"):  # signalling NaN patterns
        want = en_round(x).astype(np.float32)
    assert same(emunum.quantize(torch.from_numpy(x.copy()), "hifloat8").numpy(), want)


def test_float16_input_matches_en_dtypes():
    x = probes32()
    x16 = x[np.abs(x) < 65504].astype(np.float16)
    got = emunum.quantize(torch.from_numpy(x16), "hifloat8").numpy()
    assert same(got, en_round(x16).astype(np.float16))


@pytest.mark.parametrize("x, want", [(40959.996, 32768.0), (40960.0, math.inf), (1e9, math.inf),
                                     (2.0**-23, 2.0**-22), (0.99 * 2.0**-23, 0.0), (1.0625, 1.125)])
def test_overflow_and_underflow_thresholds(x, want):
    """The nearest thresholds (the midpoints of 32768 and 49152, of 0 and 2**-22; ties away), from both oracles."""
    x32 = np.float32(x)
    assert float(en_round(np.array([x32]))[0]) == want == definition(float(x32), "nearest")
    assert emunum.quantize(torch.tensor([float(x32)]), "hifloat8").item() == want


# ---- every mode against the definition --------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("fmt", [FMT, SAT], ids=str)
@pytest.mark.parametrize("mode", MODES)
def test_every_mode_matches_the_definition(mode, fmt, dtype):
    x = probes32().astype(np.float64) if dtype == torch.float32 else probes64()
    want = np.array([definition(v, mode, fmt.saturate) for v in x])
    got = emunum.quantize(torch.from_numpy(x).to(dtype), fmt, mode).double().numpy()
    assert same(got, want)
    assert same(fmt.decode(fmt.encode(x, mode)), want)


def test_float64_rounds_once_where_en_dtypes_rounds_through_float32():
    """Just below the midpoint of 1 and 1.125: float64 rounds down; en_dtypes' float32 step lands on the
    midpoint and goes up (documented in HiFloat8Format)."""
    x = np.array([1.0625 - 2.0**-40])
    assert emunum.quantize(torch.from_numpy(x), FMT).item() == definition(x[0], "nearest") == 1.0
    assert float(en_round(x)[0]) == 1.125


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mode", MODES)
def test_16bit_dtypes_round_their_exact_float32_values(mode, dtype):
    x = torch.from_numpy(probes32()).to(dtype)
    want = emunum.quantize(x.float(), FMT, mode)
    assert same(want.to(dtype).float().numpy(), want.numpy())  # every HiF8 value is exact in 16 bits
    assert same(emunum.quantize(x, FMT, mode).float().numpy(), want.numpy())


# ---- stochastic -------------------------------------------------------------------------------------------
STOCH_X = [1.0 + 1 / 32, 3.3, -0.3, 100.7, 3000.0, -20000.0, 2.0**-16 * 1.3, 2.0**-22 * 0.3, 1.7 * 2.0**-20, 32000.0]


@pytest.mark.parametrize("x", STOCH_X)
def test_stochastic_is_unbiased_and_gives_only_the_neighbours(x):
    """n draws (one per element index) of x: each is lo or hi (the definition's neighbours), and the mean is x
    within 6 standard deviations of a mean of n Bernoulli(p) choices, p = (|x| - lo) / (hi - lo)."""
    n = 1 << 16
    lo, hi = definition(x, "toward_zero"), definition(x, "up" if x > 0 else "down")
    q = emunum.quantize(torch.full((n,), x, dtype=torch.float64), FMT, "stochastic", seed=3).numpy()
    assert set(np.unique(q)) <= {lo, hi} and lo != hi
    p = (x - lo) / (hi - lo)
    sd = abs(hi - lo) * math.sqrt(p * (1 - p) / n)
    assert abs(q.mean() - x) <= 6 * sd
    assert len(set(np.unique(q))) == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_stochastic_kernel_equals_encode_with_seed_0(dtype):
    x = probes64() if dtype == torch.float64 else probes32().astype(np.float64)
    got = emunum.quantize(torch.from_numpy(x).to(dtype), FMT, "stochastic", seed=0).double().numpy()
    assert same(got, FMT.decode(FMT.encode(x, "stochastic")))


def test_stochastic_overflow_past_max_is_inf_or_max():
    q = emunum.quantize(torch.full((4096,), 40000.0), FMT, "stochastic", seed=1)
    assert set(q.tolist()) == {32768.0, math.inf}
    qs = emunum.quantize(torch.full((4096,), 40000.0), SAT, "stochastic", seed=1)
    assert set(qs.tolist()) == {32768.0}


# ---- names and bad input ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name, fmt", [("hifloat8", FMT), ("HiF8", FMT), ("hifloat8_sat", SAT), ("hif8_sat", SAT)])
def test_names(name, fmt):
    assert emunum.get_format(name) == fmt and emunum.get_format(fmt.name) == fmt


def test_bad_input_raises_named_errors():
    with pytest.raises(TypeError, match="HiFloat8Format.saturate must be a bool, got 1"):
        HiFloat8Format(saturate=1)
    with pytest.raises(ValueError, match=r"codes must be in \[0, 256\) for hifloat8"):
        FMT.decode([256])
    with pytest.raises(TypeError, match="codes must be integers"):
        FMT.decode([1.0])
    with pytest.raises(ValueError, match="hifloat8\\[_sat\\]"):
        emunum.get_format("hifloat9")
    with pytest.raises(ValueError, match="rounding='even' is not a rounding mode"):
        FMT.encode([1.0], "even")
