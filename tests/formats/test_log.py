"""LogFormat (logarithmic numbers) against exact log-domain rounding computed with rational arithmetic: for
x = a double and F = 2**frac_bits, floor(F*log2 x) is the largest k with x**F >= 2**k, and x lies above the
log-domain midpoint of k and k+1 exactly when x**(2F) > 2**(2k+1) (all exact ``Fraction`` / int powers).
A code's value, the float64 nearest 2**(k/F), is found the same way (midpoints of doubles raised to F).
Probed on every code value, on the doubles around every log-domain midpoint, on random values, out of range,
below min (the zero/min midpoint rule), zeros, infinities and NaN."""
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import emunum
from emunum.formats import LogFormat

MODES = ["nearest", "nearest_away", "toward_zero", "up", "down", "odd"]
FORMATS = [LogFormat(3, 2), LogFormat(2, 3), LogFormat(4, 0), LogFormat(3, 2, signed=False), LogFormat(1, 3)]


def floor_log(x: Fraction, F: int) -> int:
    """The largest k with 2**(k/F) <= x (x > 0), exactly."""
    k = math.floor(F * math.log2(x)) if x < 2**1000 else F * 1000
    while x**F < Fraction(2) ** k:
        k -= 1
    while x**F >= Fraction(2) ** (k + 1):
        k += 1
    return k


def value_of(k: int, F: int) -> float:
    """The float64 nearest 2**(k/F), exactly: c is it iff the midpoints around c bracket 2**(k/F)."""
    c = 2.0 ** (k / F)
    target = Fraction(2) ** k
    while True:
        lo = (Fraction(c) + Fraction(math.nextafter(c, 0))) / 2
        hi = (Fraction(c) + Fraction(math.nextafter(c, math.inf))) / 2
        if lo**F > target:
            c = math.nextafter(c, 0)
        elif hi**F < target:
            c = math.nextafter(c, math.inf)
        else:
            return c  # ties impossible: 2**(k/F) is irrational or a power of two


def oracle(x: float, fmt: LogFormat, mode: str, f32: bool = False) -> float:
    """LogFormat's documented rounding, decided exactly (``f32``: x comes from a float32 tensor)."""
    F = 2**fmt.frac_bits
    if math.isnan(x):
        return math.nan
    if x == 0 or (x < 0 and not fmt.signed):
        return 0.0
    neg = x < 0
    if math.isinf(x):
        kr = fmt.kmax
    else:
        a = Fraction(abs(x))
        k = floor_log(a, F)
        exact = a**F == Fraction(2) ** k
        above = a ** (2 * F) > Fraction(2) ** (2 * k + 1)
        if k < fmt.kmin - 1:
            k, exact, above = fmt.kmin - 1, False, False
        # x equal to a code's (float64) value is exact
        def held(j):  # the values a tensor holds for code j
            return (value_of(j, F), float(np.float32(value_of(j, F))) if f32 else value_of(j, F))

        if fmt.kmin <= k + 1 <= fmt.kmax and abs(x) in held(k + 1):
            k, exact = k + 1, True
        elif fmt.kmin <= k <= fmt.kmax and abs(x) in held(k):
            exact = True
        if exact:
            kr = k
        elif mode in ("nearest", "nearest_away"):
            kr = k + 1 if above else k
        elif mode == "toward_zero":
            kr = k
        elif mode == "up":
            kr = k if neg else k + 1
        elif mode == "down":
            kr = k + 1 if neg else k
        elif mode == "odd":
            kr = k if k % 2 else k + 1
        else:
            raise ValueError(mode)
        kr = min(kr, fmt.kmax)
    if kr < fmt.kmin:
        return 0.0
    v = value_of(kr, F)
    return -v if neg else v


def probe_points(fmt: LogFormat) -> np.ndarray:
    F = 2**fmt.frac_bits
    ks = np.arange(fmt.kmin - 3, fmt.kmax + 3)
    codes = 2.0 ** (ks / F)
    mids = 2.0 ** ((ks + 0.5) / F)  # the doubles nearest the log-domain midpoints (irrational), and around
    pts = np.concatenate([codes, mids])
    pts = np.concatenate([pts, np.nextafter(pts, 0), np.nextafter(pts, np.inf),
                          np.nextafter(np.nextafter(pts, 0), 0), np.nextafter(np.nextafter(pts, np.inf), np.inf)])
    rng = np.random.default_rng(1)
    rnd = 2.0 ** rng.uniform((fmt.kmin - 6) / F, (fmt.kmax + 4) / F, 300)
    extra = [0.0, np.inf, 1e-300, 1e300, fmt.min_positive / 2, fmt.min_positive * 0.999]
    pos = np.concatenate([pts, rnd, extra])
    return np.concatenate([pos, -pos, [np.nan, -0.0, -np.inf]])


