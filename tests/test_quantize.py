"""emunum.quantize, bit for bit against independent oracles, with zero tolerance.

Oracles (see conftest.py): gfloat's round_ndarray, brute force over ``fmt.values()``, exact integer
arithmetic for fixed point, ml_dtypes and torch casts. Inputs: every code point and midpoint +-1 ulp, the
overflow boundary, tiny values, +-0, +-inf, NaN and thousands of random values, as float32 and float64.
Then stochastic-rounding statistics, hypothesis properties, and the tensor API (dtypes, layouts, out=).
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import emunum
from emunum import FixedFormat, FloatFormat, RoundMode
from emunum.formats import PRESETS

DTYPES = [np.float32, np.float64]
DTYPE_IDS = ["f32", "f64"]
NONSTOCHASTIC = [m for m in RoundMode if m != RoundMode.STOCHASTIC]
SYMMETRIC = [RoundMode.NEAREST, RoundMode.NEAREST_AWAY, RoundMode.TOWARD_ZERO, RoundMode.ODD, RoundMode.STOCHASTIC]

def _q(v, fmt, rnd, oracles, seed=None):
    return oracles.quantize_np(v, fmt, rnd, seed=oracles.SEED if seed is None else seed)


# ---------------------------------------------------------------------------------------------------------
# float formats against the oracles
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_float_rounding_matches_gfloat(gfloat_float_case, rounding, dtype, oracles):
    fmt = gfloat_float_case
    v = oracles.float_probes(fmt, dtype)
    oracles.assert_same_values(_q(v, fmt, rounding, oracles), oracles.gfloat_round(fmt, v, rounding), v,
                               f"{fmt.name} {rounding.id} vs gfloat")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_float_rounding_matches_value_set_oracle(value_set_float_case, rounding, dtype, oracles):
    fmt = value_set_float_case
    v = oracles.float_probes(fmt, dtype)
    oracles.assert_same_values(_q(v, fmt, rounding, oracles), oracles.value_set_round(fmt, v, rounding), v,
                               f"{fmt.name} {rounding.id} vs value set")


def test_value_set_oracle_agrees_with_gfloat(oracles):
    """The brute-force oracle (which alone covers odd and no-subnormal formats) is itself checked."""
    for fmt in [f for f in oracles.SMALL_FLOAT_FORMATS.values() if f.subnormals]:
        v = oracles.float_probes(fmt, np.float64)
        for rnd in oracles.ROUNDINGS:
            oracles.assert_same_values(oracles.value_set_round(fmt, v, rnd), oracles.gfloat_round(fmt, v, rnd),
                                       v, f"oracles disagree on {fmt.name} {rnd.id}")


def test_no_subnormals_rounds_to_the_value_set(oracles):
    """Below min_normal, a format without subnormals rounds to 0 or +-min_normal (not flush-to-zero)."""
    fmt = FloatFormat(4, 3, subnormals=False)
    mn = fmt.min_normal
    x = np.array([mn * 0.25, mn * 0.5, mn * 0.75, -mn * 0.25, mn * 0.999], dtype=np.float32)
    R = oracles.Rounding
    assert_eq = oracles.assert_same_values
    assert_eq(_q(x, fmt, R(RoundMode.NEAREST), oracles), [0.0, 0.0, mn, -0.0, mn], x, "nearest")
    assert_eq(_q(x, fmt, R(RoundMode.UP), oracles), [mn, mn, mn, -0.0, mn], x, "up")
    assert_eq(_q(x, fmt, R(RoundMode.NEAREST_AWAY), oracles), [0.0, mn, mn, -0.0, mn], x, "nearest_away")
    assert_eq(_q(x, fmt, R(RoundMode.ODD), oracles), [mn, mn, mn, -mn, mn], x, "odd")


# ---------------------------------------------------------------------------------------------------------
# ml_dtypes and torch casts (round to nearest even)
# ---------------------------------------------------------------------------------------------------------
ML_DTYPES = [
    # preset, ml_dtypes type, whether NaN inputs are comparable (ml_dtypes' fp6/fp4 have no NaN and turn a
    # NaN into +-0; emunum returns NaN). ml_dtypes' fp6/fp4 saturate on overflow and for +-inf, like
    # emunum's special="none"; its float8/bf16/fp16 give inf or NaN, like emunum.
    ("fp8_152", ml_dtypes.float8_e5m2, True),
    ("fp8_143", ml_dtypes.float8_e4m3, True),
    ("e4m3fn", ml_dtypes.float8_e4m3fn, True),
    ("e4m3fnuz", ml_dtypes.float8_e4m3fnuz, True),
    ("e5m2fnuz", ml_dtypes.float8_e5m2fnuz, True),
    ("fp6_e3m2", ml_dtypes.float6_e3m2fn, False),
    ("fp6_e2m3", ml_dtypes.float6_e2m3fn, False),
    ("fp4_e2m1", ml_dtypes.float4_e2m1fn, False),
    ("bf16", ml_dtypes.bfloat16, True),
    ("fp16", np.float16, True),
]


@pytest.mark.parametrize("name,ml,nan_ok", ML_DTYPES, ids=[c[0] for c in ML_DTYPES])
def test_nearest_matches_ml_dtypes_cast(name, ml, nan_ok, oracles):
    """float32 inputs only: ml_dtypes rounds float64 through float32 (double rounding); emunum does not."""
    fmt = PRESETS[name]
    v = oracles.float_probes(fmt, np.float32)
    if not nan_ok:
        v = v[~np.isnan(v)]
    with np.errstate(over="ignore", invalid="ignore"):
        want = v.astype(ml).astype(np.float32)
    oracles.assert_same_values(_q(v, fmt, oracles.Rounding(RoundMode.NEAREST), oracles), want, v, name)


TORCH_CASTS = [
    # torch's float32 -> float8_e4m3fn cast saturates (448, also for +-inf): compare with saturate=True
    ("fp8_152", FloatFormat(5, 2), torch.float8_e5m2),
    ("e4m3fn_sat", FloatFormat(4, 3, special="fn", saturate=True), torch.float8_e4m3fn),
    ("e4m3fnuz", PRESETS["e4m3fnuz"], torch.float8_e4m3fnuz),
    ("e5m2fnuz", PRESETS["e5m2fnuz"], torch.float8_e5m2fnuz),
    ("fp16", PRESETS["fp16"], torch.float16),
    ("bf16", PRESETS["bf16"], torch.bfloat16),
]


@pytest.mark.parametrize("name,fmt,tdtype", TORCH_CASTS, ids=[c[0] for c in TORCH_CASTS])
def test_nearest_matches_torch_cast(name, fmt, tdtype, oracles):
    v = oracles.float_probes(fmt, np.float32)
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**32, 1 << 16, dtype=np.uint64).astype(np.uint32).view(np.float32)
    v = np.concatenate([v, bits])
    x = torch.from_numpy(v)
    want = x.to(tdtype).float()
    got = emunum.quantize(x, fmt, "nearest")
    oracles.assert_same_values(got.numpy(), want.numpy(), v, f"{name} vs torch {tdtype}")


def test_fp32_on_float64_equals_torch_float_cast(oracles):
    v = oracles.float_probes(PRESETS["fp32"], np.float64)
    x = torch.from_numpy(v.copy())
    oracles.assert_same_values(emunum.quantize(x, "fp32").numpy(), x.float().double().numpy(), v, "fp32")


@pytest.mark.parametrize("name", ["fp8_152", "fp8_143", "e4m3fn", "e4m3fnuz", "fp6_e2m3", "fp4_e2m1"])
def test_float64_input_is_not_double_rounded(name, oracles):
    """x just above a midpoint whose lower neighbour is even: float32(x) is the midpoint itself, so rounding
    through float32 gives the lower neighbour; rounding x's own value gives the upper one."""
    fmt = PRESETS[name]
    vals = fmt.values()
    pos = vals[vals > 0]
    lo, hi = pos[:-1], pos[1:]
    even = (fmt.encode(lo) & 1) == 0
    lo, hi = lo[even], hi[even]
    mid = (lo + hi) / 2
    x = mid + np.spacing(mid.astype(np.float32)).astype(np.float64) / 4
    assert np.array_equal(x.astype(np.float32).astype(np.float64), mid)  # float32 loses the excess
    direct = emunum.quantize(torch.from_numpy(x), fmt).numpy()
    via32 = emunum.quantize(torch.from_numpy(x).float(), fmt).double().numpy()
    assert np.array_equal(direct, hi)
    assert np.array_equal(via32, lo)
    oracles.assert_same_values(direct, oracles.gfloat_round(fmt, x, oracles.Rounding(RoundMode.NEAREST)), x)


