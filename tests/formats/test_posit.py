"""PositFormat (the spec and its pure-Python encode/decode) against outside oracles: SoftPosit for decoding and
round-to-nearest, brute-force neighbour search over ``values()`` for the directed modes; limits, names,
validation. The kernels (emunum.quantize) are checked against the same oracles in tests/kernels."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import emunum
from emunum import PositFormat, RoundMode, get_format
from emunum.ops import format_from_args, format_to_args
from posit_oracle import (SOFTPOSIT_CASES, around, brute_round, midpoints, needs_softposit,
                          positive_codes, sp_codes, sp_values)

DIRECTED = ["toward_zero", "up", "down", "odd"]
BRUTE_CASES = [(2, 0), (3, 1), (5, 0), (6, 3), (8, 0), (8, 2), (10, 5), (16, 1), (16, 2)]
ids = [f"posit{n}_{es}" for n, es in SOFTPOSIT_CASES]


def signed(codes: np.ndarray, n: int) -> np.ndarray:
    """Positive codes and their two's-complement negatives (the codes of the negated values)."""
    return np.concatenate([codes, (2**n - codes) % 2**n])


def special_inputs(fmt: PositFormat) -> np.ndarray:
    """Zero, beyond maxpos, below minpos (both signs), float64's extremes."""
    mx, mn = fmt.max, fmt.min_positive
    xs = [0.0, -0.0, mx, mx * 1.5, mx * 4, mx * 2**40, 1e308, np.finfo(np.float64).max, mn, mn / 2, mn * 0.75,
          mn / 2**30, 5e-324, 2.2250738585072014e-308, np.nextafter(mx, 0), np.nextafter(mn, 0),
          np.nextafter(mn, 1)]
    xs = np.array(xs, np.float64)
    return np.concatenate([xs, -xs])


# ---- decoding ---------------------------------------------------------------------------------------------
@needs_softposit
@pytest.mark.parametrize("n,es", SOFTPOSIT_CASES, ids=ids)
def test_decode_matches_softposit_at_every_code(n, es):
    fmt = PositFormat(n, es)
    codes = signed(positive_codes(n), n)
    np.testing.assert_array_equal(fmt.decode(codes), sp_values(codes, n, es), strict=True)
    assert fmt.decode(np.array([0]))[0] == 0.0 and not math.copysign(1, fmt.decode(np.array([0]))[0]) < 0
    assert np.isnan(fmt.decode(np.array([fmt.nar_code]))[0])


@needs_softposit
@pytest.mark.parametrize("n,es", SOFTPOSIT_CASES, ids=ids)
def test_limits_are_softposits_extreme_codes(n, es):
    fmt = PositFormat(n, es)
    assert fmt.max == sp_values([2 ** (n - 1) - 1], n, es)[0]
    assert fmt.min_positive == sp_values([1], n, es)[0]
    assert fmt.bits == n
    assert fmt.useed == 2.0 ** (2**es)


@pytest.mark.parametrize("n,es", BRUTE_CASES)
def test_values_are_every_non_nar_code_sorted_with_one_zero(n, es):
    fmt = PositFormat(n, es)
    v = fmt.values()
    assert len(v) == 2**n - 1 and np.all(np.diff(v) > 0)
    assert v[0] == -fmt.max and v[-1] == fmt.max and np.count_nonzero(v == 0) == 1
    assert v[np.searchsorted(v, 0) + 1] == fmt.min_positive
    np.testing.assert_array_equal(v, -v[::-1])  # symmetric
    # posit order: the codes as signed integers sort like their values
    codes = np.arange(2**n)
    codes = codes[codes != fmt.nar_code]
    s = np.where(codes >= 2 ** (n - 1), codes - 2**n, codes)
    np.testing.assert_array_equal(fmt.decode(codes[np.argsort(s)]), v)


# ---- round to nearest against SoftPosit -------------------------------------------------------------------
@needs_softposit
@pytest.mark.parametrize("n,es", SOFTPOSIT_CASES, ids=ids)
def test_encode_nearest_matches_softposit_at_codes_midpoints_and_one_ulp_around(n, es):
    fmt = PositFormat(n, es)
    pts = np.concatenate([fmt.decode(positive_codes(n)), midpoints(n, es)])
    x = around(np.concatenate([pts, -pts]))
    x32 = around(np.concatenate([pts, -pts]).astype(np.float32), np.float32)
    for xs in (x, x32):
        np.testing.assert_array_equal(fmt.encode(xs), sp_codes(xs, n, es), strict=True)