def same_bits(a, b) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or not np.array_equal(np.isnan(a), np.isnan(b)):
        return False
    m = ~np.isnan(a)
    return np.array_equal(a[m], b[m]) and np.array_equal(np.signbit(a[m]), np.signbit(b[m]))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_float64_rounding_matches_exact_log_domain_rounding(fmt, mode):
    x = probe_points(fmt)
    want = np.array([oracle(float(e), fmt, mode) for e in x])
    got = emunum.quantize(torch.from_numpy(x), fmt, mode).numpy()
    bad = ~((got == want) | (np.isnan(got) & np.isnan(want))) | (np.signbit(got) != np.signbit(want))
    assert not bad.any(), (x[bad][:5], got[bad][:5], want[bad][:5])


@pytest.mark.parametrize("mode", MODES)
def test_float32_inputs_get_the_float64_code_value_cast_to_float32(mode):
    fmt = LogFormat(4, 3)
    with np.errstate(over="ignore"):
        x = probe_points(fmt).astype(np.float32)
    want = np.array([oracle(float(e), fmt, mode, f32=True) for e in x]).astype(np.float32)
    got = emunum.quantize(torch.from_numpy(x), fmt, mode).numpy()
    assert same_bits(got, want)


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_code_values_are_the_float64_nearest_powers_and_decode_encode_round_trips(fmt):
    F = 2**fmt.frac_bits
    vals = fmt.magnitudes()
    assert vals[0] == 0.0
    assert list(vals[1:]) == [value_of(k, F) for k in range(fmt.kmin, fmt.kmax + 1)]
    every = fmt.values()
    assert np.array_equal(every, np.concatenate([-vals[:0:-1], vals]) if fmt.signed else vals)
    assert np.all(np.diff(every) > 0) and len(every) == 2**fmt.bits - int(fmt.signed)  # minus the NaN code
    assert fmt.max == value_of(fmt.kmax, F) and fmt.min_positive == value_of(fmt.kmin, F)
    codes = np.arange(2**fmt.bits)
    if fmt.signed:
        codes = codes[codes != fmt.nan_code]
    assert np.array_equal(fmt.encode(fmt.decode(codes)), codes)


@pytest.mark.parametrize("mode", MODES + ["stochastic"])
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_every_value_of_the_format_is_kept_in_every_mode(fmt, mode):
    v = torch.from_numpy(fmt.values())
    assert torch.equal(emunum.quantize(v, fmt, mode, seed=1), v)


@pytest.mark.parametrize("mode", MODES + ["stochastic"])
def test_float32_tensors_keep_their_values_of_the_codes_in_every_mode(mode):
    fmt = LogFormat(4, 3)
    v = torch.from_numpy(fmt.values()).float()
    assert torch.equal(emunum.quantize(v, fmt, mode, seed=1), v)


def test_code_layout_zero_field_and_nan_code():
    fmt = LogFormat(3, 2)  # E = 5 exponent bits, sign bit on top
    assert (fmt.bits, fmt.kmin, fmt.kmax, fmt.zero_field, fmt.nan_code) == (6, -15, 15, 16, 48)
    assert fmt.decode([16]).tolist() == [0.0] and np.isnan(fmt.decode([48])).all()
    assert fmt.decode([0, 4, 32 + 4, 31]).tolist() == [1.0, 2.0, -2.0, 2.0 ** (-1 / 4)]
    assert fmt.encode([0.0, -0.0, np.nan]).tolist() == [16, 16, 48]
    with pytest.raises(ValueError, match="has no code for NaN"):
        LogFormat(3, 2, signed=False).encode([np.nan])


def test_underflow_uses_the_log_domain_midpoint_between_zero_code_and_min():
    fmt = LogFormat(3, 2)
    F = 4
    # zero stands where code kmin-1 would be: the midpoint is 2**((kmin - 1/2)/F), decided exactly
    m = 2.0 ** ((fmt.kmin - 0.5) / F)
    for d in (math.nextafter(m, 0), m, math.nextafter(m, math.inf)):
        above = Fraction(d) ** (2 * F) > Fraction(2) ** (2 * fmt.kmin - 1)
        assert emunum.quantize(torch.tensor([d], dtype=torch.float64), fmt).item() == (fmt.min_positive if above
                                                                                         else 0.0)
    x = torch.tensor([m * 0.999, m * 1.001], dtype=torch.float64)
    assert emunum.quantize(x, fmt).tolist() == [0.0, fmt.min_positive]
    assert emunum.quantize(x, fmt, "up").tolist() == [fmt.min_positive] * 2
    assert emunum.quantize(-x, fmt, "up").tolist() == [0.0, 0.0]
    assert emunum.quantize(x, fmt, "toward_zero").tolist() == [0.0, 0.0]
    assert emunum.quantize(x * 1e-6, fmt, "odd").tolist() == [fmt.min_positive] * 2


def test_overflow_saturates_in_every_mode():
    fmt = LogFormat(3, 2)
    x = torch.tensor([fmt.max * 1.5, np.inf, -np.inf, -1e300], dtype=torch.float64)
    for mode in MODES + ["stochastic"]:
        assert emunum.quantize(x, fmt, mode, seed=0).tolist() == [fmt.max, fmt.max, -fmt.max, -fmt.max]


