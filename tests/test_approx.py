"""Approximate operators (emunum.approx): datapath bits against independent numpy re-implementations that
round after every primitive with conftest's value-set oracle (zero tolerance), the documented error bounds
(measured <= documented <= 2x measured), closure in the format, special values, both gradient choices,
seeds, modules and input validation."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import emunum
from emunum import RoundMode
from emunum.approx import errors
from emunum.approx import softmax_method as softmax_module
from emunum.approx.base import REGISTRY
from emunum.approx.fit import lambert_tanh, remez, tanh_taylor
from emunum.ops import derive_seed

A = emunum.approx


class NumpyDatapath:
    """Independent datapath: float64 numpy arithmetic, each primitive rounded by conftest's value-set oracle
    (no emunum rounding code), with the same per-rounding seed sequence as ``emunum.approx.Datapath``."""

    def __init__(self, fmt, mode, seed, oracles):
        self.fmt, self.mode, self.seed, self.o = emunum.get_format(fmt), mode, seed, oracles
        self.k = 0

    def r(self, v):
        v = np.asarray(v, dtype=np.float64)
        seed = 0
        if self.mode == RoundMode.STOCHASTIC:
            seed = derive_seed(self.seed, self.k)
            self.k += 1
        return self.o.value_set_round(self.fmt, v, self.o.Rounding(self.mode), seed=seed).reshape(v.shape)

    def design(self, v):
        v = np.asarray(v, dtype=np.float64)
        return self.o.value_set_round(self.fmt, v, self.o.Rounding(RoundMode.NEAREST)).reshape(v.shape)


def _probe(n=3000, r=9.0, seed=0):
    g = np.random.default_rng(seed)
    x = np.concatenate([g.uniform(-r, r, n), [0.0, -0.0, 1.0, -1.0, 4.0, -4.0, 1e-3, 20.0, -20.0]])
    return x.astype(np.float32)


MODES = [RoundMode.NEAREST, RoundMode.STOCHASTIC]


@pytest.mark.parametrize("fmt", ["bf16", "e4m3fn"])
@pytest.mark.parametrize("mode", MODES, ids=[m.name.lower() for m in MODES])
def test_tanh_pwl_bits_equal_independent_datapath(fmt, mode, oracles):
    x = _probe()
    got = A.tanh(torch.from_numpy(x), "pwl", fmt=fmt, rounding=mode, seed=77, segments=8, range=3.0).numpy()
    dp = NumpyDatapath(fmt, mode, 77, oracles)
    xin = dp.r(x)
    a = np.abs(xin)
    h = 3.0 / 8
    b = np.arange(9) * h
    slope = np.diff(np.tanh(b)) / h
    icpt = np.tanh(b[:-1]) - slope * b[:-1]
    idx = np.clip(np.floor(a / h), 0, 7).astype(int)
    y = dp.r(dp.r(dp.design(slope)[idx] * a) + dp.design(icpt)[idx])
    y = np.where(a >= 3.0, 1.0, y)
    want = np.where(xin < 0, -y, y).astype(np.float32)
    oracles.assert_same_values(got, want, x, f"pwl {fmt} {mode.name}")


@pytest.mark.parametrize("fmt", ["bf16", "fp8_152"])
@pytest.mark.parametrize("mode", MODES, ids=[m.name.lower() for m in MODES])
def test_sigmoid_plan_bits_equal_independent_datapath(fmt, mode, oracles):
    x = _probe(seed=1)
    got = A.sigmoid(torch.from_numpy(x), "plan", fmt=fmt, rounding=mode, seed=5).numpy()
    dp = NumpyDatapath(fmt, mode, 5, oracles)
    xin = dp.r(x)
    a = np.abs(xin)
    c = dp.design  # the paper's constants, as the format holds them
    y = dp.r(dp.r(a * c(0.25)) + c(0.5))
    seg1 = dp.r(dp.r(a * c(0.125)) + c(0.625))
    y = np.where(a >= c(1.0), seg1, y)
    seg2 = dp.r(dp.r(a * c(0.03125)) + c(0.84375))
    y = np.where(a >= c(2.375), seg2, y)
    y = np.where(a >= c(5.0), 1.0, y)
    want = np.where(xin < 0, dp.r(1.0 - y), y).astype(np.float32)
    oracles.assert_same_values(got, want, x, f"plan {fmt} {mode.name}")


@pytest.mark.parametrize("interpolate", [False, True])
def test_tanh_lut_bits_equal_independent_datapath(interpolate, oracles):
    x = _probe(seed=2)
    fmt, n, r = "bf16", 33, 4.0
    got = A.tanh(torch.from_numpy(x), "lut", fmt=fmt, entries=n, range=r, interpolate=interpolate).numpy()
    dp = NumpyDatapath(fmt, RoundMode.NEAREST, 0, oracles)
    xin = dp.r(x)
    h = 2 * r / (n - 1)
    T = dp.design(np.tanh(-r + np.arange(n) * h))
    t = np.clip((xin + r) / h, 0, n - 1)
    if interpolate:
        i = np.minimum(np.floor(t), n - 2).astype(int)
        want = dp.r(T[i] + dp.r(dp.r(t - i) * dp.r(T[i + 1] - T[i])))
    else:
        want = T[np.floor(t + 0.5).astype(int)]
    oracles.assert_same_values(got, want.astype(np.float32), x, f"lut interpolate={interpolate}")


def test_tanh_rational_pade_bits_equal_independent_datapath(oracles):
    x = _probe(seed=3)
    fmt = "bf16"
    got = A.tanh(torch.from_numpy(x), "rational", fmt=fmt, depth=4).numpy()
    clip = REGISTRY["tanh"]["rational"](fmt, depth=4).clip
    p, q = lambert_tanh(4)
    dp = NumpyDatapath(fmt, RoundMode.NEAREST, 0, oracles)
    xin = dp.r(x)
    a = np.minimum(np.where(xin < 0, -xin, xin), clip)  # sign-magnitude: -0 keeps its sign
    u = dp.r(a * a)

    def horner(c):
        acc = np.full_like(u, c[-1])
        for cc in reversed(c[:-1]):
            acc = dp.r(dp.r(acc * u) + cc)
        return acc

    y = np.minimum(dp.r(dp.r(a * horner(dp.design(p))) / horner(dp.design(q))), 1.0)
    oracles.assert_same_values(got, np.where(xin < 0, -y, y).astype(np.float32), x, "rational")


def test_softmax_bits_equal_independent_datapath(oracles):
    g = np.random.default_rng(4)
    x = (4 * g.standard_normal((40, 11))).astype(np.float32)
    x[0, 3] = -np.inf
    fmt = "bf16"
    got = A.softmax(torch.from_numpy(x), dim=1, fmt=fmt).numpy()
    dp = NumpyDatapath(fmt, RoundMode.NEAREST, 0, oracles)
    z = dp.r(dp.r(x) * dp.design(1 / math.log(2)))
    d = dp.r(z - z.max(axis=1, keepdims=True))
    dc = np.clip(d, -1100, 1100)
    i = np.floor(dc)
    f = dp.r(dc - i)
    c = dp.design(remez(np.exp2, [0, 1, 2, 3], 0.0, 1.0)[0])
    acc = np.full_like(f, c[-1])
    for cc in reversed(c[:-1]):
        acc = dp.r(dp.r(acc * f) + cc)
    e = dp.r(acc * np.exp2(i))
    s = np.pad(e, ((0, 0), (0, 5)))  # 11 -> 16: a 4-level adder tree
    while s.shape[1] > 1:
        s = dp.r(s[:, 0::2] + s[:, 1::2])
    want = dp.r(e / s)
    oracles.assert_same_values(got, want.astype(np.float32), x, "softmax")
    assert got[0, 3] == 0.0


# ---- documented error bounds ---------------------------------------------------------------------------
CASES = [(f, m, fmt) for f, m in errors.cases() for fmt in errors.FORMATS]


@pytest.mark.parametrize("function,method,fmt", CASES, ids=[f"{f}-{m}-{fmt}" for f, m, fmt in CASES])
def test_measured_error_is_within_documented_bound_and_bound_is_tight(function, method, fmt):
    measured = errors.max_error(function, method, fmt)
    bound = errors.documented(function, method, fmt)
    assert measured <= bound <= 2 * measured, (measured, bound)


@pytest.mark.parametrize("function,method", [(f, m) for f, m in errors.cases() if m is not None])
def test_docstring_states_the_documented_bounds(function, method):
    cls = REGISTRY[function][method]
    doc = " ".join(cls.__doc__.split())
    for fmt, err in cls.MAX_ERROR.items():
        assert f"{fmt}: {err:.2g}" in doc
    for name, p in cls.PARAMS.items():
        assert f"{name}={p.default!r}" in doc


def test_softmax_docstring_states_its_bounds():
    doc = " ".join(softmax_module.__doc__.split())
    for fmt, err in errors.SOFTMAX_MAX_ERROR.items():
        assert f"{fmt}: {err:.2g}" in doc


# ---- closure, special values, dtypes -------------------------------------------------------------------
CLOSURE = [("tanh", m, fmt) for m in A.TANH_METHODS for fmt in ("e4m3fn", "fp8_152", "fixed16_12")] + [
    ("sigmoid", m, fmt) for m in A.SIGMOID_METHODS for fmt in ("e4m3fn", "bf16")] + [
    ("exp2", m, "fp8_152") for m in A.EXP2_METHODS]


@pytest.mark.parametrize("function,method,fmt", CLOSURE, ids=[f"{f}-{m}-{fmt}" for f, m, fmt in CLOSURE])
@pytest.mark.parametrize("mode", ["toward_zero", "stochastic"])
def test_every_output_is_a_value_of_the_format(function, method, fmt, mode):
    x = torch.from_numpy(_probe(500, r=6.0, seed=6))
    y = getattr(A, function)(x, method, fmt=fmt, rounding=mode, seed=3)
    finite = torch.isfinite(y)
    assert finite.sum() > 450
    assert torch.equal(emunum.quantize(y[finite], fmt), y[finite])


SAT = [("tanh", m) for m in A.TANH_METHODS] + [("sigmoid", m) for m in A.SIGMOID_METHODS]


@pytest.mark.parametrize("function,method", SAT, ids=[f"{f}-{m}" for f, m in SAT])
def test_infinities_saturate_and_nan_propagates(function, method):
    x = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0])
    y = getattr(A, function)(x, method)
    lo, mid = (-1.0, 0.0) if function == "tanh" else (0.0, 0.5)
    bound = REGISTRY[function][method].MAX_ERROR["fp32"]
    torch.testing.assert_close(y[[0, 1, 3]], torch.tensor([1.0, lo, mid]), atol=bound, rtol=0)
    assert torch.isnan(y[2])


def test_exp2_special_values_and_exact_table_points():
    x = torch.tensor([-float("inf"), float("inf"), float("nan"), -2000.0, 3.0, -5.0, 0.5])
    y = A.exp2(x, "lut", interpolate=False)
    assert y[0] == 0 and y[1] == float("inf") and torch.isnan(y[2]) and y[3] == 0
    assert y[4] == 8.0 and y[5] == 2.0**-5
    assert y[6] == emunum.quantize(torch.tensor([2**0.5]), "fp32")  # entry 16 of 32: 2**(16/32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_result_has_input_dtype_and_input_is_untouched(dtype):
    x = torch.linspace(-3, 3, 50, dtype=dtype)
    keep = x.clone()
    for f in (A.tanh, A.sigmoid, A.exp2):
        assert f(x, fmt="bf16").dtype == dtype
    assert A.softmax(x.view(5, 10), fmt="bf16").dtype == dtype
    assert torch.equal(x, keep)


# ---- gradients -----------------------------------------------------------------------------------------
def test_approx_gradient_of_pwl_is_the_rounded_segment_slope():
    x = torch.linspace(-5.3, 5.3, 401, dtype=torch.float32)
    x = x[(x / 0.25 - torch.round(x / 0.25)).abs() > 1e-3].requires_grad_(True)  # off the breakpoints
    A.tanh(x, "pwl", fmt="bf16").backward(torch.ones_like(x))
    m = REGISTRY["tanh"]["pwl"]("bf16")
    a = emunum.quantize(x.detach(), "bf16").abs()
    want = torch.tensor(m.slope, dtype=torch.float32)[torch.clamp((a / m.h).floor().long(), max=15)]
    want = torch.where(a >= 4.0, torch.zeros_like(want), want)
    assert torch.equal(x.grad, want)


def test_approx_gradient_of_hard_tanh_and_step_functions_need_exact_grad():
    x = torch.tensor([-2.0, -0.5, 0.0, 0.7, 1.5], requires_grad=True)
    A.tanh(x, "hard").sum().backward()
    assert torch.equal(x.grad, torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0]))
    with pytest.raises(ValueError, match="piecewise constant.*allowed: grad='exact', or interpolate=True"):
        A.tanh(x, "lut", interpolate=False)  # a step function: its own gradient would be 0 everywhere
    with pytest.raises(ValueError, match="piecewise constant"):
        A.Softmax(exp2="lut", interpolate=False)(x)
    with torch.no_grad():
        A.tanh(x, "lut", interpolate=False)  # no gradient wanted: fine
    x.grad = None
    A.tanh(x, "lut", interpolate=False, grad="exact").sum().backward()
    torch.testing.assert_close(x.grad, 1 - x.detach().tanh() ** 2, rtol=1e-6, atol=0)


@pytest.mark.parametrize("function,method,params", [("tanh", "rational", {}), ("tanh", "poly", {}),
                                                    ("tanh", "lut", {}), ("sigmoid", "exp2", {}),
                                                    ("exp2", "poly", {})])
def test_approx_gradient_matches_finite_differences_in_fp32(function, method, params):
    """In fmt fp32 on float64 inputs every rounding is locally (1e-7) the identity, so the straight-through
    derivative of the datapath must match finite differences of the approximation itself."""
    x = torch.tensor([-2.1, -0.7, -0.05, 0.33, 1.2, 1.9], dtype=torch.float64, requires_grad=True)
    f = lambda t: getattr(A, function)(t, method, fmt="fp32", **params)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x,), eps=1e-4, atol=5e-3, rtol=1e-2, fast_mode=True)


@pytest.mark.parametrize("function,method,exact", [("tanh", "pwl", lambda t: 1 - t.tanh() ** 2),
                                                   ("sigmoid", "plan", lambda t: t.sigmoid() * (1 - t.sigmoid())),
                                                   ("exp2", "lut", lambda t: t.exp2() * math.log(2))])
def test_exact_gradient_is_the_exact_functions_derivative(function, method, exact):
    x = torch.linspace(-6, 6, 97, dtype=torch.float64, requires_grad=True)
    y = getattr(A, function)(x, method, fmt="bf16", grad="exact")
    assert torch.equal(y.detach(), getattr(A, function)(x.detach(), method, fmt="bf16"))
    y.backward(torch.ones_like(x))
    torch.testing.assert_close(x.grad, exact(x.detach()), rtol=1e-12, atol=1e-15)


def test_exact_gradient_of_softmax_is_the_softmax_jacobian():
    x = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)
    g = torch.randn(4, 7, dtype=torch.float64)
    A.softmax(x, dim=0, fmt="bf16", grad="exact").backward(g)
    x2 = x.detach().requires_grad_(True)
    torch.softmax(x2, 0).backward(g)
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-12, atol=1e-15)


def test_approx_softmax_trains_with_finite_nonzero_gradients():
    x = torch.randn(3, 9, requires_grad=True)
    A.softmax(x, fmt="bf16")[:, 0].sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


# ---- seeds ---------------------------------------------------------------------------------------------
def test_stochastic_rounding_is_repeatable_with_a_seed_and_fresh_without():
    x = torch.linspace(-3, 3, 2001)
    a = A.tanh(x, "rational", fmt="bf16", rounding="stochastic", seed=1)
    assert torch.equal(a, A.tanh(x, "rational", fmt="bf16", rounding="stochastic", seed=1))
    assert not torch.equal(a, A.tanh(x, "rational", fmt="bf16", rounding="stochastic", seed=2))
    b = A.tanh(x, "rational", fmt="bf16", rounding="stochastic")
    assert not torch.equal(b, A.tanh(x, "rational", fmt="bf16", rounding="stochastic"))


# ---- fitting helpers -----------------------------------------------------------------------------------
def test_taylor_coefficients_of_tanh():
    assert tanh_taylor(4) == (1.0, -1 / 3, 2 / 15, -17 / 315)


@pytest.mark.parametrize("depth", [1, 2, 3, 5, 7])
def test_lambert_pade_equals_the_continued_fraction(depth):
    x = np.linspace(-5, 5, 101)
    p, q = lambert_tanh(depth)
    u = x * x
    pade = x * np.polyval(p[::-1], u) / np.polyval(q[::-1], u)
    d = np.full_like(x, 2 * depth - 1.0)
    for j in range(depth - 1, 0, -1):
        d = (2 * j - 1) + u / d
    np.testing.assert_allclose(pade, x / d, rtol=1e-13, atol=1e-15)


def test_remez_equioscillates():
    c, err = remez(np.exp2, [0, 1, 2, 3], 0.0, 1.0)
    xs = np.linspace(0, 1, 20001)
    e = np.exp2(xs) - np.polyval(c[::-1], xs)
    assert abs(np.abs(e).max() - err) < 1e-9
    # n + 2 = 5 alternating extrema of equal size: the endpoints and three interior ones
    signs = np.sign(e[np.abs(e) > 0.999 * err])
    assert (np.diff(signs) != 0).sum() >= 4
    lsq = np.polynomial.polynomial.polyfit(xs, np.exp2(xs), 3)
    assert err < np.abs(np.exp2(xs) - np.polynomial.polynomial.polyval(xs, lsq)).max()


# ---- modules -------------------------------------------------------------------------------------------
def test_modules_match_functions_and_show_their_settings():
    x = torch.randn(5, 6)
    t = A.Tanh("lut", fmt="bf16", grad="exact", entries=32)
    assert repr(t) == ("Tanh(method=lut, fmt=e8m7, rounding=nearest, grad=exact, entries=32, range=4.0, "
                       "interpolate=True)")
    assert torch.equal(t(x), A.tanh(x, "lut", fmt="bf16", entries=32))
    s = A.Sigmoid("plan", fmt="fp8_152", rounding="toward_zero")
    assert torch.equal(s(x), A.sigmoid(x, "plan", fmt="fp8_152", rounding="toward_zero"))
    sm = A.Softmax(dim=0, exp2="lut", fmt="bf16", entries=16)
    assert "dim=0, exp2=lut, fmt=e8m7" in repr(sm)
    assert torch.equal(sm(x), A.softmax(x, 0, exp2="lut", fmt="bf16", entries=16))
    assert t.state_dict() == {} and list(sm.parameters()) == []


# ---- validation ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("call,exc,match", [
    (lambda x: A.tanh(x, "cordic"), ValueError, "method='cordic'.*allowed: pwl, lut, hard, rational, poly, sigmoid"),
    (lambda x: A.sigmoid(x, "pwl", entries=4), ValueError, "no parameter entries; allowed: segments, range"),
    (lambda x: A.tanh(x, "pwl", segments=0), ValueError, "segments=0 is out of range"),
    (lambda x: A.tanh(x, "pwl", segments=2.5), TypeError, "segments must be an int"),
    (lambda x: A.tanh(x, "poly", degree=4), ValueError, "degree=4 must be odd"),
    (lambda x: A.tanh(x, "poly", coeffs="chebyshev"), ValueError, "allowed: minimax, taylor"),
    (lambda x: A.tanh(x, "lut", interpolate=1), TypeError, "interpolate must be a bool"),
    (lambda x: A.tanh(x, grad="numeric"), ValueError, "grad='numeric'.*allowed: approx, exact"),
    (lambda x: A.tanh(x, rounding="sideways"), ValueError, "rounding='sideways'"),
    (lambda x: A.tanh(x, "pwl", fmt="fixed8_6"), ValueError, "fixed8_6 cannot hold the range 4"),
    (lambda x: A.tanh(x, "hard", fmt="fixed8_7"), ValueError, "cannot hold the constant 1"),
    (lambda x: A.tanh(x, fmt="fp9"), ValueError, "not a known format"),
    (lambda x: A.softmax(x, dim=1.0), TypeError, "dim must be an int"),
    (lambda x: A.softmax(x, exp2="taylor"), ValueError, "allowed: poly, lut"),
    (lambda x: A.tanh(x.int()), TypeError, "dtype"),
    (lambda x: A.Tanh("pwl", grad="exact", segments=-1), ValueError, "segments=-1"),
])
def test_bad_input_raises_naming_the_choices(call, exc, match):
    with pytest.raises(exc, match=match):
        call(torch.ones(3))


def test_modules_compile_fullgraph_with_the_same_bits_and_gradients():
    """torch.compile(fullgraph=True) with the aot_eager backend, for the methods test_ops' inductor model
    does not use (it has tanh pwl and softmax poly)."""
    x = torch.randn(16, 8, requires_grad=True)
    mods = ([A.Tanh(m, fmt="bf16") for m in ("lut", "rational", "poly")]
            + [A.Sigmoid("plan", fmt="e4m3fn", grad="exact"),
               A.Softmax(1, exp2="lut", fmt="bf16", rounding="stochastic", seed=4)])
    for m in mods:
        torch._dynamo.reset()  # one module class, many instances: keep clear of the recompile limit
        compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
        a, b = m(x), compiled(x)
        (ga,) = torch.autograd.grad((a * a).sum(), x)
        (gb,) = torch.autograd.grad((b * b).sum(), x)
        assert torch.equal(a, b) and torch.equal(ga, gb), m
    torch._dynamo.reset()