# ---------------------------------------------------------------------------------------------------------
# fixed point against integer arithmetic
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_fixed_rounding_matches_integer_arithmetic(fixed_case, rounding, dtype, oracles):
    fmt = fixed_case
    v = oracles.fixed_probes(fmt, dtype)
    oracles.assert_same_values(_q(v, fmt, rounding, oracles), oracles.fixed_expected(fmt, dtype, rounding), v,
                               f"{fmt.name} {rounding.id}")


@pytest.mark.parametrize("mode", list(RoundMode), ids=lambda m: m.name.lower())
def test_fixed_wrap_of_huge_values_is_modular(mode):
    """Codes wrap modulo 2**bits however large: float32 max * 8 = (2**24 - 1) * 2**107 wraps to code 0."""
    fmt = FixedFormat(8, 3, saturate=False)
    x32 = torch.tensor([3.4028234663852886e38, -3.4028234663852886e38, 2.0**100])
    assert torch.equal(emunum.quantize(x32, fmt, mode, seed=1), torch.zeros(3))
    # 2**50 + 769.5 -> code 2**53 + 6156, which is 12 mod 256 -> 1.5; negated: -12 -> -1.5
    x64 = torch.tensor([2.0**50 + 768 + 1.5, -(2.0**50 + 768 + 1.5), 2.0**1000], dtype=torch.float64)
    assert torch.equal(emunum.quantize(x64, fmt, mode, seed=1), torch.tensor([1.5, -1.5, 0.0], dtype=torch.float64))


