"""The torch custom ops (emunum::quantize, emunum::quantize_ste, emunum::exact_grad): format encoding,
bits against the independent oracles of conftest.py (zero tolerance), opcheck, seeds, and one
torch.compile(fullgraph=True) model giving the same bits as eager."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import emunum
from emunum import FixedFormat, FloatFormat, RoundMode
from emunum.formats import PRESETS
from emunum.ops import derive_seed, format_from_args, format_to_args

CUSTOM_FORMATS = [FloatFormat(4, 3, bias=5, subnormals=False), FloatFormat(5, 2, saturate=True),
                  FloatFormat(3, 1, special="fnuz", subnormals=False, saturate=True), FixedFormat(8, 3, saturate=False),
                  FixedFormat(6, 2, signed=False), FixedFormat(5, -2)]
ALL_FORMATS = list(PRESETS.values()) + CUSTOM_FORMATS


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=[f.name for f in ALL_FORMATS])
def test_format_args_round_trip_is_identity(fmt):
    args = format_to_args(fmt)
    assert all(type(a) is int for a in args)
    back = format_from_args(args)
    assert back == fmt and back.to_kernel_args() == fmt.to_kernel_args()


def test_format_args_of_none_is_empty_and_back():
    assert format_to_args(None) == [] and format_from_args([]) is None


@pytest.mark.parametrize("bad", [[2, 1, 1], [0, 4, 3], [1, 8, 0, 1]])
def test_format_from_args_rejects_malformed_lists(bad):
    with pytest.raises(ValueError, match="not an encoded format"):
        format_from_args(bad)


def test_derive_seed_is_deterministic_distinct_and_fits_int64():
    seeds = {derive_seed(7, k) for k in range(1000)}
    assert len(seeds) == 1000 and all(0 <= s < 2**62 for s in seeds)
    assert derive_seed(7, 3) == derive_seed(7, 3) and derive_seed(8, 3) != derive_seed(7, 3)
    assert derive_seed(None, 3) is None


OP_CASES = [("e4m3fn", RoundMode.NEAREST), ("fp8_152", RoundMode.STOCHASTIC), ("fp6_e2m3", RoundMode.ODD),
            ("e5m2fnuz", RoundMode.DOWN), ("bf16", RoundMode.NEAREST_AWAY)]


@pytest.mark.parametrize("name,mode", OP_CASES, ids=[f"{n}-{m.name.lower()}" for n, m in OP_CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_quantize_op_matches_value_set_oracle(name, mode, dtype, oracles):
    fmt = PRESETS[name] if name in PRESETS else emunum.get_format(name)
    v = oracles.float_probes(fmt, np.float32 if dtype == torch.float32 else np.float64)[:6000]
    x = torch.from_numpy(np.array(v))
    got = torch.ops.emunum.quantize(x, format_to_args(fmt), int(mode), oracles.SEED, 32)
    want = oracles.value_set_round(fmt, v, oracles.Rounding(mode), seed=oracles.SEED)
    oracles.assert_same_values(got.numpy(), want, v, f"emunum::quantize {name} {mode.name}")


@pytest.mark.parametrize("mode", [RoundMode.NEAREST, RoundMode.STOCHASTIC])
def test_quantize_op_fixed_point_matches_integer_oracle(mode, oracles):
    fmt = FixedFormat(8, 3, saturate=False)
    v = oracles.fixed_probes(fmt, np.float64)[:3000]
    got = torch.ops.emunum.quantize(torch.from_numpy(np.array(v)), format_to_args(fmt), int(mode), 11, 32)
    oracles.assert_same_values(got.numpy(), oracles.fixed_round(fmt, v, oracles.Rounding(mode), seed=11), v,
                               f"fixed {mode.name}")


def test_quantize_op_gradient_is_straight_through_identity():
    x = torch.randn(50, dtype=torch.float64, requires_grad=True)
    g = torch.randn(50, dtype=torch.float64)
    torch.ops.emunum.quantize(x, format_to_args("fp8_152"), 0, None, 32).backward(g)
    assert torch.equal(x.grad, g)


def test_quantize_op_seed_none_is_fresh_per_call_and_follows_manual_seed():
    x = torch.rand(4096) * 2
    args = (format_to_args("fp8_152"), int(RoundMode.STOCHASTIC), None, 32)
    torch.manual_seed(3)
    a, b = torch.ops.emunum.quantize(x, *args), torch.ops.emunum.quantize(x, *args)
    torch.manual_seed(3)
    c = torch.ops.emunum.quantize(x, *args)
    assert not torch.equal(a, b)
    assert torch.equal(a, c)


def test_quantize_op_never_modifies_or_aliases_its_input():
    x = torch.randn(64)
    keep = x.clone()
    y = torch.ops.emunum.quantize(x, format_to_args("fp4_e2m1"), 0, None, 32)
    assert torch.equal(x, keep) and y.data_ptr() != x.data_ptr()
    z = torch.ops.emunum.quantize_ste(x, [], 0, [], 6, False, None, 32)
    assert torch.equal(z, x) and z.data_ptr() != x.data_ptr()


def test_exact_grad_op_returns_value_and_rejects_unknown_function():
    v, x = torch.randn(5), torch.randn(5)
    assert torch.equal(torch.ops.emunum.exact_grad(v, x, "tanh", 0), v)
    with pytest.raises(ValueError, match="allowed: tanh, sigmoid, exp2, softmax"):
        torch.ops.emunum.exact_grad(v, x, "gelu", 0)


@pytest.mark.parametrize("fn,exact", [("tanh", torch.tanh), ("sigmoid", torch.sigmoid), ("exp2", torch.exp2),
                                      ("softmax", lambda t: torch.softmax(t, 1))])
def test_exact_grad_op_gradient_is_the_exact_derivative(fn, exact):
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    g = torch.randn(3, 6, dtype=torch.float64)
    (gx,) = torch.autograd.grad(torch.ops.emunum.exact_grad(torch.zeros(3, 6, dtype=torch.float64), x, fn, 1),
                                x, g)
    x2 = x.detach().requires_grad_(True)
    (want,) = torch.autograd.grad(exact(x2), x2, g)
    torch.testing.assert_close(gx, want, rtol=1e-12, atol=1e-12)
    # and the second-order path works: gradcheck of the backward formula
    assert torch.autograd.gradcheck(lambda t: torch.ops.emunum.exact_grad(exact(t).detach(), t, fn, 1), (x2,))


OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("case", ["quantize", "quantize_ste", "quantize_ste_clipped", "exact_grad"])
def test_opcheck_passes(case):
    x = torch.randn(3, 5, requires_grad=True)
    if case == "quantize":
        op, args = torch.ops.emunum.quantize.default, (x, format_to_args("e4m3fn"), 0, None, 32)
    elif case == "quantize_ste":
        op = torch.ops.emunum.quantize_ste.default
        args = (x, format_to_args("bf16"), 0, format_to_args("fp8_152"), int(RoundMode.STOCHASTIC), False, 5, 32)
    elif case == "quantize_ste_clipped":
        op = torch.ops.emunum.quantize_ste.default
        args = (x * 300, format_to_args("fp8_143"), 0, format_to_args("bf16"), 0, True, None, 32)  # overflows to inf
    else:
        op, args = torch.ops.emunum.exact_grad.default, (torch.randn(3, 5), x, "softmax", 1)
    torch.library.opcheck(op, args, test_utils=OPCHECK_TESTS)


def test_compiled_model_gives_the_same_bits_as_eager():
    """Linear -> Quantizer(bf16 / e5m2 stochastic, fixed seed) -> approx tanh (pwl, bf16) -> Linear ->
    approx softmax (bf16): torch.compile(fullgraph=True, inductor) forward and gradients equal eager's bits."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), emunum.Quantizer("bf16", "fp8_152", seed=5),
        emunum.approx.Tanh("pwl", fmt="bf16"), torch.nn.Linear(16, 4),
        emunum.approx.Softmax(dim=-1, fmt="bf16", rounding="stochastic", seed=9),
    )
    x = torch.randn(6, 8)
    compiled = torch.compile(model, fullgraph=True, backend="inductor")
    outs, grads = [], []
    for run in (model, compiled):
        model.zero_grad()
        y = run(x)
        (y * torch.arange(4.0)).sum().backward()
        outs.append(y.detach())
        grads.append([p.grad.clone() for p in model.parameters()])
    assert torch.equal(outs[0], outs[1])
    for a, b in zip(*grads):
        assert torch.equal(a, b)
