"""The 2026 element formats beyond ``quantize``: the custom op (torch.compile), ``emunum.patch`` (forward and
backward of a patched model) and MAD units, each against an independent computation."""
import numpy as np
import pytest
import torch
from torch import nn

import emunum
from emunum import HiFloat8Format, P3109Format


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 4))


def _fwd_bwd(model, x):
    torch.manual_seed(5)  # the gradient roles round stochastically, with seeds drawn from torch's generator
    x = x.clone().requires_grad_(True)
    y = model(x)
    y.square().sum().backward()
    return y.detach(), x.grad, [p.grad.clone() for p in model.parameters()]


def test_p3109_finite_k8p3_patches_exactly_as_its_value_twin_e5m2fnuz():
    """p3109_k8p3f has e5m2fnuz's value set, rounding and overflow (both: bias 16, NaN at 0x80, overflow NaN;
    ml_dtypes / gfloat define the two); a patched model's forward and backward are then bit-identical."""
    x = torch.randn(8, 12)
    a, b = _mlp(), _mlp()
    emunum.patch(a, fmt="p3109_k8p3f")
    emunum.patch(b, fmt="e5m2fnuz")
    (ya, gxa, gpa), (yb, gxb, gpb) = _fwd_bwd(a, x), _fwd_bwd(b, x)
    assert torch.equal(ya, yb) and torch.equal(gxa, gxb)
    assert all(torch.equal(u, v) for u, v in zip(gpa, gpb))
    assert not torch.equal(_fwd_bwd(a, x)[0], _fwd_bwd(_mlp(), x)[0])  # the patch changed something


@pytest.mark.parametrize("name", ["p3109_k8p3", "p3109_k8p4uf", "hifloat8"])
def test_custom_op_under_compile_equals_eager(name):
    x = torch.randn(64) * 100
    fmt = emunum.get_format(name)  # a spec: a name parsed inside the graph is not supported (nor for LogFormat's)
    f = torch.compile(lambda t: emunum.quantize(t, fmt, "nearest"), fullgraph=True, backend="aot_eager")
    want = emunum.quantize(x, name)
    assert torch.equal(f(x).nan_to_num(7.0), want.nan_to_num(7.0))
    assert torch.isnan(want).any() if name.endswith("uf") else True  # negatives of an unsigned format


def _round(fmt, v: float) -> float:
    return float(fmt.decode(fmt.encode([v]))[0])


@pytest.mark.parametrize("mul, acc", [(P3109Format(8, 3), P3109Format(8, 4)), (HiFloat8Format(), HiFloat8Format()),
                                      (HiFloat8Format(), emunum.get_format("fp16")),
                                      (emunum.get_format("e4m3"), HiFloat8Format(saturate=True))], ids=str)
def test_mad_unit_with_new_formats_is_the_two_rounding_loop(mul, acc):
    """MADUnit(mul_fmt, acc_fmt) with P3109 / HiFloat8 formats: acc <- round_acc(round_mul(a*b) + acc) from +0,
    each rounding the spec's own (``encode``, tested against gfloat and en_dtypes)."""
    torch.manual_seed(1)
    a = emunum.quantize(torch.randn(5, 9), mul).double()
    b = emunum.quantize(torch.randn(9, 3), mul).double()
    got = emunum.matmul(a.float(), b.float(), emunum.MADUnit(mul, acc))
    want = np.zeros((5, 3))
    for i in range(5):
        for j in range(3):
            s = 0.0
            for k in range(9):
                s = _round(acc, _round(mul, float(a[i, k] * b[k, j])) + s)
            want[i, j] = s
    assert np.array_equal(got.double().numpy(), want)


def test_mad_unit_refuses_unsigned_p3109_by_name():
    with pytest.raises(ValueError, match="MADUnit.acc_fmt=p3109_k8p3u: allowed: a FloatFormat, FixedFormat, "
                                         "HiFloat8Format or signed P3109Format"):
        emunum.MADUnit("fp32", "p3109_k8p3u")


@pytest.mark.parametrize("name", ["mxint4", "nvint4", "p3109_k8p3", "hifloat8", "mxfp4_plus", "mxfp8_e4m3_plus"])
def test_a_patched_linear_computes_the_quantised_operands_product(name):
    """A patched Linear's forward is F.linear of its rounded input and weight (block formats: blocks along
    in_features), with the output role's rounding where the policy has one (element formats)."""
    torch.manual_seed(0)
    m, x = nn.Sequential(nn.Linear(64, 8, bias=False)), torch.randn(5, 64)
    want = nn.functional.linear(emunum.quantize(x, name), emunum.quantize(m[0].weight.detach(), name))
    if not isinstance(emunum.get_format(name), emunum.BlockFormat):
        want = emunum.quantize(want, name)
    emunum.patch(m, fmt=name)
    assert torch.equal(m(x).detach(), want)


@pytest.mark.parametrize("grad", ["hifloat8", "hifloat8_sat"])
def test_hifloat8_gradient_roles_round_a_patched_linears_backward(grad):
    """patch(m, fmt="fp32", grad=...) with nearest gradient rounding: grad_output g = Q(dL/dy), then
    dL/dx = Q(g @ W) and dL/dW = Q(g^T @ x), Q the HiFloat8 rounding."""
    torch.manual_seed(0)
    m, x = nn.Sequential(nn.Linear(12, 16, bias=False)), torch.randn(8, 12) * 40
    w = m[0].weight.detach().clone()
    emunum.patch(m, fmt="fp32", grad=grad, grad_rounding="nearest")
    xr = x.clone().requires_grad_(True)
    y = m(xr)
    (y.square() * 2000).sum().backward()
    g = emunum.quantize(4000 * y.detach(), grad)

    def same(a, b):  # overflowed gradients make inf and NaN: compare those too
        return torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
    assert same(xr.grad, emunum.quantize(g @ w, grad))
    assert same(m[0].weight.grad, emunum.quantize(g.t() @ x, grad))
    assert bool(torch.isinf(g).any()) != grad.endswith("_sat")  # the scale makes some gradients overflow


def test_a_multi_term_mad_unit_refuses_hifloat8_by_name():
    with pytest.raises(ValueError, match="MADUnit.acc_fmt=hifloat8 with a multi-term unit: allowed: a FloatFormat"):
        emunum.MADUnit("e4m3", "hifloat8", terms=4)