def test_fixed_wrap_when_scaling_would_overflow_float64():
    """float64 max * 2**3 overflows; the code, an integer multiple of 2**971, still wraps to 0."""
    fmt = FixedFormat(8, 3, saturate=False)
    x = torch.tensor([1.7976931348623157e308, -1.7976931348623157e308], dtype=torch.float64)
    for mode in RoundMode:
        assert torch.equal(emunum.quantize(x, fmt, mode, seed=0), torch.zeros(2, dtype=torch.float64))


def test_fixed_negative_frac_bits_keeps_tiny_remainders():
    """x * 2**frac_bits underflows to 0 for tiny float64 x when frac_bits < 0; the remainder is not 0."""
    x = torch.tensor([5e-324, -5e-324, 1e-310], dtype=torch.float64)
    fmt = FixedFormat(5, -2)
    assert torch.equal(emunum.quantize(x, fmt, "up"), torch.tensor([4.0, 0.0, 4.0], dtype=torch.float64))
    assert torch.equal(emunum.quantize(x, fmt, "odd"), torch.tensor([4.0, -4.0, 4.0], dtype=torch.float64))
    assert torch.equal(emunum.quantize(x, fmt, "down"), torch.tensor([0.0, -4.0, 0.0], dtype=torch.float64))


def test_fixed_zero_is_positive():
    x = torch.tensor([-0.0, -0.1, -1e-30, 0.0])
    for mode in NONSTOCHASTIC:
        q = emunum.quantize(x, "int8", mode)
        assert not torch.signbit(q[q == 0]).any(), mode


# ---------------------------------------------------------------------------------------------------------
# stochastic rounding
# ---------------------------------------------------------------------------------------------------------
STOCHASTIC_FORMATS = ["fp8_152", "e4m3fn", "e4m3fnuz", "fp4_e2m1", "int8", "fixed16_12"]


