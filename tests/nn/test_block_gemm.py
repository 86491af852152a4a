"""Patched layers with block formats: every GEMM quantises its operands along its own reduction dimension
(forward: in_features; grad-input: out_features; grad-weight: tokens), re-quantised per GEMM."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import emunum
from emunum.formats import BlockFormat
from emunum.nn import block_gemm as bg

Q = emunum.quantize


def _policy(fmt="mxfp4_e2m1", weight=None):
    return emunum.Policy.make(fmt, grad_rounding="nearest", **({} if weight is None else {"weight": weight}))


@pytest.mark.parametrize("fmt", ["mxfp4_e2m1", "mxfp8_e4m3", "nvfp4"])
def test_linear_gemms_quantise_along_their_reduction_dims(fmt):
    torch.manual_seed(0)
    lin = nn.Linear(64, 48)
    x = torch.randn(3, 5, 64, requires_grad=True)
    emu = emunum.patch(nn.Sequential(lin), policy=_policy(fmt))
    y = emu(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    x2, gy2, w = x.detach().reshape(15, 64), gy.reshape(15, 48), lin.weight.detach()
    y_ref = Q(x2, fmt, axis=-1) @ Q(w, fmt, axis=1).t() + lin.bias.detach()
    gx_ref = Q(gy2, fmt, axis=-1) @ Q(w, fmt, axis=0)
    gw_ref = Q(gy2, fmt, axis=0).t() @ Q(x2, fmt, axis=0)
    assert torch.equal(y.detach().reshape(15, 48), y_ref)
    assert torch.equal(x.grad.reshape(15, 64), gx_ref)
    assert torch.equal(lin.weight.grad, gw_ref)
    assert torch.equal(lin.bias.grad, gy2.sum(0))
    # the rule matters: blocks along the other axis give other numbers
    assert not torch.equal(lin.weight.grad, Q(gy2, fmt, axis=-1).t() @ Q(x2, fmt, axis=-1))


def test_every_quantize_call_runs_along_k(monkeypatch):
    calls = []

    def spy(t, fmt, rounding, axis, sr_bits):
        calls.append((tuple(t.shape), axis % t.dim()))
        return t

    lin = nn.Linear(32, 16)
    emu = emunum.patch(nn.Sequential(lin), policy=_policy())
    emu(torch.randn(8, 32))  # the first forward (its coverage check runs the custom op, not the eager call)
    monkeypatch.setattr(bg, "quantize", spy)
    emu(torch.randn(8, 32, requires_grad=True)).sum().backward()
    # forward: x (8, 32) and W (16, 32) along 32 = in; grad-input: gy (8, 16) and W along 16 = out;
    # grad-weight: gy and x along 8 = tokens
    assert calls == [((8, 32), 1), ((16, 32), 1), ((8, 16), 1), ((16, 32), 0), ((8, 16), 0), ((8, 32), 0)]


def test_2d_weight_tiles_quantise_w_once_for_both_gemms():
    lin = nn.Linear(32, 32)
    tiles = BlockFormat("e4m3fn", (16, 16))
    emu = emunum.patch(nn.Sequential(lin), policy=_policy("mxfp8_e4m3", weight=tiles))
    x = torch.randn(4, 32, requires_grad=True)
    y = emu(x)
    y.backward(torch.ones_like(y))
    wq = Q(lin.weight.detach(), tiles)
    assert torch.equal(y.detach(), Q(x.detach(), "mxfp8_e4m3") @ wq.t() + lin.bias.detach())
    assert torch.equal(x.grad, Q(torch.ones(4, 32), "mxfp8_e4m3") @ wq)


@pytest.mark.parametrize("conv,shape", [(nn.Conv1d(3, 8, 5, padding=2, stride=2), (2, 3, 40)),
                                        (nn.Conv2d(4, 6, 3, padding=1), (2, 4, 9, 7))])
def test_conv_is_the_block_gemm_on_its_im2col_matrix(conv, shape):
    x = torch.randn(*shape)
    emu = emunum.patch(nn.Sequential(conv), policy=_policy("mxfp8_e4m3"))
    y = emu(x)
    assert y.shape == conv(x).shape
    nd = x.dim() - 2
    x4 = x.unsqueeze(-2) if nd == 1 else x
    k = (1, conv.kernel_size[0]) if nd == 1 else conv.kernel_size
    s = (1, conv.stride[0]) if nd == 1 else conv.stride
    p = (0, conv.padding[0]) if nd == 1 else conv.padding
    cols = F.unfold(x4, k, padding=p, stride=s).transpose(1, 2)
    x2 = cols.reshape(-1, cols.shape[-1])
    w2 = conv.weight.detach().reshape(conv.out_channels, -1)
    y2 = Q(x2, "mxfp8_e4m3") @ Q(w2, "mxfp8_e4m3").t()  # K = in_channels * kernel size
    want = y2.reshape(x.shape[0], -1, conv.out_channels).transpose(1, 2).reshape(y.shape) + conv.bias.detach().view(
        1, -1, *([1] * nd))
    assert torch.equal(y.detach(), want)
    with torch.no_grad():  # unquantised, the im2col path is the convolution itself
        plan = bg.BlockPlan(None, None, None)
        torch.testing.assert_close(bg.block_conv(conv, x, conv.weight, conv.bias, plan), conv(x))


PADDED = {  # a conv with string padding, and the zeros torch pads for it (before, after per dim, last dim first)
    "same 2-D, odd kernel": (lambda: nn.Conv2d(4, 6, 3, padding="same"), (2, 4, 9, 7), (1, 1, 1, 1)),
    "same 2-D, even kernel": (lambda: nn.Conv2d(4, 6, (2, 4), padding="same"), (2, 4, 9, 7), (1, 2, 0, 1)),
    "same 2-D, dilated": (lambda: nn.Conv2d(4, 6, (3, 2), padding="same", dilation=2), (2, 4, 9, 7), (1, 1, 2, 2)),
    "same 1-D, even kernel": (lambda: nn.Conv1d(3, 8, 4, padding="same"), (2, 3, 20), (1, 2)),
    "same 3-D": (lambda: nn.Conv3d(2, 4, (2, 3, 3), padding="same"), (1, 2, 5, 6, 6), (1, 1, 1, 1, 0, 1)),
    "valid 2-D": (lambda: nn.Conv2d(4, 6, 3, padding="valid"), (2, 4, 9, 7), (0, 0, 0, 0)),
}


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "nvfp4"])
@pytest.mark.parametrize("case", sorted(PADDED))
def test_string_padding_gives_the_bits_of_its_explicit_zeros(case, fmt):
    make, shape, pads = PADDED[case]
    torch.manual_seed(0)
    conv = make()
    flat = type(conv)(conv.in_channels, conv.out_channels, conv.kernel_size, dilation=conv.dilation)
    flat.load_state_dict(conv.state_dict())
    x = torch.randn(*shape)
    outs = []
    for layer, pad in ((conv, None), (flat, pads)):
        emu = emunum.patch(nn.Sequential(layer), policy=_policy(fmt))
        xi = x.clone().requires_grad_(True)
        y = emu(F.pad(xi, pad) if pad else xi)
        y.backward(torch.linspace(-2, 2, y.numel()).view(y.shape))
        outs.append((y.detach(), xi.grad, layer.weight.grad))
    assert outs[0][0].shape == conv(x).shape
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_per_tensor_scaling_and_mad_with_block_formats_are_rejected():
    with pytest.raises(ValueError, match="scaling='per_tensor'"):
        emunum.Policy.make("mxfp8", scaling="per_tensor")
    with pytest.raises(ValueError, match=r"allowed: a one-product unit"):  # a multi-term unit
        emunum.patch(nn.Sequential(nn.Linear(4, 4)), "mxfp8", mad="h100_fp8_e4m3")
    with pytest.raises(ValueError, match="ste='clipped' with block formats.*allowed: ste='identity'"):
        emunum.patch(nn.Sequential(nn.Linear(4, 4)), "mxfp8", ste="clipped")


def test_patched_model_trains_one_step_with_stochastic_gradients():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv1d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(64, 10))
    emunum.patch(model, "nvfp4")
    loss = F.cross_entropy(model(torch.randn(8, 1, 16)), torch.randint(0, 10, (8,)))
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("grad", ["mxfp8_e4m3_rceil", "mxfp8_e5m2_ceil", "mxfp4_e2m1_even"])
def test_a_scale_rule_per_role_rceil_gradients_under_ocp_operands(grad):
    """patch(model, fmt, grad=<preset>_<rule>): the forward operands keep fmt's rule (floor), the error grad_output
    takes the gradient format's rule in both backward GEMMs (its values from the numpy reference quantiser,
    BlockFormat.encode/decode)."""
    def ref(t, fmt, axis):
        f = emunum.get_format(fmt)
        codes, scodes, _ = f.encode(t.numpy(), axis=axis)
        return torch.from_numpy(f.decode(codes, scodes, axis=axis)).float()

    torch.manual_seed(1)
    lin = nn.Linear(64, 48)
    x = torch.randn(40, 64, requires_grad=True)
    emu = emunum.patch(nn.Sequential(lin), "mxfp8_e4m3", grad=grad, grad_rounding="nearest")
    assert emu[0].__dict__["_emunum_policy"].grad_output.fmt == emunum.get_format(grad)
    y = emu(x)
    gy = torch.randn_like(y) * 3.0
    y.backward(gy)
    w, xd = lin.weight.detach(), x.detach()
    assert torch.equal(y.detach(), Q(xd, "mxfp8_e4m3") @ Q(w, "mxfp8_e4m3", axis=1).t() + lin.bias.detach())
    assert torch.equal(x.grad, ref(gy, grad, -1) @ Q(w, "mxfp8_e4m3", axis=0))
    assert torch.equal(lin.weight.grad, ref(gy, grad, 0).t() @ Q(xd, "mxfp8_e4m3", axis=0))
    floor = emunum.get_format(grad).with_scale_rule("floor")
    assert not torch.equal(x.grad, Q(gy, floor, axis=-1) @ Q(w, "mxfp8_e4m3", axis=0))  # the rule mattered
