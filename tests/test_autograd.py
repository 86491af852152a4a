"""Straight-through quantisation (quantize_ste / Quantizer): forward and gradient bits against the
independent oracles of conftest.py (zero tolerance), the clipped estimator's mask, gradcheck in float64,
seeds, dtypes, and input validation."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.autograd.gradcheck import GradcheckError

import emunum
from emunum import FixedFormat, FloatFormat, Quantizer, RoundMode, quantize_ste
from emunum.ops import derive_seed

SEED = 1234

# (forward format, backward format) pairs over float specials, saturation and fixed point
PAIRS = {
    "e4m3fn/e5m2": ("e4m3fn", "fp8_152"),
    "bf16/e5m2fnuz": ("bf16", "e5m2fnuz"),
    "fp4/fp6": ("fp4_e2m1", "fp6_e3m2"),
    "e5m2sat/bf16": (FloatFormat(5, 2, saturate=True), "bf16"),
    "fixed8_3wrap/fixed16_12": (FixedFormat(8, 3, saturate=False), "fixed16_12"),
}
MODES = [RoundMode.NEAREST, RoundMode.TOWARD_ZERO, RoundMode.STOCHASTIC]


def _oracle(fmt, v: np.ndarray, mode: RoundMode, seed: int, oracles) -> np.ndarray:
    fmt = emunum.get_format(fmt)
    rnd = oracles.Rounding(mode)
    if isinstance(fmt, FixedFormat):
        return oracles.fixed_round(fmt, v, rnd, seed=seed)
    return oracles.value_set_round(fmt, v, rnd, seed=seed)


def _inputs(n=1500, scale=64.0, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * torch.exp2(torch.randint(-12, 8, (n,), generator=g))
    x[:6] = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e30])
    return (x * scale / 64).to(dtype)


@pytest.mark.parametrize("pair", list(PAIRS), ids=list(PAIRS))
@pytest.mark.parametrize("fmode", MODES, ids=[m.name.lower() for m in MODES])
def test_forward_bits_equal_oracle_rounding_with_seed(pair, fmode, oracles):
    fwd, bwd = PAIRS[pair]
    x = _inputs()
    y = quantize_ste(x, fwd, bwd, forward_rounding=fmode.name.lower(), seed=SEED)
    oracles.assert_same_values(y.numpy(), _oracle(fwd, x.numpy(), fmode, SEED, oracles), x.numpy(), pair)


@pytest.mark.parametrize("pair", list(PAIRS), ids=list(PAIRS))
@pytest.mark.parametrize("bmode", MODES, ids=[m.name.lower() for m in MODES])
def test_gradient_bits_equal_oracle_rounding_of_upstream(pair, bmode, oracles):
    fwd, bwd = PAIRS[pair]
    x = _inputs(seed=1).requires_grad_(True)
    g = _inputs(seed=2)
    quantize_ste(x, fwd, bwd, backward_rounding=bmode, seed=SEED).backward(g)
    want = _oracle(bwd, g.numpy(), bmode, derive_seed(SEED, 1), oracles)
    oracles.assert_same_values(x.grad.numpy(), want, g.numpy(), f"{pair} grad")


def test_none_formats_skip_rounding_in_that_direction():
    x = _inputs(seed=3).requires_grad_(True)
    g = _inputs(seed=4)
    y = quantize_ste(x, None, None)
    y.backward(g)
    assert torch.equal(y.detach(), x.detach()) or torch.equal(torch.isnan(y), torch.isnan(x))
    np.testing.assert_array_equal(y.detach().numpy(), x.detach().numpy())
    np.testing.assert_array_equal(x.grad.numpy(), g.numpy())
    x.grad = None
    y = quantize_ste(x, "e4m3fn", None)
    y.backward(g)
    np.testing.assert_array_equal(x.grad.numpy(), g.numpy())  # backward None: the upstream gradient itself


CLIP_FORMATS = {
    "e4m3fn": emunum.get_format("e4m3fn"),  # overflow -> NaN
    "fp8_152": emunum.get_format("fp8_152"),  # overflow -> inf
    "e5m2sat": FloatFormat(5, 2, saturate=True),
    "fp4_e2m1": emunum.get_format("fp4_e2m1"),  # special none: saturates
    "fixed8_3wrap": FixedFormat(8, 3, saturate=False),
    "ufixed6_2": FixedFormat(6, 2, signed=False),
}


@pytest.mark.parametrize("name", list(CLIP_FORMATS), ids=list(CLIP_FORMATS))
def test_clipped_ste_zeroes_gradient_exactly_beyond_the_format_range(name):
    fmt = CLIP_FORMATS[name]
    top = fmt.max
    lo = fmt.min if isinstance(fmt, FixedFormat) else -top
    step = fmt.eps
    probes = [0.0, top, lo, top + step / 4, lo - step / 4, top * 1.5 + 1, lo * 1.5 - 1, float("inf"), -float("inf"),
              top / 2, np.nextafter(top, np.inf), np.nextafter(lo, -np.inf), float("nan")]
    x = torch.tensor(probes, dtype=torch.float64, requires_grad=True)
    g = torch.arange(1.0, len(probes) + 1, dtype=torch.float64)
    quantize_ste(x, fmt, None, ste="clipped").backward(g)
    v = np.array(probes)
    inside = np.isnan(v) | ((v <= top) & (v >= lo))  # independent: the range from the format's own limits
    np.testing.assert_array_equal(x.grad.numpy(), np.where(inside, g.numpy(), 0.0))
    assert (~inside).sum() >= 6  # the probes do exercise both sides


def test_clipped_mask_matches_where_the_forward_result_overflowed_for_non_saturating_floats():
    fmt = emunum.get_format("fp8_152")
    x = _inputs(4000, scale=2**18, seed=5).requires_grad_(True)
    y = quantize_ste(x, fmt, None, ste="clipped")
    y.backward(torch.ones_like(x))
    finite_in = torch.isfinite(x.detach())
    overflowed = finite_in & torch.isinf(y.detach())
    assert overflowed.sum() > 100
    assert torch.all(x.grad[overflowed] == 0)
    kept = finite_in & (x.detach().abs() <= fmt.max)
    assert torch.all(x.grad[kept] == 1)


def test_gradcheck_identity_paths_in_float64():
    w = torch.randn(7, dtype=torch.float64)
    x = torch.randn(7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: torch.sin(quantize_ste(t * w, None, None)), (x,))


def test_gradcheck_clipped_fine_fixed_point_matches_finite_differences():
    """fixed32_24 rounds at 6e-8 (locally the identity for finite differences of 1e-3) and saturates at
    +-128: the clipped estimator then equals the true derivative, including 0 beyond the range."""
    fmt = FixedFormat(32, 24)
    x = torch.tensor([-300.0, -100.0, -2.5, 0.3, 7.0, 127.0, 150.0, 1e4], dtype=torch.float64, requires_grad=True)
    f = lambda t: quantize_ste(t, fmt, None, ste="clipped") ** 2  # noqa: E731
    assert torch.autograd.gradcheck(f, (x,), eps=1e-3, atol=2e-4, rtol=1e-3)
    f_id = lambda t: quantize_ste(t, fmt, None, ste="identity") ** 2  # noqa: E731
    with pytest.raises(GradcheckError):
        torch.autograd.gradcheck(f_id, (x,), eps=1e-3, atol=2e-4, rtol=1e-3)


def test_gradcheck_fp32_forward_on_float64_is_locally_identity():
    x = torch.randn(6, dtype=torch.float64, requires_grad=True)
    f = lambda t: torch.tanh(quantize_ste(t, "fp32", None)) * 3  # noqa: E731
    assert torch.autograd.gradcheck(f, (x,), eps=1e-3, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_dtype_and_shape_are_kept_and_input_untouched(dtype):
    x = torch.randn(3, 4, 5, dtype=dtype).transpose(0, 2).requires_grad_(True)
    keep = x.detach().clone()
    y = quantize_ste(x, "fp8_152", "fp8_152", seed=2)
    assert y.dtype == dtype and y.shape == x.shape
    assert torch.equal(y.detach(), emunum.quantize(keep, "fp8_152"))
    y.sum().backward()
    assert x.grad.dtype == dtype and torch.equal(x.detach(), keep)
    assert torch.all(x.grad == 1)  # 1 is a value of e5m2: stochastic rounding leaves it


def test_seed_none_draws_fresh_bits_each_call_but_follows_torch_manual_seed():
    x = torch.full((4096,), 1.1, requires_grad=True)
    g = torch.full((4096,), 1.1)

    def grad():
        x.grad = None
        quantize_ste(x, None, "fp8_152").backward(g)
        return x.grad.clone()

    torch.manual_seed(0)
    a, b = grad(), grad()
    torch.manual_seed(0)
    c = grad()
    assert not torch.equal(a, b) and torch.equal(a, c)
    assert set(a.unique().tolist()) == {1.0, 1.25}


def test_quantizer_module_matches_function_and_shows_formats():
    q = Quantizer("e4m3fn", "fp8_152", forward_rounding="toward_zero", ste="clipped", seed=3)
    assert repr(q) == ("Quantizer(forward=e4m3fn, backward=e5m2, forward_rounding=toward_zero, "
                       "backward_rounding=stochastic, ste=clipped, seed=3)")
    assert q.state_dict() == {} and list(q.parameters()) == []
    x = _inputs(seed=7).float().requires_grad_(True)
    g = _inputs(seed=8).float()
    q(x).backward(g)
    x2 = x.detach().clone().requires_grad_(True)
    y2 = quantize_ste(x2, "e4m3fn", "fp8_152", forward_rounding="toward_zero", ste="clipped", seed=3)
    y2.backward(g)
    assert torch.equal(torch.nan_to_num(q(x), 7.0), torch.nan_to_num(y2, 7.0))
    assert torch.equal(torch.nan_to_num(x.grad, 7.0), torch.nan_to_num(x2.grad, 7.0))


def test_quantizer_repr_for_none_formats():
    assert "forward=None, backward=e8m7," in repr(Quantizer(None, "bf16"))


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(ste="straight"), ValueError, "ste='straight'.*allowed: identity, clipped"),
    (dict(forward=None, ste="clipped"), ValueError, "ste='clipped' needs a forward format"),
    (dict(forward="fp7"), ValueError, "forward='fp7': fmt='fp7' is not a known format"),
    (dict(backward=3), TypeError, r"backward=.*: fmt must be"),
    (dict(forward_rounding="nearst"), ValueError, "forward_rounding='nearst'"),
    (dict(backward_rounding="sr2"), ValueError, "backward_rounding='sr2'"),
    (dict(seed=1.5), TypeError, "seed must be an int"),
    (dict(seed=2**64), ValueError, "seed=.*out of range"),
    (dict(sr_bits=40), ValueError, "sr_bits=40"),
])
def test_bad_arguments_raise_naming_the_field(kwargs, exc, match):
    args = dict(forward="e4m3fn", backward="fp8_152")
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        Quantizer(**args)
    with pytest.raises(exc, match=match):
        quantize_ste(torch.ones(2), **args)


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, torch.complex64])
def test_non_float_tensors_raise_type_error(dtype):
    with pytest.raises(TypeError, match="dtype"):
        quantize_ste(torch.ones(3, dtype=dtype), "bf16")