@pytest.mark.parametrize("name", STOCHASTIC_FORMATS + ["e4m3_nosub", "fixed8_3_wrap"])
@pytest.mark.parametrize("sr_bits", [32, 3])
def test_stochastic_result_is_one_of_the_two_neighbours(name, sr_bits, oracles):
    fmt = PRESETS.get(name) or {**oracles.SMALL_FLOAT_FORMATS, **oracles.FIXED_FORMATS}[name]
    probes = oracles.float_probes if isinstance(fmt, FloatFormat) else oracles.fixed_probes
    x = torch.from_numpy(probes(fmt, np.float32).copy())
    q = emunum.quantize(x, fmt, "stochastic", seed=3, sr_bits=sr_bits)
    down, up = emunum.quantize(x, fmt, "down"), emunum.quantize(x, fmt, "up")
    ok = (q == down) | (q == up) | (q.isnan() & (down.isnan() | up.isnan()))
    assert ok.all(), x[~ok][:5]
    assert (q == up).any() and (q == down).any()


def _neighbours(fmt, x: float):
    """(toward-zero neighbour, away-from-zero neighbour) of an x that fmt cannot represent."""
    t = torch.tensor([x], dtype=torch.float64)
    lo = emunum.quantize(t, fmt, "toward_zero").item()
    hi = emunum.quantize(t, fmt, "up" if x > 0 else "down").item()
    return lo, hi


STAT_CASES = [
    ("fp8_152", 1.1), ("fp8_152", -3.3e-5), ("fp8_152", 7.7e-6),  # normal, subnormal, below min_subnormal
    ("e4m3fn", 300.0), ("e4m3fnuz", -0.013), ("fp4_e2m1", 2.75), ("fp4_e2m1", 0.1),
    ("e4m3_nosub", 0.004), ("int8", -17.3), ("fixed16_12", 0.000123), ("fixed8_3_wrap", 3.01),
]


@pytest.mark.parametrize("name,x", STAT_CASES, ids=[f"{n}-{x}" for n, x in STAT_CASES])
def test_stochastic_is_unbiased_within_5_sigma(name, x, oracles):
    """N copies of one value in one tensor: P(away from zero) = (|x| - |lo|) / (|hi| - |lo|) and the mean
    error is 0, each within 5 standard deviations."""
    fmt = PRESETS.get(name) or {**oracles.SMALL_FLOAT_FORMATS, **oracles.FIXED_FORMATS}[name]
    x = float(np.float32(x))
    lo, hi = _neighbours(fmt, x)
    p = (abs(x) - abs(lo)) / (abs(hi) - abs(lo))
    assert 0 < p < 1
    n = 40000
    q = emunum.quantize(torch.full((n,), x, dtype=torch.float64), fmt, "stochastic", seed=11).numpy()
    assert set(np.unique(q)) <= {lo, hi}
    k = int((q == hi).sum())
    sigma = math.sqrt(n * p * (1 - p))
    assert abs(k - n * p) < 5 * sigma, (k, n * p, sigma)
    err_sigma = abs(hi - lo) * math.sqrt(p * (1 - p) / n)
    assert abs(q.mean() - x) < 5 * err_sigma


def test_stochastic_over_many_seeds_is_unbiased():
    """One element, a different seed each call."""
    fmt, x = PRESETS["fp8_152"], 1.1
    lo, hi = 1.0, 1.25
    p = (x - lo) / (hi - lo)
    n = 200
    t = torch.tensor([x], dtype=torch.float64)
    k = sum(emunum.quantize(t, fmt, "stochastic", seed=s).item() == hi for s in range(n))
    assert abs(k - n * p) < 5 * math.sqrt(n * p * (1 - p))