@pytest.mark.parametrize("t", [0.1, 0.5, 0.77])
def test_stochastic_is_unbiased_in_the_log_domain_within_5_sigma(t):
    fmt = LogFormat(3, 2)
    F = 4
    k0 = 3
    x = 2.0 ** ((k0 + t) / F)
    n = 40000
    q = emunum.quantize(torch.full((n,), -x, dtype=torch.float64), fmt, "stochastic", seed=11).numpy()
    lo, hi = -value_of(k0, F), -value_of(k0 + 1, F)
    assert set(np.unique(q)) <= {lo, hi}
    p = float(np.mean(q == hi))
    sigma = math.sqrt(t * (1 - t) / n)
    assert abs(p - t) <= 5 * sigma  # E[k] = k0 + t, i.e. E[log2 |q|] = log2 |x|


def test_stochastic_below_min_is_unbiased_in_value_within_5_sigma():
    fmt = LogFormat(3, 2)
    x = fmt.min_positive * 0.3
    n = 40000
    q = emunum.quantize(torch.full((n,), x, dtype=torch.float64), fmt, "stochastic", seed=5).numpy()
    assert set(np.unique(q)) <= {0.0, fmt.min_positive}
    sigma = fmt.min_positive * math.sqrt(0.3 * 0.7 / n)
    assert abs(q.mean() - x) <= 5 * sigma


def test_stochastic_keeps_exact_values_and_is_reproducible():
    fmt = LogFormat(3, 2)
    v = torch.from_numpy(fmt.values())
    assert torch.equal(emunum.quantize(v, fmt, "stochastic", seed=2), v)
    assert (v < 0).any()
    x = torch.randn(3000, dtype=torch.float64)
    assert torch.equal(emunum.quantize(x, fmt, "stochastic", seed=9), emunum.quantize(x, fmt, "stochastic", seed=9))


@pytest.mark.parametrize("fmt", [LogFormat(3, 2), LogFormat(2, 2, signed=False)], ids=str)
def test_mul_codes_equals_nearest_encoding_of_the_product_for_every_code_pair(fmt):
    codes = np.arange(2**fmt.bits)
    if fmt.signed:
        codes = codes[codes != fmt.nan_code]
    a, b = np.meshgrid(codes, codes)
    got = fmt.mul_codes(a, b)
    want = fmt.encode(fmt.decode(a) * fmt.decode(b), "nearest")  # products are within 1e-15 of a code point
    assert np.array_equal(got, want)
    if fmt.signed:
        assert (fmt.mul_codes([fmt.nan_code], [0]) == fmt.nan_code).all()


def test_large_frac_bits_tables_and_names():
    fmt = emunum.get_format("lns6_10")
    assert fmt == LogFormat(6, 10) and fmt.bits == 17 and str(fmt) == "lns6_10"
    assert emunum.get_format("ulns4_3") == LogFormat(4, 3, signed=False)
    x = torch.tensor([3.0, 0.1, -7.5], dtype=torch.float64)
    want = [oracle(float(e), fmt, "nearest") for e in x]
    assert emunum.quantize(x, fmt).tolist() == want


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(int_bits=11, frac_bits=2), ValueError, r"LogFormat.int_bits=11 is out of range; allowed: 0..10"),
    (dict(int_bits=3, frac_bits=11), ValueError, r"LogFormat.frac_bits=11 is out of range; allowed: 0..10"),
    (dict(int_bits=1, frac_bits=0), ValueError, r"int_bits \+ frac_bits = 1; allowed: >= 2"),
    (dict(int_bits=2.0, frac_bits=2), TypeError, r"LogFormat.int_bits must be an int"),
    (dict(int_bits=2, frac_bits=2, signed=1), TypeError, r"LogFormat.signed must be a bool"),
])
def test_bad_arguments_are_named(kwargs, err, match):
    with pytest.raises(err, match=match):
        LogFormat(**kwargs)


def test_mul_codes_rejects_bad_codes():
    fmt = LogFormat(3, 2)
    with pytest.raises(ValueError, match=r"a: codes must be in \[0, 64\)"):
        fmt.mul_codes([64], [0])
    with pytest.raises(TypeError, match="b must be integer codes"):
        fmt.mul_codes([1], [0.5])


def test_patched_linear_trains_one_step_with_a_log_format():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4))
    params = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    emunum.patch(model, fmt=LogFormat(4, 3))
    loss = torch.nn.functional.mse_loss(model(torch.randn(16, 8)), torch.randn(16, 4))
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
    assert any(not torch.equal(p, b) for p, b in zip(model.parameters(), params))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_numpy_encode_agrees_with_the_kernel(fmt, mode):
    x = probe_points(fmt)
    x = x[~np.isnan(x)]
    got = fmt.decode(fmt.encode(x, mode))
    assert same_bits(got, emunum.quantize(torch.from_numpy(x), fmt, mode).numpy())
