"""Block formats never leave a role silently unrounded: they are GEMM-operand formats (input, weight,
grad_output); layers without a block GEMM refuse them; the other roles round element-wise around the GEMMs."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import emunum
from emunum.policy import Role

Q = emunum.quantize


@pytest.mark.parametrize("role", ["output", "grad_input", "grad_weight"])
@pytest.mark.parametrize("how", ["Policy", "make"])
def test_block_format_in_a_non_operand_role_raises_naming_role_format_and_allowed(role, how):
    with pytest.raises(ValueError, match=rf"{role}=mxfp4_e2m1: a block format applies to GEMM operands only; "
                                         r"allowed .*element format.* or None"):
        if how == "Policy":
            emunum.Policy(**{role: "mxfp4_e2m1"})
        else:
            emunum.Policy.make("e4m3fn", **{role: "mxfp4_e2m1"})


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "nvfp4"])
def test_keyword_form_gives_a_block_format_to_the_operand_roles_only(fmt):
    pol = emunum.Policy.make(fmt, grad="mxfp8_e5m2")
    assert pol.input.fmt.name == fmt and pol.weight.fmt.name == fmt
    assert pol.grad_output.fmt.name == "mxfp8_e5m2"
    assert pol.output is None and pol.grad_input is None and pol.grad_weight is None
    assert pol.uses_block
    # an element format for the gradients still reaches every gradient role
    pol = emunum.Policy.make(fmt, grad="e5m2")
    assert all(pol.spec(r).fmt.name == "e5m2" for r in ("grad_output", "grad_input", "grad_weight"))


@pytest.mark.parametrize("policy", [{"fmt": "mxfp8"}, {"weight": "nvfp4"}, {"grad_output": "mxfp8_e5m2"}],
                         ids=["all", "weight", "grad_output"])
def test_an_embedding_under_block_formats_is_a_lookup_left_unrounded_and_says_so(policy):
    torch.manual_seed(0)
    emb = nn.Embedding(10, 4)
    idx = torch.tensor([[1, 2, 9], [0, 0, 3]])
    ref = emb(idx)
    model = emunum.patch(nn.Sequential(emb), **policy)
    assert isinstance(model[0], emunum.nn.EmuLayer)
    assert torch.equal(model(idx), ref)
    if "grad_output" not in policy:
        assert "weight not rounded (a lookup" in repr(model)
    assert type(emunum.unpatch(model)[0]) is nn.Embedding


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_a_tied_lm_head_is_a_block_gemm_and_the_embedding_a_lookup(fmt):
    torch.manual_seed(0)
    emb, head = nn.Embedding(16, 32), nn.Linear(32, 16, bias=False)
    head.weight = emb.weight
    model = nn.Sequential(emb, nn.LayerNorm(32), head)
    idx = torch.randint(0, 16, (2, 8))
    emunum.patch(model, fmt)
    assert model[2].weight is model[0].weight
    h = model[1](model[0](idx))
    plan = model[2]._emunum_block
    expect = plan.q(h, emunum.Role.INPUT, -1) @ plan.q(model[2].weight, emunum.Role.WEIGHT, 1).t()
    assert torch.equal(model(idx), expect)
    cov = emunum.coverage(model, idx)
    assert cov.total_flops > 0 and cov.fraction == 1.0


def test_such_layers_are_patched_when_a_filter_excludes_them():
    model = nn.Sequential(nn.Linear(4, 4), nn.Embedding(3, 4))
    emunum.patch(model, "mxfp8", filter=lambda m, n: isinstance(m, nn.Linear))
    assert isinstance(model[0], emunum.nn.EmuLayer) and type(model[1]) is nn.Embedding


def test_norms_and_activations_are_left_alone_when_only_block_formats_are_given():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.LayerNorm(8))
    emunum.patch(model, "mxfp8")
    assert isinstance(model[0], emunum.nn.EmuLayer)
    assert type(model[1]) is nn.ReLU and type(model[2]) is nn.LayerNorm
    emunum.unpatch(model)
    emunum.patch(model, "mxfp8", output="bf16")  # an element-wise output role: they round it
    assert all(isinstance(m, emunum.nn.EmuLayer) for m in model)
    x = torch.randn(4, 8)
    assert torch.equal(model[1](x), Q(torch.relu(x), "bf16"))
    with pytest.raises(ValueError, match="no Linear, Conv, ConvTranspose or MultiheadAttention"):
        emunum.patch(nn.Sequential(nn.ReLU()), "mxfp8")


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "nvfp4"])
def test_element_format_operand_roles_round_element_wise_inside_each_gemm(fmt):
    torch.manual_seed(0)
    lin = nn.Linear(32, 16)
    pol = emunum.Policy(input=fmt, weight="e4m3fn", grad_output=("e5m2", "nearest"))
    emu = emunum.patch(nn.Sequential(lin), policy=pol)
    x = torch.randn(8, 32, requires_grad=True)
    y = emu(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    xd, w = x.detach(), lin.weight.detach()
    assert torch.equal(y.detach(), Q(xd, fmt, axis=-1) @ Q(w, "e4m3fn").t() + lin.bias.detach())
    assert torch.equal(x.grad, Q(gy, "e5m2") @ Q(w, "e4m3fn"))
    assert torch.equal(lin.weight.grad, Q(gy, "e5m2").t() @ Q(xd, fmt, axis=0))


def test_output_and_gradient_roles_of_a_block_layer_round_element_wise_around_the_gemms():
    torch.manual_seed(1)
    lin = nn.Linear(32, 16)
    pol = emunum.Policy.make("mxfp8_e4m3", grad="mxfp8_e5m2", grad_rounding="nearest", output="bf16",
                             grad_input="bf16", grad_weight="bf16")
    emu = emunum.patch(nn.Sequential(lin), policy=pol)
    x = torch.randn(8, 32, requires_grad=True)
    y = emu(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    xd, w, fmt, g = x.detach(), lin.weight.detach(), "mxfp8_e4m3", "mxfp8_e5m2"
    assert torch.equal(y.detach(), Q(Q(xd, fmt, axis=-1) @ Q(w, fmt, axis=1).t() + lin.bias.detach(), "bf16"))
    assert torch.equal(x.grad, Q(Q(gy, g, axis=-1) @ Q(w, fmt, axis=0), "bf16"))
    assert torch.equal(lin.weight.grad, Q(Q(gy, g, axis=0).t() @ Q(xd, fmt, axis=0), "bf16"))
    assert torch.equal(lin.bias.grad, Q(gy.sum(0), "bf16"))


@pytest.mark.parametrize("nd", [1, 2])
def test_grouped_conv_equals_one_block_conv_per_group(nd):
    torch.manual_seed(2)
    Conv = nn.Conv1d if nd == 1 else nn.Conv2d
    conv = Conv(6, 4, 3, groups=2, padding=1)
    parts = [Conv(3, 2, 3, padding=1) for _ in range(2)]
    with torch.no_grad():
        for i, p in enumerate(parts):
            p.weight.copy_(conv.weight[2 * i:2 * i + 2])
            p.bias.copy_(conv.bias[2 * i:2 * i + 2])
    pol = emunum.Policy.make("mxfp8_e4m3", grad="mxfp8_e5m2", grad_rounding="nearest")
    emu = emunum.patch(nn.Sequential(conv), policy=pol)
    emu_parts = [emunum.patch(nn.Sequential(p), policy=pol) for p in parts]
    shape = (2, 6, 40) if nd == 1 else (2, 6, 9, 8)
    x = torch.randn(*shape)
    y = emu(x)
    want = torch.cat([m(x[:, 3 * i:3 * i + 3]) for i, m in enumerate(emu_parts)], dim=1)
    assert torch.equal(y.detach(), want.detach())
    gy = torch.randn_like(y)
    y.backward(gy)
    want.backward(gy)
    assert torch.equal(conv.weight.grad, torch.cat([p.weight.grad for p in parts]))
    assert not torch.equal(y.detach(), conv(x).detach())  # the operands were quantised


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "nvfp4"])
def test_attention_projections_and_products_quantise_along_their_reduction_dims(fmt):
    torch.manual_seed(3)
    E, H, L, N = 64, 2, 5, 3
    hd = E // H
    mha = nn.MultiheadAttention(E, H)
    x = torch.randn(L, N, E, requires_grad=True)
    emu = emunum.patch(mha, fmt, grad_rounding="nearest")
    out, weights = emu(x, x, x)
    W, b = mha.in_proj_weight.detach(), mha.in_proj_bias.detach()
    Wo, bo = mha.out_proj.weight.detach(), mha.out_proj.bias.detach()
    proj = (Q(x.detach().reshape(-1, E), fmt) @ Q(W, fmt, axis=1).t()).reshape(L, N, 3 * E) + b
    q, k, v = (proj[..., i * E:(i + 1) * E].reshape(L, N * H, hd).transpose(0, 1) for i in range(3))
    qs = q * math.sqrt(1.0 / float(hd))
    probs = torch.softmax(Q(qs, fmt, axis=-1) @ Q(k.transpose(-2, -1), fmt, axis=-2), dim=-1)
    ctx = (Q(probs, fmt, axis=-1) @ Q(v, fmt, axis=-2)).transpose(0, 1).reshape(L * N, E)
    want = (Q(ctx, fmt) @ Q(Wo, fmt, axis=1).t() + bo).view(L, N, E)
    assert torch.equal(out.detach(), want)
    assert torch.equal(weights.detach(), probs.view(N, H, L, L).mean(dim=1))
    out.sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(mha.in_proj_weight.grad).all()


def test_attention_products_backward_quantise_along_their_reduction_dims(monkeypatch):
    from emunum.nn import block_gemm as bg

    calls = []

    def spy(t, fmt, rounding, axis=None, sr_bits=None):
        calls.append((tuple(t.shape), None if axis is None else axis % t.dim()))
        return t

    plan = bg.BlockPlan(emunum.policy.RoleSpec("mxfp8"), None, emunum.policy.RoleSpec("mxfp8_e5m2"))
    a = torch.randn(2, 3, 4, requires_grad=True)
    b = torch.randn(2, 4, 5, requires_grad=True)
    monkeypatch.setattr(bg, "quantize", spy)
    bg.block_bmm(a, b, plan).sum().backward()
    # forward a along K=4, b along K=4; grad-a: g (2,3,5) and b^T along N=5; grad-b: a^T and g along M=3
    assert calls == [((2, 3, 4), 2), ((2, 4, 5), 1), ((2, 3, 5), 2), ((2, 5, 4), 1), ((2, 4, 3), 2),
                     ((2, 3, 5), 1)]


@pytest.mark.parametrize("groups,stride,padding,dilation", [(1, 1, 1, 1), (2, (1, 2, 1), (0, 1, 2), (1, 1, 2))])
def test_conv3d_is_the_block_gemm_on_its_im2col_matrix(groups, stride, padding, dilation):
    torch.manual_seed(4)
    conv = nn.Conv3d(4, 6, (2, 3, 3), stride=stride, padding=padding, dilation=dilation, groups=groups)
    x = torch.randn(2, 4, 5, 7, 8)
    fmt = "mxfp8_e4m3"
    y = emunum.patch(nn.Sequential(conv), fmt)(x)
    assert y.shape == conv(x).shape
    # reference im2col from torch's Tensor.unfold over the padded input (dilation by striding the taps)
    s = (stride,) * 3 if isinstance(stride, int) else stride
    p = (padding,) * 3 if isinstance(padding, int) else padding
    d = (dilation,) * 3 if isinstance(dilation, int) else dilation
    xp = torch.nn.functional.pad(x, (p[2], p[2], p[1], p[1], p[0], p[0]))
    win = xp
    for i, k in enumerate(conv.kernel_size):
        win = win.unfold(2 + i, d[i] * (k - 1) + 1, s[i])
    win = win[..., ::d[0], :, :][..., ::d[1], :][..., ::d[2]]  # (n, C, D', H', W', kd, kh, kw)
    n, C, Do, Ho, Wo = win.shape[:5]
    cg, og = C // groups, conv.out_channels // groups
    outs = []
    for g in range(groups):
        cols = win[:, g * cg:(g + 1) * cg].permute(0, 2, 3, 4, 1, 5, 6, 7).reshape(n * Do * Ho * Wo, -1)
        w2 = conv.weight.detach()[g * og:(g + 1) * og].reshape(og, -1)
        outs.append(Q(cols, fmt) @ Q(w2, fmt).t())
    want = torch.cat(outs, 1).reshape(n, Do, Ho, Wo, -1).permute(0, 4, 1, 2, 3)
    want = want + conv.bias.detach().view(1, -1, 1, 1, 1)
    assert torch.equal(y.detach(), want)
    with torch.no_grad():  # unquantised, the im2col path is the convolution itself
        from emunum.nn import block_gemm as bg
        torch.testing.assert_close(bg.block_conv(conv, x, conv.weight, conv.bias, bg.BlockPlan(None, None, None)),
                                   conv(x))


@pytest.mark.parametrize("ct,shape", [
    (nn.ConvTranspose1d(4, 6, 3, stride=2, padding=1, output_padding=1, dilation=2, groups=2), (2, 4, 7)),
    (nn.ConvTranspose2d(4, 6, (2, 3), stride=(2, 1), padding=(0, 1)), (2, 4, 5, 6)),
    (nn.ConvTranspose3d(2, 3, 2, stride=2), (1, 2, 3, 4, 3))], ids=lambda v: getattr(type(v), "__name__", ""))
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4_e2m1"])  # power-of-two scales: exact float64 products
def test_conv_transpose_is_the_block_gemm_over_input_channels_then_overlap_add(ct, shape, fmt):
    torch.manual_seed(5)
    ct = ct.double()
    x = torch.randn(*shape, dtype=torch.float64)
    y = emunum.patch(nn.Sequential(ct), fmt)(x)
    # reference: x blocked along its channels and W along C_in, per group (K = C_in / groups), then torch's
    # transposed convolution in float64 (its sums of these short products are exact, in any order)
    g, cin = ct.groups, x.shape[1]
    cg = cin // g
    xq = torch.cat([Q(x[:, i * cg:(i + 1) * cg].movedim(1, -1), fmt).movedim(-1, 1) for i in range(g)], 1)
    w = ct.weight.detach()
    wq = torch.cat([Q(w[i * cg:(i + 1) * cg].reshape(cg, -1), fmt, axis=0).reshape(w[:cg].shape)
                    for i in range(g)])
    fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[x.dim() - 2]
    want = fn(xq, wq, ct.bias.detach(), ct.stride, ct.padding, ct.output_padding, g, ct.dilation)
    assert torch.equal(y.detach(), want)
    y.sum().backward()
    assert torch.isfinite(ct.weight.grad).all() and torch.isfinite(ct.bias.grad).all()