@pytest.mark.parametrize("sr_bits", [1, 2, 3])
def test_sr_bits_limit_the_probability_resolution(sr_bits):
    """P(away) is frac rounded to sr_bits bits (ties to even): with sr_bits=1 only 0, 1/2 or 1."""
    fmt = FixedFormat(8, 0)
    fracs = np.arange(1, 16) / 16
    n = 20000
    for f in fracs:
        x = torch.full((n,), 5.0 + f, dtype=torch.float64)
        k = int((emunum.quantize(x, fmt, "stochastic", seed=5, sr_bits=sr_bits) == 6.0).sum())
        scaled = f * 2**sr_bits
        p = (math.floor(scaled) + (scaled - math.floor(scaled) > 0.5
                                   or (scaled - math.floor(scaled) == 0.5 and math.floor(scaled) % 2 == 1))) / 2**sr_bits
        if p in (0.0, 1.0):
            assert k == n * p, (f, k)
        else:
            assert abs(k - n * p) < 5 * math.sqrt(n * p * (1 - p)), (f, k, p)
    if sr_bits == 1:
        x = torch.full((n,), 5.0 + 0.3, dtype=torch.float64)  # 0.3 * 2 = 0.6 -> 1 -> P = 1/2
        k = int((emunum.quantize(x, fmt, "stochastic", seed=5, sr_bits=1) == 6.0).sum())
        assert abs(k - n / 2) < 5 * math.sqrt(n / 4)


def test_stochastic_same_seed_same_bits_and_seeds_differ():
    x = torch.linspace(-3, 3, 10001)
    a = emunum.quantize(x, "fp8_152", "stochastic", seed=42)
    b = emunum.quantize(x, "fp8_152", "stochastic", seed=42)
    c = emunum.quantize(x, "fp8_152", "stochastic", seed=43)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_stochastic_seed_none_draws_from_torch_generator():
    x = torch.linspace(-3, 3, 1001)
    torch.manual_seed(123)
    a = emunum.quantize(x, "e4m3fn", "stochastic")
    torch.manual_seed(123)
    b = emunum.quantize(x, "e4m3fn", "stochastic")
    c = emunum.quantize(x, "e4m3fn", "stochastic")
    assert torch.equal(a, b)
    assert not torch.equal(b, c)


def test_stochastic_bits_do_not_depend_on_numba_thread_count():
    numba = pytest.importorskip("numba")
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has a single thread here")
    x = torch.randn(1 << 17, generator=torch.Generator().manual_seed(0))
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = emunum.quantize(x, "fp8_152", "stochastic", seed=9)
        one_fx = emunum.quantize(x, "fixed16_12", "stochastic", seed=9)
        numba.set_num_threads(2)
        two = emunum.quantize(x, "fp8_152", "stochastic", seed=9)
        two_fx = emunum.quantize(x, "fixed16_12", "stochastic", seed=9)
    finally:
        numba.set_num_threads(before)
    assert torch.equal(one, two)
    assert torch.equal(one_fx, two_fx)


def test_stochastic_index_is_the_logical_c_order_index():
    """Strided inputs use the flat index of the logical (C-order) element, not of its storage."""
    x = torch.randn(64, 48, generator=torch.Generator().manual_seed(1))
    for v in (x.t(), x[::2, 5:], x[:, ::3]):
        a = emunum.quantize(v, "fp8_152", "stochastic", seed=77)
        b = emunum.quantize(v.contiguous(), "fp8_152", "stochastic", seed=77)
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------------------
# properties (hypothesis): formats and modes are drawn too, so that each example costs a few calls
# ---------------------------------------------------------------------------------------------------------
PROPERTY_SETTINGS = settings(max_examples=60, deadline=None)
PROPERTY_FLOATS = [PRESETS[n] for n in ("fp8_152", "fp8_143", "e4m3fn", "e4m3fnuz", "e5m2fnuz", "fp6_e3m2",
                                        "fp6_e2m3", "fp4_e2m1", "bf16", "fp16")] + [
    FloatFormat(3, 4, bias=5), FloatFormat(4, 3, subnormals=False), FloatFormat(5, 2, saturate=True),
    FloatFormat(4, 2, special="fnuz"), FloatFormat(2, 2, special="none", subnormals=False),
    FloatFormat(8, 3, bias=140)]
