"""A weight in 2-D tiles rounded without random bits is quantised once per step: the grad-input GEMM takes the
forward GEMM's quantised W (the tiles of W and W^T are the same blocks). Outputs, every gradient and the seed
stream of the stochastic gradient roundings are the bits of quantising W again in backward, zero tolerance."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import emunum
from emunum.nn.block_gemm import BlockPlan, block_plan

RECIPE = dict(weight="nvfp4_2d", grad_rounding="stochastic", hadamard=16)  # experiments/conf/format/nvfp4.yaml


def layer(kind: str) -> nn.Module:
    return {"linear": nn.Linear(48, 40), "conv2d": nn.Conv2d(3, 20, 3, padding=1, stride=2),
            "conv1d": nn.Conv1d(4, 24, 5, padding=2)}[kind]


def run(kind: str, policy, reuse: bool, monkeypatch):
    """(y, x.grad, and every parameter's grad, then one more seed draw) of one step from fixed seeds."""
    with monkeypatch.context() as m:
        if not reuse:
            m.setattr(BlockPlan, "reuses_weight", lambda self, trace=None: False)
        torch.manual_seed(3)
        net = layer(kind)
        shape = {"linear": (2, 33, 48), "conv2d": (4, 3, 12, 10), "conv1d": (5, 4, 37)}[kind]
        x = (torch.randn(shape) * 3).requires_grad_()
        emu = emunum.patch(nn.Sequential(net), policy=policy)
        y = emu(x)
        y.backward(torch.randn_like(y) * 1e-3)
        return [y.detach(), x.grad] + [p.grad for p in net.parameters()] + [torch.randint(0, 2**62, (1,))]


@pytest.mark.parametrize("kind", ["linear", "conv2d", "conv1d"])
def test_reusing_the_forward_weight_quantisation_keeps_every_bit(kind, monkeypatch):
    policy = emunum.Policy.make("nvfp4", **RECIPE)
    assert block_plan(policy).reuses_weight()
    want = run(kind, policy, False, monkeypatch)
    got = run(kind, policy, True, monkeypatch)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g.view(torch.int32) if g.is_floating_point() else g,
                           w.view(torch.int32) if w.is_floating_point() else w)


@pytest.mark.parametrize("policy", [
    emunum.Policy.make("nvfp4", weight=emunum.RoleSpec("nvfp4_2d", "stochastic")),  # a seed per quantisation
    emunum.Policy.make("nvfp4"),  # 1-D blocks: along in for W, along out for W^T
    emunum.Policy.make("nvfp4", weight="e4m3"),  # an element format
])
def test_weights_quantised_with_random_bits_or_other_blocks_are_quantised_per_gemm(policy):
    assert not block_plan(policy).reuses_weight()
