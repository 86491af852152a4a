"""The NVFP4 family in patched layers: each block GEMM quantises its operands with the role's family format
along its own reduction dimension (forward: in; grad-input: out; grad-weight: tokens), as for nvfp4; a per-row
outer scale becomes one scale per row of the first operand and one per column of the second."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import emunum

Q = emunum.quantize


@pytest.mark.parametrize("fmt", ["nvfp4_1l", "nvfp4_row", "nvfp4_b32", "nvfp4_ue5m3", "nvfp4_4over6",
                                 "nvfp4_4over6_mse"])
def test_linear_gemms_quantise_family_operands_along_their_reduction_dims(fmt):
    torch.manual_seed(0)
    lin = nn.Linear(64, 48)
    x = torch.randn(3, 32, 64, requires_grad=True)
    emu = emunum.patch(nn.Sequential(lin), policy=emunum.Policy.make(fmt, grad_rounding="nearest"))
    y = emu(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    x2, gy2, w = x.detach().reshape(96, 64), gy.reshape(96, 48), lin.weight.detach()
    assert torch.equal(y.detach().reshape(96, 48), Q(x2, fmt, axis=-1) @ Q(w, fmt, axis=1).t() + lin.bias.detach())
    assert torch.equal(x.grad.reshape(96, 64), Q(gy2, fmt, axis=-1) @ Q(w, fmt, axis=0))
    assert torch.equal(lin.weight.grad, Q(gy2, fmt, axis=0).t() @ Q(x2, fmt, axis=0))
    assert not torch.equal(y.detach().reshape(96, 48),
                           Q(x2, "nvfp4", axis=-1) @ Q(w, "nvfp4", axis=1).t() + lin.bias.detach()) or fmt == "nvfp4_b32"


def test_4over6_weight_tiles_with_standard_nvfp4_gradients_as_the_recipe():
    torch.manual_seed(1)
    lin = nn.Linear(32, 32)
    x = torch.randn(16, 32, requires_grad=True)
    pol = emunum.Policy.make("nvfp4_4over6", weight="nvfp4_4over6_2d", grad_output="nvfp4", grad_rounding="nearest")
    emu = emunum.patch(nn.Sequential(lin), policy=pol)
    y = emu(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    wq = Q(lin.weight.detach(), "nvfp4_4over6_2d")
    assert torch.equal(y.detach(), Q(x.detach(), "nvfp4_4over6") @ wq.t() + lin.bias.detach())
    assert torch.equal(x.grad, Q(gy, "nvfp4") @ wq)


def test_mad_block_gemm_refuses_per_row_outer_scales_naming_the_format():
    unit = emunum.MADUnit.preset("b200_fp16")
    with pytest.raises(ValueError, match=r"fmt_a=nvfp4_row: outer_scale='row' is not on the MAD-unit block "
                                         r"datapath; allowed: outer_scale 'tensor' or none"):
        emunum.mad.block_matmul(torch.randn(4, 32), torch.randn(32, 4), "nvfp4_row", "nvfp4", unit)