PROPERTY_FIXED = [PRESETS[n] for n in ("int8", "int4", "uint8", "fixed16_12")] + [
    FixedFormat(8, 3, saturate=False), FixedFormat(6, 2, signed=False), FixedFormat(5, -2)]
formats_st = st.sampled_from(PROPERTY_FLOATS + PROPERTY_FIXED)


def _arrays(width: int, allow_nan: bool = True):
    return hnp.arrays(np.float32 if width == 32 else np.float64, st.integers(1, 40),
                      elements=st.floats(width=width, allow_nan=allow_nan, allow_infinity=True))


def _allowed(fmt, x: np.ndarray, q: np.ndarray) -> np.ndarray:
    """q lies in fmt.values(), or is NaN/inf where fmt's policy allows it."""
    in_set = np.isin(q, fmt.values())
    if isinstance(fmt, FixedFormat):
        return in_set | (np.isnan(q) & np.isnan(x))
    nan_ok = np.isnan(x) | (fmt.overflow == emunum.formats.Overflow.NAN)
    inf_ok = fmt.overflow == emunum.formats.Overflow.INF
    return in_set | (np.isnan(q) & nan_ok) | (np.isinf(q) & inf_ok)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal values and sign bits, NaN equal to NaN."""
    an, bn = np.isnan(a), np.isnan(b)
    return bool(np.array_equal(an, bn) and np.array_equal(a[~an], b[~bn])
                and np.array_equal(np.signbit(a[~an]), np.signbit(b[~bn])))


@PROPERTY_SETTINGS
@given(fmt=formats_st, mode=st.sampled_from(list(RoundMode)), x=st.sampled_from([32, 64]).flatmap(_arrays))
def test_idempotent_and_in_value_set(fmt, mode, x):
    q = emunum.quantize(torch.from_numpy(x), fmt, mode, seed=1)
    qq = emunum.quantize(q, fmt, mode, seed=2)
    assert _same(q.numpy(), qq.numpy())
    assert _allowed(fmt, x, q.numpy().astype(np.float64)).all()


@PROPERTY_SETTINGS
@given(fmt=formats_st, mode=st.sampled_from(NONSTOCHASTIC), x=st.sampled_from([32, 64]).flatmap(
    lambda w: _arrays(w, allow_nan=False)))
def test_monotonic(fmt, mode, x):
    x = np.sort(x)
    if isinstance(fmt, FixedFormat) and not fmt.saturate:  # wrap-around is not monotonic by design
        x = np.clip(x, fmt.min, fmt.max)
    q = emunum.quantize(torch.from_numpy(x), fmt, mode).numpy()
    q = q[~np.isnan(q)]  # overflow to NaN (fn, fnuz) happens only at the two ends
    assert (q[1:] >= q[:-1]).all(), (x, q)


def _negated(fmt, q: np.ndarray) -> np.ndarray:
    n = -q
    has_negzero = isinstance(fmt, FloatFormat) and fmt.has_negative_zero
    return n if has_negzero else n + 0.0  # fnuz and fixed point have no -0


@PROPERTY_SETTINGS
@given(fmt=formats_st, mode=st.sampled_from(SYMMETRIC), x=st.sampled_from([32, 64]).flatmap(_arrays))
def test_sign_symmetry(fmt, mode, x):
    """q(-x) == -q(x) for nearest, nearest_away, toward_zero, odd and stochastic (same seed and index);
    up(-x) == -down(x). Fixed point: signed formats within +-max (the range is asymmetric)."""
    if isinstance(fmt, FixedFormat):
        if not fmt.signed:
            return  # negative values clamp or wrap
        x = np.clip(x, -fmt.max, fmt.max)
    t = torch.from_numpy(x)
    q, qn = (emunum.quantize(v, fmt, mode, seed=4).numpy() for v in (t, -t))
    assert _same(qn, _negated(fmt, q)), (x, q, qn)
    up_neg = emunum.quantize(-t, fmt, "up").numpy()
    assert _same(up_neg, _negated(fmt, emunum.quantize(t, fmt, "down").numpy()))


# ---------------------------------------------------------------------------------------------------------
# the tensor API
# ---------------------------------------------------------------------------------------------------------
ALL_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("name", ["fp8_152", "e4m3fnuz", "fp4_e2m1", "int8", "uint8"])
@pytest.mark.parametrize("mode", ["nearest", "stochastic"])
def test_every_float_dtype_gives_the_oracle_result(dtype, name, mode, oracles):
    fmt = PRESETS[name]
    x = (torch.randn(3001, generator=torch.Generator().manual_seed(2)) * 10).to(dtype)
    x[:4] = torch.tensor([0.0, -0.0, float("inf"), float("nan")])
    rnd = oracles.Rounding(RoundMode.parse(mode))
    got = emunum.quantize(x, fmt, mode, seed=oracles.SEED)
    assert got.dtype == dtype and got.shape == x.shape
    v = x.double().numpy()
    want = (oracles.gfloat_round(fmt, v, rnd) if isinstance(fmt, FloatFormat) else oracles.fixed_round(fmt, v, rnd))
    # every value of these formats is exact in all four dtypes, so the cast back is exact
    oracles.assert_same_values(got.double().numpy(), want, v, f"{name} {dtype}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_16_bit_inputs_round_through_float32_then_to_nearest_even(dtype):
    """Documented semantics where fmt's values do not fit the 16-bit dtype (fixed16_12 has 15-bit codes)."""
    x = (torch.randn(3000, generator=torch.Generator().manual_seed(12)) * 3).to(dtype)
    want = emunum.quantize(x.float(), "fixed16_12").to(dtype)
    assert torch.equal(emunum.quantize(x, "fixed16_12"), want)


