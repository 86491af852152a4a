"""MAD units under torch.compile: their GEMMs are numba kernels, which dynamo cannot trace, so each emulated GEMM
call is a graph break run eagerly (``torch.compiler.disable`` on the ``emunum.mad`` entry points), with eager's bits;
``fullgraph=True``, which forbids graph breaks, refuses them, and torch.export (fake tensors) gets a TypeError
naming the function."""
import copy
import warnings

import pytest
import torch
from torch import nn

import emunum


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc1, self.fc2 = nn.Linear(8 * 16, 32), nn.Linear(32, 4)

    def forward(self, x):
        y = torch.relu(self.conv(x)).flatten(1)
        return self.fc2(torch.relu(self.fc1(y)) @ torch.eye(32))  # a functional matmul too


POLICIES = {"h100_fp8": dict(fmt="e4m3fn", grad="e5m2", mad="h100_fp8_e4m3"),
            "b200_nvfp4": dict(fmt="nvfp4", grad_rounding="nearest", mad="b200_mxf4nvf4_ue4m3")}


def _step(model, x):
    torch.manual_seed(3)  # the stochastic gradient roundings draw the same seeds
    y = model(x)
    y.square().sum().backward()
    return y.detach()


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_model_on_a_mad_unit_compiles_with_graph_breaks_to_eagers_bits(policy):
    torch.manual_seed(0)
    base, x = _Net(), torch.randn(4, 3, 4, 4)
    eager = emunum.patch(copy.deepcopy(base), **POLICIES[policy])
    comp = emunum.patch(copy.deepcopy(base), **POLICIES[policy])
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = _step(eager, x)
        got = _step(torch.compile(comp, backend="aot_eager"), x)
    assert torch.equal(want, got)
    for (name, a), b in zip(eager.named_parameters(), comp.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), name


def test_fullgraph_refuses_a_mad_unit_gemm():
    model = emunum.patch(nn.Linear(8, 4), fmt="e4m3fn", mad="h100_fp8_e4m3")
    torch._dynamo.reset()
    with pytest.raises(Exception, match="disable"):
        torch.compile(model, backend="aot_eager", fullgraph=True)(torch.randn(2, 8))


def test_torch_export_of_a_mad_unit_gemm_is_refused_by_name():
    model = emunum.patch(nn.Linear(8, 4), fmt="e4m3fn", mad="h100_fp8_e4m3")
    with torch.no_grad(), pytest.raises(TypeError, match=r"emunum.mad.linear: .* fake ones"):
        torch.export.export(model, (torch.randn(2, 8),))
