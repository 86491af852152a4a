"""Outside oracles for posits (tests/formats/test_posit.py, tests/kernels/test_posit_kernels.py).

- SoftPosit (the reference C library of the Posit Standard's authors): round to nearest and decode.
  ``softposit.posit8`` is es=0, ``posit16`` es=1 (the pre-2022 standard), ``posit_2(x, n)`` es=2 for n bits
  (codes left-aligned in 32 bits).
- ``brute_round``: the neighbours of x in the sorted list of every value, for the directed modes, which have
  no SoftPosit oracle.
Expected results never come from emunum's posit code.
"""
from __future__ import annotations

import numpy as np
import pytest

try:
    import softposit as sp
except ImportError:  # the tests that need it are skipped (needs_softposit)
    sp = None

needs_softposit = pytest.mark.skipif(sp is None, reason="SoftPosit (the posit oracle) is not installed: "
                                                         "pip install softposit (or the 'test' extra)")

# (nbits, es) that SoftPosit covers
SOFTPOSIT_CASES = [(8, 0), (16, 1), (2, 2), (3, 2), (5, 2), (8, 2), (12, 2), (16, 2), (32, 2)]


def sp_code(x: float, n: int, es: int) -> int:
    """SoftPosit's posit code of float64 x (round to nearest even on the pattern)."""
    x = float(x)
    if (n, es) == (8, 0):
        return int(sp.convertDoubleToP8(x).v)
    if (n, es) == (16, 1):
        return int(sp.convertDoubleToP16(x).v)
    if es == 2:
        return int(sp.convertDoubleToPX2(x, n).v) >> (32 - n)
    raise ValueError(f"SoftPosit has no posit{n}_{es}")


def sp_codes(xs, n: int, es: int) -> np.ndarray:
    return np.array([sp_code(x, n, es) for x in np.asarray(xs, np.float64).ravel()], np.int64)


def sp_value(code: int, n: int, es: int) -> float:
    """SoftPosit's value of an n-bit code (NaR -> NaN)."""
    if (n, es) == (8, 0):
        p = sp.posit8(0.0)
        p.fromBits(int(code))
    elif (n, es) == (16, 1):
        p = sp.posit16(0.0)
        p.fromBits(int(code))
    elif es == 2:
        p = sp.posit_2(0.0, n)
        p.fromBits(int(code) << (32 - n))
    else:
        raise ValueError(f"SoftPosit has no posit{n}_{es}")
    return float("nan") if p.isNaR() else float(p)


def sp_values(codes, n: int, es: int) -> np.ndarray:
    return np.array([sp_value(c, n, es) for c in np.asarray(codes).ravel()], np.float64)


def positive_codes(n: int, rng=None, count: int = 20000) -> np.ndarray:
    """Every positive code (n <= 16), or a random sample of them plus both ends (n > 16)."""
    top = 2 ** (n - 1)
    if n <= 16:
        return np.arange(1, top, dtype=np.int64)
    rng = rng or np.random.default_rng(0)
    return np.unique(np.concatenate([[1, 2, top - 2, top - 1], rng.integers(1, top - 1, count)]))


def midpoints(n: int, es: int, rng=None) -> np.ndarray:
    """Positive pattern midpoints between neighbouring n-bit posits (the value whose infinite pattern is the
    lower code followed by a 1): the odd codes of the (n+1)-bit posit, from SoftPosit for es=2 and n < 32.
    SoftPosit has no posit9_0 or posit17_1: those come from emunum's pattern decoder (they are only inputs; that
    they are ties is checked by SoftPosit's results one ulp either side). For n = 32 (no 33-bit SoftPosit):
    arithmetic means of neighbours that carry >= 12 fraction bits (there the cut falls in the fraction, where
    the pattern midpoint is the value midpoint)."""
    if n < 32:
        odd = np.arange(1, 2**n, 2) if n < 16 else 2 * positive_codes(n, rng) + 1
        if es == 2:
            return sp_values(odd, n + 1, es)
        from emunum.formats.posit import pattern_value
        return np.array([pattern_value(int(c), n + 1, es) for c in odd])
    rng = rng or np.random.default_rng(0)
    lo_codes = rng.integers(2**30 - 2**26, 2**30 + 2**26, 20000)  # regime length 2: 27 fraction bits
    lo, hi = sp_values(lo_codes, n, es), sp_values(lo_codes + 1, n, es)
    return (lo + hi) / 2


def around(xs: np.ndarray, dtype=np.float64) -> np.ndarray:
    """xs (as dtype) and their neighbours one ulp of dtype below and above, as float64."""
    x = np.asarray(xs, dtype)
    return np.concatenate([x, np.nextafter(x, dtype(np.inf)), np.nextafter(x, dtype(-np.inf))]).astype(np.float64)


def brute_round(x: np.ndarray, values: np.ndarray, codes_of_values: np.ndarray, mode: str) -> np.ndarray:
    """Directed rounding by neighbour search over ``values`` (sorted ascending, every finite value, with the
    code of each in ``codes_of_values``): toward_zero, up, down, odd (the neighbour with the odd code when
    inexact). Beyond ±max: ±max (posits saturate). Finite x only."""
    x = np.asarray(x, np.float64)
    hi_i = np.clip(np.searchsorted(values, x, side="left"), 0, len(values) - 1)  # first value >= x
    lo_i = np.clip(np.searchsorted(values, x, side="right") - 1, 0, len(values) - 1)  # last value <= x
    up, down = values[hi_i], values[lo_i]
    exact = down == x
    if mode == "up":
        r = up
    elif mode == "down":
        r = down
    elif mode == "toward_zero":
        r = np.where(x >= 0, down, up)
    elif mode == "odd":
        r = np.where(codes_of_values[lo_i] % 2 == 1, down, up)
    else:
        raise ValueError(mode)
    r = np.where(exact, down, r)  # the value itself (posits have one zero, +0)
    return np.clip(r, values[0], values[-1])