@pytest.mark.parametrize("mode", ["nearest", "stochastic"])
def test_strided_inputs_equal_contiguous(mode):
    x = torch.randn(40, 30, generator=torch.Generator().manual_seed(3)) * 100
    views = [x.t(), x[::2, 3:], x[:, ::3], x[5], x.unsqueeze(0).expand(3, 40, 30), x.flip(0)]
    for v in views:
        assert torch.equal(emunum.quantize(v, "e4m3fn", mode, seed=8),
                           emunum.quantize(v.contiguous(), "e4m3fn", mode, seed=8))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_out_contiguous_and_strided_is_filled_and_returned(dtype):
    x = (torch.randn(20, 30, generator=torch.Generator().manual_seed(4)) * 50).to(dtype)
    want = emunum.quantize(x, "fp8_152")
    out = torch.full_like(x, 7.0)
    assert emunum.quantize(x, "fp8_152", out=out) is out
    assert torch.equal(out, want)
    base = torch.full((30, 20), 7.0, dtype=dtype)
    strided = base.t()
    assert not strided.is_contiguous()
    assert emunum.quantize(x, "fp8_152", out=strided) is strided
    assert torch.equal(strided, want)
    assert torch.equal(base, want.t())


def test_out_may_alias_the_input():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(5))
    want = emunum.quantize(x, "fp8_152")
    assert emunum.quantize(x, "fp8_152", out=x) is x
    assert torch.equal(x, want)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("mode", ["nearest", "stochastic"])
def test_input_is_never_modified(dtype, mode):
    x = (torch.randn(5000, generator=torch.Generator().manual_seed(6)) * 10).to(dtype)
    before = _bits(x).clone()
    for fmt in ("fp8_152", "int8"):
        emunum.quantize(x, fmt, mode, seed=0)
        emunum.quantize(x.t() if x.dim() > 1 else x[::2], fmt, mode, seed=0)
    assert torch.equal(_bits(x), before)


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 4, 5)])
def test_empty_tensor(shape):
    x = torch.empty(shape)
    q = emunum.quantize(x, "fp8_152")
    assert q.shape == x.shape and q.dtype == x.dtype and q.numel() == 0
    out = torch.empty(shape)
    assert emunum.quantize(x, "int8", out=out) is out


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_zero_dim_tensor(dtype):
    x = torch.tensor(1.3, dtype=dtype)
    q = emunum.quantize(x, "fp8_152")
    assert q.shape == () and q.dtype == dtype
    assert q.item() == 1.25


