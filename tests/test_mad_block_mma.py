"""Training GEMMs on block-scaled matrix instructions (emunum/mad/block_mma.py, Policy.mad = an MMAUnit).

Invariants: the operands the instruction receives are exactly emunum.quantize's block quantisation (elements
times block scales times tensor scale give quantize's values); every forward and backward GEMM of a patched
layer is ``scaled_mm`` on those operands (whose bits tests/test_mad_mma.py checks against MMA-Sim), and not
torch's fp32 GEMM; mismatched formats are refused by name.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import emunum
from emunum.mad import scaled_mm
from emunum.mad.block import _split
from emunum.mad.block_mma import block_scaled_mm
from emunum.formats import RoundMode, get_format
from emunum.rng import seed_key

CASES = [("nvfp4", "b200_mxf4nvf4_ue4m3", 16), ("mxfp4_e2m1", "b200_mxf4nvf4_ue8m0", 32),
         ("mxfp8_e4m3", "b200_mxf8f6f4_e4m3", 32)]


def _data(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-6, 6, shape, generator=g).float())


@pytest.mark.parametrize("fmt,unit,block", CASES)
def test_instruction_operands_are_quantize_values(fmt, unit, block):
    A = _data((8, 64), 1)
    ea, s, t = _split(A, get_format(fmt), -1, RoundMode.NEAREST, seed_key(0), 32)
    assert torch.equal(ea * s * t, emunum.quantize(A.double(), fmt, axis=-1))
    got = block_scaled_mm(A, _data((64, 5), 2), fmt, fmt, unit)
    eb, sb, tb = _split(_data((64, 5), 2), get_format(fmt), -2, RoundMode.NEAREST, seed_key(0), 32)
    want = scaled_mm(ea, s[:, ::block], eb, sb[::block, :], None, unit)
    if get_format(fmt).tensor_scale:
        want = want * torch.tensor(float(np.float32(t * tb)))
    assert torch.equal(got, want)


@pytest.mark.parametrize("fmt,unit,block", CASES[:2])
def test_patched_linear_runs_forward_and_backward_gemms_on_the_instruction(fmt, unit, block):
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 24)
    x = _data((40, 48), 3).requires_grad_(True)
    gy = _data((40, 24), 4)
    m = emunum.patch(torch.nn.Sequential(lin), fmt, grad_rounding="nearest", mad=unit)
    y = m(x)
    y.backward(gy)
    W = lin.weight.detach()
    assert torch.equal(y.detach(), block_scaled_mm(x.detach(), W.t(), fmt, fmt, unit) + lin.bias.detach())
    assert torch.equal(x.grad, block_scaled_mm(gy, W, fmt, fmt, unit))
    assert torch.equal(lin.weight.grad, block_scaled_mm(gy.t(), x.detach(), fmt, fmt, unit))
    # the unit's datapath decides the bits: the same layer on an accumulator of 3 fraction bits differs
    narrow = emunum.mad.MMA_PRESETS[unit].replace(frac_bits=3)
    other = emunum.patch(torch.nn.Sequential(torch.nn.Linear(48, 24)), fmt, grad_rounding="nearest", mad=narrow)
    other[0].load_state_dict(lin.state_dict())
    assert not torch.equal(other(x.detach()), y.detach())


def test_formats_the_instruction_does_not_take_are_named():
    with pytest.raises(ValueError, match="fmt_a=mxfp8_e4m3 has e4m3fn elements; b200_mxf4nvf4_ue4m3 takes fp4_e2m1"):
        emunum.patch(torch.nn.Sequential(torch.nn.Linear(32, 8)), "mxfp8_e4m3", mad="b200_mxf4nvf4_ue4m3")
    with pytest.raises(ValueError, match="fmt_a=mxfp4_e2m1 has e8m0 scales; b200_mxf4nvf4_ue4m3 takes ue4m3 scales"):
        emunum.patch(torch.nn.Sequential(torch.nn.Linear(32, 8)), "mxfp4_e2m1", mad="b200_mxf4nvf4_ue4m3")
    blk16 = emunum.BlockFormat("fp4_e2m1", 16, "e8m0")
    with pytest.raises(ValueError, match="has blocks of 16 along K; b200_mxf4nvf4_ue8m0 takes blocks of 32"):
        block_scaled_mm(torch.ones(2, 32), torch.ones(32, 2), blk16, blk16, "b200_mxf4nvf4_ue8m0")
    with pytest.raises(ValueError, match="mad='b300_mxf4'"):
        emunum.patch(torch.nn.Sequential(torch.nn.Linear(32, 8)), "nvfp4", mad="b300_mxf4")


@pytest.mark.parametrize("unit,fmt", [("b200_mxf4nvf4_ue4m3", "nvfp4"), ("b200_mxf8f6f4_e4m3", "mxfp8_e4m3")])
def test_a_layers_output_on_a_matrix_instruction_can_be_modified_in_place(unit, fmt):
    """Falcon adds the attention output into the MLP's (``mlp_output += attention_output``): the layer's output
    is not a view made inside its autograd Function, and the in-place add gives the out-of-place bits."""
    grads = []
    for in_place in (False, True):
        torch.manual_seed(0)
        net = emunum.patch(torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False)), fmt, mad=unit)
        x = torch.randn(2, 3, 64, requires_grad=True)
        y = net(x)
        if in_place:
            y += 1.0
        else:
            y = y + 1.0
        y.square().sum().backward()
        grads.append((y.detach(), x.grad, net[0].weight.grad))
    for a, b in zip(*grads):
        assert torch.equal(a, b)