@needs_softposit
@pytest.mark.parametrize("n,es", SOFTPOSIT_CASES, ids=ids)
def test_encode_nearest_matches_softposit_beyond_maxpos_below_minpos_zero_and_random(n, es):
    fmt = PositFormat(n, es)
    rng = np.random.default_rng(n * 10 + es)
    rand = rng.standard_normal(4000) * np.exp2(rng.uniform(-1.2, 1.2, 4000) * fmt.max_exp)
    x = np.concatenate([special_inputs(fmt), rand])
    np.testing.assert_array_equal(fmt.encode(x), sp_codes(x, n, es), strict=True)


@pytest.mark.parametrize("n,es", BRUTE_CASES)
def test_nonzero_never_rounds_to_zero_or_nar_and_saturates_in_nearest(n, es):
    fmt = PositFormat(n, es)
    x = special_inputs(fmt)
    x = x[x != 0]
    for mode in ("nearest", "nearest_away"):
        c = fmt.encode(x, mode)
        assert np.all(c != 0) and np.all(c != fmt.nar_code)
        v = fmt.decode(c)
        np.testing.assert_array_equal(np.abs(v[np.abs(x) >= fmt.max]), fmt.max)
        np.testing.assert_array_equal(np.abs(v[np.abs(x) <= fmt.min_positive]), fmt.min_positive)


@pytest.mark.parametrize("mode", [m.name.lower() for m in RoundMode])
def test_nan_and_infinities_encode_to_nar_and_zero_to_code_0(mode):
    fmt = PositFormat(16, 2)
    np.testing.assert_array_equal(fmt.encode([np.nan, np.inf, -np.inf, -np.nan], mode), fmt.nar_code)
    np.testing.assert_array_equal(fmt.encode([0.0, -0.0], mode), [0, 0])


# ---- the other modes against brute force over values() ---------------------------------------------------
def brute_inputs(fmt: PositFormat, seed: int) -> np.ndarray:
    v = fmt.values()
    mids = (v[1:] + v[:-1]) / 2
    rng = np.random.default_rng(seed)
    rand = rng.uniform(-1, 1, 3000) * np.exp2(rng.uniform(-1.1, 1.1, 3000) * fmt.max_exp)
    return np.concatenate([around(v), around(mids), special_inputs(fmt), rand])


@pytest.mark.parametrize("mode", DIRECTED)
@pytest.mark.parametrize("n,es", BRUTE_CASES)
def test_directed_modes_give_the_brute_force_neighbour(n, es, mode):
    fmt = PositFormat(n, es)
    v = fmt.values()
    x = brute_inputs(fmt, n + es)
    got = fmt.decode(fmt.encode(x, mode))
    # below minpos the neighbour toward zero is 0 (only the nearest modes never round to zero)
    np.testing.assert_array_equal(got, brute_round(x, v, fmt.encode(v), mode))
    if mode == "odd":
        assert np.all(fmt.encode(x[~np.isin(x, v) & (np.abs(x) < fmt.max)], mode) % 2 == 1)  # inexact -> odd


@needs_softposit
@pytest.mark.parametrize("n,es", [c for c in SOFTPOSIT_CASES if c[0] < 32])
def test_nearest_away_is_nearest_except_at_pattern_midpoints_which_go_away_from_zero(n, es):
    fmt = PositFormat(n, es)
    mids = midpoints(n, es, np.random.default_rng(1))
    mids = np.concatenate([mids, -mids])
    got = fmt.decode(fmt.encode(mids, "nearest_away"))
    lo = fmt.decode(fmt.encode(mids, "toward_zero"))
    hi = np.where(mids > 0, fmt.decode(fmt.encode(mids, "up")), fmt.decode(fmt.encode(mids, "down")))
    in_range = np.abs(mids) < fmt.max
    np.testing.assert_array_equal(got[in_range], hi[in_range])
    assert np.all(np.abs(lo[in_range]) < np.abs(hi[in_range]))  # midpoints are inexact
    rest = around(mids)[len(mids):]  # one ulp off each midpoint: not a tie
    np.testing.assert_array_equal(fmt.encode(rest, "nearest_away"), sp_codes(rest, n, es))