def test_requires_grad_input_works_and_returns_a_plain_tensor():
    x = torch.randn(10, 3, requires_grad=True)
    q = emunum.quantize(x, "e4m3fn")
    assert not q.requires_grad and q.grad_fn is None
    assert torch.equal(q, emunum.quantize(x.detach(), "e4m3fn"))
    assert x.grad is None


@pytest.mark.parametrize("shape", [(7,), (2, 3), (2, 3, 4, 5), (1, 1, 1)])
def test_shape_is_preserved(shape):
    x = torch.randn(shape)
    assert emunum.quantize(x, "e5m2fnuz").shape == x.shape


def test_format_and_mode_spellings_are_equivalent():
    x = torch.randn(500, generator=torch.Generator().manual_seed(9))
    ref = emunum.quantize(x, FloatFormat(5, 2), RoundMode.TOWARD_ZERO)
    for fmt in ("fp8_152", "E5M2", " fp8_e5m2 ", PRESETS["fp8_152"]):
        for mode in ("toward_zero", "TOWARD_ZERO", "rtz", RoundMode.TOWARD_ZERO):
            assert torch.equal(emunum.quantize(x, fmt, mode), ref)


# ---------------------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64])
def test_non_float_tensor_raises_type_error(dtype):
    x = torch.zeros(3, dtype=dtype)
    with pytest.raises(TypeError, match=rf"x\.dtype={dtype}.*allowed: float32, float64, float16, bfloat16"):
        emunum.quantize(x, "fp8_152")


def test_non_tensor_raises_type_error():
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        emunum.quantize([1.0, 2.0], "fp8_152")


def test_unknown_rounding_raises_listing_modes():
    with pytest.raises(ValueError, match=r"rounding='banana'.*allowed: nearest, nearest_away, toward_zero"):
        emunum.quantize(torch.ones(2), "fp8_152", "banana")


def test_unknown_format_raises_listing_presets():
    with pytest.raises(ValueError, match=r"fmt='fp7_zz'.*presets: .*fp8_152.*e4m3fn"):
        emunum.quantize(torch.ones(2), "fp7_zz")
    with pytest.raises(TypeError, match="fmt must be a FloatFormat, FixedFormat or a format name, got int"):
        emunum.quantize(torch.ones(2), 8)


@pytest.mark.parametrize("sr_bits,exc,msg", [
    (0, ValueError, r"sr_bits=0 is out of range; allowed: 1\.\.32"),
    (33, ValueError, r"sr_bits=33 is out of range; allowed: 1\.\.32"),
    ("8", TypeError, r"sr_bits must be an int in 1\.\.32, got '8'"),
    (True, TypeError, r"sr_bits must be an int in 1\.\.32, got True"),
    (8.0, TypeError, r"sr_bits must be an int in 1\.\.32, got 8\.0"),
])
def test_bad_sr_bits_raise(sr_bits, exc, msg):
    with pytest.raises(exc, match=msg):
        emunum.quantize(torch.ones(2), "fp8_152", "stochastic", seed=0, sr_bits=sr_bits)


def test_bad_seed_raises():
    with pytest.raises(TypeError, match=r"seed must be an int or None, got 1\.5"):
        emunum.quantize(torch.ones(2), "fp8_152", "stochastic", seed=1.5)


@pytest.mark.parametrize("out,msg", [
    (torch.empty(3), r"out must match x in shape, dtype and device: out is \(3,\) torch.float32"),
    (torch.empty(2, dtype=torch.float64), r"out is \(2,\) torch.float64"),
])
def test_bad_out_raises(out, msg):
    with pytest.raises(ValueError, match=msg):
        emunum.quantize(torch.ones(2), "fp8_152", out=out)
    with pytest.raises(TypeError, match="out must be a torch.Tensor, got ndarray"):
        emunum.quantize(torch.ones(2), "fp8_152", out=np.zeros(2, np.float32))
