"""Emulated arithmetic (emunum.arithmetic / emunum.emulated): each listed op's result equals the
independently rounded result (conftest's value-set oracle, zero tolerance), in-place and out= variants,
views and non-listed ops untouched, backward ops rounded inside the context, stochastic seeds, and one
training step of a hand-written approximate GELU with inferred gradients."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import emunum
from emunum import RoundMode
from emunum.arithmetic import ROUNDED_OPS
from emunum.ops import derive_seed

FMT = "bf16"


def _t(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * 3).to(dtype)


def _oracle_round(t: torch.Tensor, fmt, oracles, mode=RoundMode.NEAREST, seed=0) -> np.ndarray:
    v = t.detach().double().numpy()
    return oracles.value_set_round(emunum.get_format(fmt), v, oracles.Rounding(mode), seed=seed).reshape(v.shape)


BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
    "pow": lambda a, b: a.abs() ** b, "matmul": lambda a, b: a @ b.T, "bmm": lambda a, b: torch.bmm(a[None], b.T[None]),
    "maximum": torch.maximum, "addcmul": lambda a, b: torch.addcmul(a, a, b, value=0.3),
}
CORRECTLY_ROUNDED = ("add", "sub", "mul", "div", "maximum")  # float64 is exact or innocuous for these
UNARY = {
    "exp": torch.exp, "log": lambda a: torch.log(a.abs()), "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "sqrt": lambda a: a.abs().sqrt(), "sum": lambda a: a.sum(1), "mean": torch.mean, "softmax": lambda a: a.softmax(1),
    "gelu": torch.nn.functional.gelu, "neg": torch.neg, "cumsum": lambda a: a.cumsum(0),
    "layer_norm": lambda a: torch.nn.functional.layer_norm(a, (a.shape[1],)),
}


@pytest.mark.parametrize("fmt", ["bf16", "e4m3fn", "fp6_e2m3"])
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_op_inside_context_equals_rounded_result(name, fmt, oracles):
    """a op b with a, b format values: one op, one rounding (the last op of each lambda is the rounded one;
    inner ones such as abs() are exact on format values)."""
    a = emunum.quantize(_t(6, 5, seed=1), fmt)
    b = emunum.quantize(_t(6, 5, seed=2), fmt) + (0 if name != "div" else 1e-3)
    b = emunum.quantize(b, fmt)
    with emunum.arithmetic(fmt):
        got = BINARY[name](a, b)
    want = _oracle_round(BINARY[name](a, b), fmt, oracles)
    oracles.assert_same_values(got.numpy(), want, what=f"{name} {fmt}")
    if name in CORRECTLY_ROUNDED:  # the documented claim: the same as one rounding of the exact result
        exact = _oracle_round(BINARY[name](a.double(), b.double()), fmt, oracles)
        oracles.assert_same_values(got.numpy(), exact, what=f"{name} {fmt} vs exact")


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_op_inside_context_equals_rounded_result(name, oracles):
    a = emunum.quantize(_t(4, 7, seed=3), FMT)
    with emunum.arithmetic(FMT):
        got = UNARY[name](a)
    oracles.assert_same_values(got.numpy(), _oracle_round(UNARY[name](a), FMT, oracles), what=name)
    if name in ("sqrt", "neg"):  # correctly rounded: equal to one rounding of the float64 result
        oracles.assert_same_values(got.numpy(), _oracle_round(UNARY[name](a.double()), FMT, oracles), what=name)


@pytest.mark.parametrize("fmt", ["fp16", "e4m10", "e3m10"])
def test_sqrt_of_every_positive_value_is_one_rounding_of_the_exact_root(fmt, oracles):
    """The documented claim at man = 10, its edge, on every value: torch's CPU float32 sqrt is itself not
    correctly rounded (MKL's vector math: 1 ulp off for about 0.6% of inputs), yet rounding it to fmt gives
    the correctly rounded root."""
    vals = emunum.get_format(fmt).values()
    x = torch.from_numpy(vals[np.isfinite(vals) & (vals > 0)]).float()
    with emunum.arithmetic(fmt):
        got = torch.sqrt(x)
    oracles.assert_same_values(got.numpy(), _oracle_round(torch.sqrt(x.double()), fmt, oracles), what=f"sqrt {fmt}")


def test_every_primitive_of_a_composite_expression_is_rounded(oracles):
    a, b, c = (emunum.quantize(_t(50, seed=s), "e4m3fn") for s in (4, 5, 6))
    with emunum.arithmetic("e4m3fn"):
        got = a * b + c

    def r(t):
        return torch.from_numpy(_oracle_round(t, "e4m3fn", oracles))

    oracles.assert_same_values(got.numpy(), r(r(a * b) + c).numpy(), what="a*b+c")
    assert not torch.equal(got, r(a * b + c))  # one rounding of the fused result differs: two roundings happened


def test_float64_and_bfloat16_tensors_are_rounded_in_their_dtype(oracles):
    for dtype in (torch.float64, torch.bfloat16):
        a, b = _t(40, seed=7, dtype=dtype), _t(40, seed=8, dtype=dtype)
        with emunum.arithmetic("fp8_152"):
            got = a * b
        assert got.dtype == dtype
        oracles.assert_same_values(got.double().numpy(), _oracle_round(a * b, "fp8_152", oracles), what=str(dtype))


def test_in_place_and_out_variants_round_the_written_tensor(oracles):
    a, b = _t(30, seed=9), _t(30, seed=10)
    want = _oracle_round(a * b, FMT, oracles)
    x = a.clone()
    with emunum.arithmetic(FMT):
        x.mul_(b)
        out = torch.empty(30)
        torch.mul(a, b, out=out)
        view = a.clone().view(3, 10)
        view[:, 1].mul_(2.5)
    oracles.assert_same_values(x.numpy(), want, what="mul_")
    oracles.assert_same_values(out.numpy(), want, what="out=")
    col = a.view(3, 10)[:, 1] * 2.5
    oracles.assert_same_values(view[:, 1].numpy(), _oracle_round(col, FMT, oracles), what="strided in-place")
    assert torch.equal(view[:, 0], a.view(3, 10)[:, 0])  # neighbours of the strided write untouched


def test_inputs_views_and_unlisted_ops_are_left_alone():
    a = _t(4, 6, seed=11)
    keep = a.clone()
    with emunum.arithmetic("fp4_e2m1"):
        v = a.t()
        c = torch.cat([a, a])
        w = torch.where(a > 0, a, torch.zeros_like(a))
        idx = a.argmax()
    assert torch.equal(a, keep) and torch.equal(v, keep.t()) and torch.equal(c, torch.cat([keep, keep]))
    assert torch.equal(w, keep.clamp(min=0)) and idx.dtype == torch.int64


def test_outside_the_context_nothing_is_rounded():
    a, b = _t(20, seed=12), _t(20, seed=13)
    with emunum.arithmetic("fp4_e2m1"):
        pass
    assert not torch.equal(a * b, emunum.quantize(a * b, "fp4_e2m1"))


def test_backward_inside_the_context_rounds_gradients_and_outside_does_not(oracles):
    x = _t(64, seed=14).requires_grad_(True)
    g = _t(64, seed=15)
    with emunum.arithmetic(FMT):
        y = torch.tanh(x)
        y.backward(g)
    want = _oracle_round(torch.ops.aten.tanh_backward(g, y.detach()), FMT, oracles)  # autograd's formula, rounded
    oracles.assert_same_values(x.grad.numpy(), want, what="tanh backward inside")
    x.grad = None
    with emunum.arithmetic(FMT):
        y = torch.tanh(x)
    y.backward(g)
    assert torch.equal(x.grad, torch.ops.aten.tanh_backward(g, y.detach()))  # unrounded
    assert not torch.equal(x.grad, emunum.quantize(x.grad, FMT))


def test_stochastic_rounding_uses_derived_seed_per_rounded_tensor(oracles):
    a, b = _t(500, seed=16), _t(500, seed=17)
    with emunum.arithmetic("fp8_152", "stochastic", seed=99):
        p = a * b
        s = p + a
    rp = _oracle_round(a * b, "fp8_152", oracles, RoundMode.STOCHASTIC, derive_seed(99, 0))
    oracles.assert_same_values(p.numpy(), rp, what="first op")
    rs = _oracle_round(torch.from_numpy(rp).float() + a, "fp8_152", oracles, RoundMode.STOCHASTIC, derive_seed(99, 1))
    oracles.assert_same_values(s.numpy(), rs, what="second op")
    with emunum.arithmetic("fp8_152", "stochastic", seed=99):
        assert torch.equal(a * b, p)
    with emunum.arithmetic("fp8_152", "stochastic"):
        q1, q2 = a * b, a * b
    assert not torch.equal(q1, q2)


def test_emulated_decorator_equals_the_context():
    @emunum.emulated("e4m3fn", rounding="toward_zero")
    def f(x, y):
        return torch.exp(x) * y - 1

    a, b = _t(33, seed=18), _t(33, seed=19)
    with emunum.arithmetic("e4m3fn", rounding="toward_zero"):
        want = torch.exp(a) * b - 1
    assert torch.equal(f(a, b), want)
    assert f.__name__ == "f"


def test_approximate_gelu_trains_one_step_with_inferred_gradients():
    @emunum.emulated(FMT)
    def gelu(x):
        return 0.5 * x * (1 + torch.tanh(0.79788456 * (x + 0.044715 * x**3)))

    torch.manual_seed(0)
    lin1, lin2 = torch.nn.Linear(4, 16), torch.nn.Linear(16, 1)
    x = torch.randn(64, 4)
    target = (x[:, :1] - x[:, 1:2]).relu()
    params = list(lin1.parameters()) + list(lin2.parameters())
    opt = torch.optim.SGD(params, lr=0.1)

    def loss():
        return ((lin2(gelu(lin1(x))) - target) ** 2).mean()

    before = loss()
    opt.zero_grad()
    before.backward()
    grads = [p.grad for p in params]
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
    opt.step()
    with torch.no_grad():
        assert loss() < before.detach()
    with torch.no_grad():  # the activation really is rounded: its outputs are bf16 values
        h = gelu(lin1(x))
        assert torch.equal(h, emunum.quantize(h, FMT))


def test_rounded_op_list_is_explicit_and_resolves_to_aten_ops():
    names = [n for group in ROUNDED_OPS.values() for n in group]
    assert len(names) == len(set(names))
    for must in ("add", "sub", "mul", "div", "exp", "log", "tanh", "sigmoid", "sqrt", "pow", "mm", "bmm", "sum",
                 "mean", "addmm"):
        assert must in names
    from emunum.arithmetic import _packets

    assert len(_packets()) > len(names)  # every name resolves, most with an in-place form


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(fmt="fp9"), ValueError, "not a known format"),
    (dict(fmt="bf16", rounding="sideways"), ValueError, "rounding='sideways'"),
    (dict(fmt="bf16", seed="x"), TypeError, "seed must be an int"),
    (dict(fmt="bf16", sr_bits=0), ValueError, "sr_bits=0"),
])
def test_bad_arguments_raise(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        emunum.arithmetic(**kwargs)
    with pytest.raises(exc, match=match):
        emunum.emulated(**kwargs)