# ---- stochastic -------------------------------------------------------------------------------------------
def sr_points(fmt: PositFormat) -> list[float]:
    v = fmt.values()
    pos = v[v > 0]
    pts = [pos[len(pos) // 2] * 1.3, pos[-1] * 0.7, pos[-2] * 1.1, pos[0] * 0.37, -pos[len(pos) // 3] * 1.01]
    return [p for p in pts if not np.isin(p, v)]


@pytest.mark.parametrize("n,es", [(8, 2), (8, 0), (6, 3), (16, 2)])
def test_stochastic_picks_a_neighbour_and_is_unbiased_within_5_sigma(n, es):
    fmt = PositFormat(n, es)
    v = fmt.values()
    N = 20000
    for x in sr_points(fmt):
        lo = brute_round(np.array([x]), v, fmt.encode(v), "down")[0]
        hi = brute_round(np.array([x]), v, fmt.encode(v), "up")[0]
        r = fmt.decode(fmt.encode(np.full(N, x), "stochastic", seed=7))
        assert set(np.unique(r)) <= {lo, hi}, (x, lo, hi)
        p = (x - lo) / (hi - lo)
        sigma = (hi - lo) * math.sqrt(p * (1 - p) / N)
        assert abs(r.mean() - x) <= 5 * sigma, (x, r.mean(), sigma)


def test_stochastic_depends_on_seed_and_index_only():
    fmt = PositFormat(8, 2)
    x = np.full(64, 1.3)
    a, b = fmt.encode(x, "stochastic", seed=3), fmt.encode(x, "stochastic", seed=3)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, fmt.encode(x, "stochastic", seed=4))
    np.testing.assert_array_equal(fmt.encode(x.reshape(8, 8), "stochastic", seed=3).ravel(), a)


# ---- names, presets, encodings, validation ----------------------------------------------------------------
def test_presets_and_names():
    assert get_format("posit8") == PositFormat(8, 2) == PositFormat(8)
    assert get_format("posit16") == PositFormat(16, 2)
    assert get_format("posit8_0") == PositFormat(8, 0)
    assert get_format("POSIT16_1") == PositFormat(16, 1)
    assert get_format("posit32") == PositFormat(32, 2)
    for f in (PositFormat(8, 0), PositFormat(32, 5), PositFormat(2, 0)):
        assert get_format(f.name) == f and str(f) == f.name
        assert format_from_args(format_to_args(f)) == f
    assert format_to_args(PositFormat(16, 1)) == [2, 16, 1]
    assert emunum.PositFormat is PositFormat


def test_spec_is_frozen_and_hashable():
    f = PositFormat(16, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.es = 1
    assert len({f, PositFormat(16, 2), PositFormat(16, 1)}) == 2


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(nbits=8, es=-1), ValueError, r"PositFormat\.es=-1 is out of range; allowed: 0\.\.5"),
    (dict(nbits=8, es=6), ValueError, r"PositFormat\.es=6 is out of range; allowed: 0\.\.5"),
    (dict(nbits=1), ValueError, r"PositFormat\.nbits=1 is out of range; allowed: 2\.\.32"),
    (dict(nbits=33), ValueError, r"PositFormat\.nbits=33 is out of range; allowed: 2\.\.32"),
    (dict(nbits="8"), TypeError, r"PositFormat\.nbits must be an int"),
    (dict(nbits=8, es=1.0), TypeError, r"PositFormat\.es must be an int"),
    (dict(nbits=True), TypeError, r"PositFormat\.nbits must be an int"),
])
def test_bad_spec_is_named(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        PositFormat(**kwargs)


def test_bad_names_and_modes_are_named():
    with pytest.raises(ValueError, match=r"PositFormat\.es=9"):
        get_format("posit16_9")
    with pytest.raises(ValueError, match=r"PositFormat\.nbits=64"):
        get_format("posit64")
    with pytest.raises(ValueError, match=r"rounding='sideways' is not a rounding mode"):
        PositFormat(8).encode([1.0], "sideways")
    with pytest.raises(ValueError, match=r"codes must be in \[0, 256\)"):
        PositFormat(8).decode([256])
    with pytest.raises(TypeError, match="codes must be integers"):
        PositFormat(8).decode([1.0])
    with pytest.raises(ValueError, match="at most 16 bits"):
        PositFormat(32).values()
