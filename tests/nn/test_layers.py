"""Emulated layers (emunum.nn): every role rounded where the docs say, bit for bit.

Oracle: the layer's torch functional applied to tensors rounded by ``emunum.reference.quantize_reference``
(numpy float64 rounding, independent of the kernels and of the autograd ops), and torch.autograd.grad of
that functional for the backward pass. Gradient roles round to nearest here, so that the oracle is
deterministic; stochastic gradient rounding is checked for landing on the format's grid and for
repeatability under torch.manual_seed.
"""
import copy
import math
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import emunum
from emunum.nn import EmuLayer, EmuLinear, from_float
from emunum.policy import Policy, Role, Scaling
from emunum.reference import quantize_reference

POLICIES = {
    "e5m2": Policy.make("e5m2", grad_rounding="nearest"),
    "mixed": Policy.make("e4m3fn", weight="fixed8_6", output="e5m2", grad="bf16", grad_output="e5m2",
                         grad_rounding="nearest"),
    "fwd_only": Policy.make("e4m3fn", grad=None, rounding="toward_zero"),
    # per-tensor scaling: every role; and a mix of scaled float/fixed-point roles, rounding up, one unscaled
    "e4m3_scaled": Policy.make("e4m3fn", scaling="per_tensor", grad_rounding="nearest"),
    "mixed_scaled": Policy.make("e5m2", rounding="up", scaling="per_tensor", weight="int8", grad="e4m3fn",
                                grad_output=("e5m2", "nearest", "none"), grad_rounding="nearest"),
}


def oracle_scale(x, fmt) -> float:
    """2**e for the largest integer e with amax * 2**e <= fmt.max (exact rationals), clamped to the normal
    powers of two of x's dtype; 1.0 when x is empty or amax is 0 or not finite."""
    if x.numel() == 0:
        return 1.0
    amax = x.detach().abs().max().item()
    if amax == 0 or not math.isfinite(amax):
        return 1.0
    a, m = Fraction(amax), Fraction(emunum.get_format(fmt).max)
    e = 0
    while a * Fraction(2) ** e > m:
        e -= 1
    while a * Fraction(2) ** (e + 1) <= m:
        e += 1
    fi = torch.finfo(x.dtype)
    lo, hi = round(math.log2(fi.tiny)), math.frexp(fi.max)[1] - 1
    return 2.0 ** min(max(e, lo), hi)


def Q(x, spec):
    """The oracle rounding of a role: quantize_reference, of x * s and divided by s when the role is scaled
    (in float64, where both steps are exact, then back to x's dtype)."""
    if spec is None:
        return x
    if spec.scaling == Scaling.NONE:
        return quantize_reference(x, spec.fmt, spec.rounding)
    s = oracle_scale(x, spec.fmt)
    return (quantize_reference(x.detach().double() * s, spec.fmt, spec.rounding) / s).to(x.dtype)


def on_grid(t, fmt):
    return torch.equal(quantize_reference(t, emunum.get_format(fmt), "nearest"), t)


def leaf(t):
    return t.detach().clone().requires_grad_(True)


# (name, layer factory, input shape, functional oracle op(x, w, b, layer))
WEIGHT_LAYERS = [
    ("linear", lambda: nn.Linear(7, 5), (4, 7), lambda x, w, b, m: F.linear(x, w, b)),
    ("linear_nobias", lambda: nn.Linear(7, 5, bias=False), (2, 3, 7), lambda x, w, b, m: F.linear(x, w, b)),
    ("conv1d", lambda: nn.Conv1d(3, 4, 3, stride=2, padding=1), (2, 3, 9),
     lambda x, w, b, m: F.conv1d(x, w, b, 2, 1)),
    ("conv2d_groups", lambda: nn.Conv2d(4, 6, 3, padding=1, groups=2, dilation=1), (2, 4, 6, 6),
     lambda x, w, b, m: F.conv2d(x, w, b, 1, 1, 1, 2)),
    ("conv2d_reflect", lambda: nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect"), (1, 2, 5, 5),
     lambda x, w, b, m: F.conv2d(F.pad(x, (1, 1, 1, 1), mode="reflect"), w, b)),
    ("conv3d", lambda: nn.Conv3d(2, 3, 2), (1, 2, 4, 4, 4), lambda x, w, b, m: F.conv3d(x, w, b)),
    ("convT1d", lambda: nn.ConvTranspose1d(3, 2, 3, stride=2), (2, 3, 5),
     lambda x, w, b, m: F.conv_transpose1d(x, w, b, 2)),
    ("convT2d_outpad", lambda: nn.ConvTranspose2d(2, 4, 3, stride=2, padding=1, output_padding=1, groups=2),
     (1, 2, 4, 4), lambda x, w, b, m: F.conv_transpose2d(x, w, b, 2, 1, 1, 2)),
    ("convT3d", lambda: nn.ConvTranspose3d(2, 2, 2, bias=False), (1, 2, 3, 3, 3),
     lambda x, w, b, m: F.conv_transpose3d(x, w, b)),
]


@pytest.mark.parametrize("policy", POLICIES.values(), ids=POLICIES.keys())
@pytest.mark.parametrize("name, make, shape, op", WEIGHT_LAYERS, ids=[c[0] for c in WEIGHT_LAYERS])
def test_weight_layer_rounds_inputs_weights_outputs_and_their_gradients(name, make, shape, op, policy):
    torch.manual_seed(0)
    layer = make()
    x = torch.randn(shape) * 3
    emu = from_float(layer, policy)
    xe = leaf(x)
    y = emu(xe)
    g_up = torch.randn_like(y) * 2
    y.backward(g_up)

    P = policy
    xq, wq = leaf(Q(x, P.input)), leaf(Q(layer.weight, P.weight))
    bq = None if layer.bias is None else leaf(Q(layer.bias, P.weight))
    y_ref = op(xq, wq, bq, layer)
    assert torch.equal(y, Q(y_ref, P.output))
    if P.grad_output is None and P.grad_input is None:
        return
    ins = [t for t in (xq, wq, bq) if t is not None]
    grads = torch.autograd.grad(y_ref, ins, Q(g_up, P.grad_output))
    assert torch.equal(xe.grad, Q(grads[0], P.grad_input))
    assert torch.equal(layer.weight.grad, Q(grads[1], P.grad_weight))
    if bq is not None:
        assert torch.equal(layer.bias.grad, Q(grads[2], P.grad_weight))


def test_conv_transpose_honours_output_size():
    torch.manual_seed(0)
    layer = nn.ConvTranspose2d(2, 2, 3, stride=2)
    x = torch.randn(1, 2, 4, 4)
    emu = from_float(layer, POLICIES["e5m2"])
    y = emu(x, output_size=[10, 10])
    assert y.shape == (1, 2, 10, 10)
    P = POLICIES["e5m2"]
    ref = F.conv_transpose2d(Q(x, P.input), Q(layer.weight, P.weight), Q(layer.bias, P.weight), 2, 0, (1, 1))
    assert torch.equal(y, Q(ref, P.output))


@pytest.mark.parametrize("policy", POLICIES.values(), ids=POLICIES.keys())
@pytest.mark.parametrize("kwargs", [{}, {"padding_idx": 2, "scale_grad_by_freq": True}], ids=["plain", "pad_freq"])
def test_embedding_rounds_the_table_and_its_gradient(policy, kwargs):
    torch.manual_seed(0)
    layer = nn.Embedding(10, 6, **kwargs)
    with torch.no_grad():
        layer.weight.mul_(40)
    idx = torch.tensor([[1, 2, 2, 9], [0, 2, 5, 1]])
    emu = from_float(layer, policy)
    y = emu(idx)
    g_up = torch.randn_like(y)
    y.backward(g_up)
    P = policy
    wq = leaf(Q(layer.weight, P.weight))
    y_ref = F.embedding(idx, wq, kwargs.get("padding_idx"), scale_grad_by_freq=kwargs.get("scale_grad_by_freq", False))
    assert torch.equal(y, Q(y_ref, P.output))
    if P.grad_weight is not None:
        (gw,) = torch.autograd.grad(y_ref, wq, Q(g_up, P.grad_output))
        assert torch.equal(layer.weight.grad, Q(gw, P.grad_weight))


def test_embedding_max_norm_renormalises_the_stored_weight_as_torch_does():
    torch.manual_seed(0)
    layer = nn.Embedding(8, 4, max_norm=1.0)
    with torch.no_grad():
        layer.weight.mul_(3)
    twin = copy.deepcopy(layer)
    idx = torch.tensor([0, 3, 3, 7])
    twin(idx)  # torch renormalises rows 0, 3, 7 of its weight in place
    y = from_float(layer, POLICIES["e5m2"])(idx)
    assert torch.equal(layer.weight, twin.weight)
    P = POLICIES["e5m2"]
    assert torch.equal(y, Q(F.embedding(idx, Q(twin.weight, P.weight)), P.output))


def test_sparse_embedding_with_rounded_weight_gradient_is_refused():
    with pytest.raises(ValueError, match="sparse=True"):
        from_float(nn.Embedding(4, 2, sparse=True), POLICIES["e5m2"])
    from_float(nn.Embedding(4, 2, sparse=True), POLICIES["fwd_only"])  # no gradient rounding: fine


OUTPUT_LAYERS = [
    ("batchnorm2d", lambda: nn.BatchNorm2d(3), (4, 3, 5, 5)),
    ("layernorm", lambda: nn.LayerNorm(6), (3, 4, 6)),
    ("groupnorm", lambda: nn.GroupNorm(2, 4), (2, 4, 3)),
    ("rmsnorm", lambda: nn.RMSNorm(5), (3, 5)),
    ("relu", nn.ReLU, (5, 7)),
    ("gelu", nn.GELU, (5, 7)),
    ("tanh", nn.Tanh, (5, 7)),
    ("sigmoid", nn.Sigmoid, (5, 7)),
    ("silu", nn.SiLU, (5, 7)),
    ("softmax", lambda: nn.Softmax(dim=-1), (5, 7)),
    ("prelu", nn.PReLU, (5, 7)),
]


@pytest.mark.parametrize("policy", POLICIES.values(), ids=POLICIES.keys())
@pytest.mark.parametrize("name, make, shape", OUTPUT_LAYERS, ids=[c[0] for c in OUTPUT_LAYERS])
def test_norm_and_activation_round_their_output_and_its_gradient(name, make, shape, policy):
    torch.manual_seed(0)
    layer = make()
    twin = copy.deepcopy(layer)  # runs the same computation unemulated (BatchNorm running stats included)
    x = torch.randn(shape) * 4
    xe, xr = leaf(x), leaf(x)
    y = from_float(layer, policy)(xe)
    y_ref = twin(xr)
    assert torch.equal(y, Q(y_ref, policy.output))
    for a, b in zip(layer.buffers(), twin.buffers()):
        assert torch.equal(a, b)
    if policy.grad_output is not None:
        g_up = torch.randn_like(y)
        y.backward(g_up)
        y_ref.backward(Q(g_up, policy.grad_output))
        assert torch.equal(xe.grad, xr.grad)


def test_from_float_shares_parameters_buffers_and_hooks():
    bn = nn.BatchNorm1d(3)
    calls = []
    bn.register_forward_hook(lambda m, i, o: calls.append(type(m).__name__))
    emu = from_float(bn, POLICIES["e5m2"])
    assert isinstance(emu, nn.BatchNorm1d) and isinstance(emu, EmuLayer)
    assert emu.weight is bn.weight and emu.running_mean is bn.running_mean
    assert emu._parameters is bn._parameters and emu._buffers is bn._buffers
    emu(torch.randn(4, 3))
    assert calls == ["EmuBatchNorm1d"]
    assert list(emu.state_dict()) == list(bn.state_dict())


def test_stochastic_gradients_lie_on_the_grid_and_repeat_under_manual_seed():
    layer = nn.Linear(16, 8)
    emu = EmuLinear.from_float(layer, "e5m2")  # backward stochastic by default
    x = leaf(torch.randn(32, 16))

    def grads(seed):
        torch.manual_seed(seed)
        layer.zero_grad()
        x.grad = None
        emu(x).pow(2).sum().backward()
        return layer.weight.grad.clone(), layer.bias.grad.clone(), x.grad.clone()

    a, b, c = grads(1), grads(1), grads(2)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not all(torch.equal(u, v) for u, v in zip(a, c))
    assert all(on_grid(t, "e5m2") for t in a)


def test_float64_and_bfloat16_inputs_keep_their_dtype():
    for dtype in (torch.float64, torch.bfloat16):
        layer = nn.Linear(4, 3).to(dtype)
        y = from_float(layer, POLICIES["e5m2"])(torch.randn(2, 4, dtype=dtype))
        assert y.dtype == dtype and on_grid(y.float(), "e5m2")


def test_extra_repr_shows_the_formats():
    text = repr(from_float(nn.Conv2d(1, 2, 3), POLICIES["mixed"]))
    assert text.startswith("EmuConv2d(1, 2, kernel_size=(3, 3)")
    assert text.endswith("weight=fixed8_6/nearest, input=e4m3fn/nearest, output|grad_output=e5m2/nearest, "
                         "grad_weight|grad_input=e8m7/nearest)")
    assert repr(from_float(nn.ReLU(), POLICIES["fwd_only"])) == "EmuReLU(output=e4m3fn/toward_zero, grad_output=-)"


def test_from_float_refuses_wrong_types_and_emulated_modules():
    with pytest.raises(TypeError, match="needs a Linear"):
        EmuLinear.from_float(nn.ReLU(), "e5m2")
    emu = EmuLinear.from_float(nn.Linear(2, 2), "e5m2")
    with pytest.raises(ValueError, match="already emulated"):
        EmuLinear.from_float(emu, "e5m2")
    with pytest.raises(TypeError, match="no emulated layer for Identity"):
        from_float(nn.Identity(), POLICIES["e5m2"])


def test_subclass_keeping_forward_gets_an_emulated_subclass_of_its_own_class():
    class MyLinear(nn.Linear):
        def describe(self):
            return "mine"

    emu = from_float(MyLinear(3, 2), POLICIES["e5m2"])
    assert isinstance(emu, MyLinear) and emu.describe() == "mine"
    assert type(emu).__name__ == "EmuMyLinear"


# ---- MultiheadAttention -----------------------------------------------------------------------------------
MHA_CONFIGS = {
    "default": {}, "batch_first": {"batch_first": True}, "bias_kv_zero_attn": {"add_bias_kv": True, "add_zero_attn": True},
    "kdim_vdim": {"kdim": 6, "vdim": 5}, "no_bias": {"bias": False},
}


def _mha_inputs(cfg, L=3, S=4, N=2, E=8):
    bf = cfg.get("batch_first", False)
    shape = (lambda s, e: (N, s, e)) if bf else (lambda s, e: (s, N, e))
    q = torch.randn(shape(L, E))
    k = torch.randn(shape(S, cfg.get("kdim", E)))
    v = torch.randn(shape(S, cfg.get("vdim", E)))
    causal = torch.triu(torch.ones(L, S, dtype=torch.bool), 1)
    pad = torch.zeros(N, S, dtype=torch.bool)
    pad[0, -1] = True
    float_mask = torch.randn(L, S)
    cases = {"cross": ((q, k, v), {}), "bool_masks": ((q, k, v), {"attn_mask": causal, "key_padding_mask": pad}),
             "float_mask": ((q, k, v), {"attn_mask": float_mask})}
    if "kdim" not in cfg:
        cases["self"] = ((q, q, q), {"attn_mask": torch.triu(torch.ones(L, L, dtype=torch.bool), 1)})
        cases["kv_shared"] = ((q, k, k), {})
    return cases


@pytest.mark.parametrize("cfg", MHA_CONFIGS.values(), ids=MHA_CONFIGS.keys())
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_attention_with_fp32_policy_is_bit_identical_to_torch(cfg, train):
    """Rounding to fp32 is the identity on float32: what is left is the structure of the computation.

    (Gradient roles are left out: a rounded gradient is a fresh contiguous tensor, which can change the
    summation order of torch's bias-gradient reductions; they are checked on the grid below.)"""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, **cfg).train(train)
    emu = from_float(mha, Policy.make("fp32", grad=None))
    for label, (args, kw) in _mha_inputs(cfg).items():
        ref_out, ref_w = mha(*args, need_weights=True, **kw)
        out, w = emu(*args, need_weights=True, **kw)
        assert torch.equal(out, ref_out), label
        assert torch.equal(w, ref_w), label
        out2, none = emu(*args, need_weights=False, average_attn_weights=False, **kw)
        assert none is None and torch.equal(out2, ref_out), label
        if train:
            params = list(mha.parameters())
            g_ref = torch.autograd.grad(ref_out.sum(), params)
            g = torch.autograd.grad(out.sum(), params)
            assert all(torch.equal(a, b) for a, b in zip(g, g_ref)), label


def test_attention_unbatched_and_per_head_weights_match_torch():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 4)
    emu = from_float(mha, Policy.make("fp32"))
    q, k = torch.randn(3, 8), torch.randn(5, 8)
    ref = mha(q, k, k, average_attn_weights=False)
    got = emu(q, k, k, average_attn_weights=False)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


@pytest.mark.parametrize("param", ["in_proj_weight", "out_proj.weight"])
def test_attention_rounds_the_projection_weights(param):
    """A perturbation of a weight far below half an e5m2 ulp changes torch's output but not the emulation's:
    the weight passed to the functional call is rounded (swapping out_proj alone would miss in_proj)."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    with torch.no_grad():
        for p in mha.parameters():
            p.copy_(quantize_reference(p, emunum.get_format("e5m2"), "nearest"))
    x = torch.randn(2, 3, 8)
    emu = from_float(mha, Policy.make("e5m2"))
    before, ref_before = emu(x, x, x)[0], mha(x, x, x)[0]
    w = mha.get_parameter(param)
    with torch.no_grad():
        w.mul_(1 + 2.0**-12)
    assert torch.equal(emu(x, x, x)[0], before)
    assert not torch.equal(mha(x, x, x)[0], ref_before)


def test_attention_output_weights_and_gradients_lie_on_the_grid():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    emu = from_float(mha, Policy.make("e5m2", grad="e4m3fn"))
    x = leaf(torch.randn(2, 3, 8))
    out, w = emu(x, x, x)
    assert on_grid(out, "e5m2")
    out.square().sum().backward()
    assert on_grid(x.grad, "e4m3fn")
    assert all(on_grid(p.grad, "e4m3fn") for p in mha.parameters())


def test_attention_is_causal_needs_a_mask_like_torch():
    emu = from_float(nn.MultiheadAttention(4, 2), Policy.make("e5m2"))
    x = torch.randn(3, 1, 4)
    with pytest.raises(RuntimeError, match="attn_mask"):
        emu(x, x, x, is_causal=True)


def test_emulated_layer_roles():
    assert from_float(nn.Linear(2, 2), POLICIES["e5m2"]).emunum_roles == (
        Role.WEIGHT, Role.INPUT, Role.OUTPUT, Role.GRAD_WEIGHT, Role.GRAD_INPUT, Role.GRAD_OUTPUT)
    assert from_float(nn.Embedding(2, 2), POLICIES["e5m2"]).emunum_roles == (
        Role.WEIGHT, Role.OUTPUT, Role.GRAD_WEIGHT, Role.GRAD_OUTPUT)
    assert from_float(nn.GELU(), POLICIES["e5m2"]).emunum_roles == (Role.OUTPUT, Role.GRAD_OUTPUT)


# ---- MAD units ----------------------------------------------------------------------------------------------
def test_linear_and_conv_gemms_run_on_the_policy_mad_unit():
    from emunum import mad

    unit = mad.MADUnit(mul_fmt="e5m2", acc_fmt="fp16", chunk=4)
    P = Policy.make("e5m2", mad=unit)
    torch.manual_seed(0)
    lin, conv = nn.Linear(9, 4), nn.Conv2d(2, 3, 3, padding=1, padding_mode="circular")
    x, xc = torch.randn(3, 9), torch.randn(1, 2, 5, 5)
    y = from_float(lin, P)(x)
    ref = mad.linear(Q(x, P.input), Q(lin.weight, P.weight), Q(lin.bias, P.weight), unit)
    assert torch.equal(y, Q(ref, P.output))
    yc = from_float(conv, P)(xc)
    xp = F.pad(Q(xc, P.input), (1, 1, 1, 1), mode="circular")
    ref = mad.conv2d(xp, Q(conv.weight, P.weight), Q(conv.bias, P.weight), unit=unit)
    assert torch.equal(yc, Q(ref, P.output))
    assert "mad=MAD[e5m2:nearest -> e5m10:nearest, chunk=4]" in repr(from_float(lin, P))


def test_attention_runs_its_four_gemms_on_the_mad_unit(monkeypatch):
    from emunum import mad

    calls = []
    for name in ("linear", "matmul"):
        real = getattr(mad, name)
        monkeypatch.setattr(mad, name, lambda *a, _r=real, _n=name, **k: calls.append(_n) or _r(*a, **k))
    unit = mad.MADUnit(mul_fmt="fp32", acc_fmt="fp32")
    emu = from_float(nn.MultiheadAttention(8, 2), Policy.make("e5m2", mad=unit))
    x = torch.randn(3, 2, 8)
    out, _ = emu(x, x, x)
    assert sorted(calls) == ["linear", "linear", "matmul", "matmul"]  # packed in-projection, out-projection
    assert on_grid(out, "e5m2")


def test_layers_without_an_emulated_gemm_refuse_a_mad_unit():
    from emunum import mad

    P = Policy.make("e5m2", mad=mad.MADUnit(mul_fmt="fp32", acc_fmt="fp32"))
    for layer in (nn.Conv3d(1, 1, 2), nn.ConvTranspose2d(1, 1, 2)):
        with pytest.raises(ValueError, match=f"a {type(layer).__name__} layer has no GEMM emulated on MAD units"):
            from_float(layer, P)


# ---- per-tensor scaling -------------------------------------------------------------------------------------
def _wide_range(n=2048, offset=0, seed=0, dtype=torch.float32):
    """randn values spread over 2**-12 .. 2**12 around 2**offset: many land in a narrow format's subnormals."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * torch.exp2(torch.randint(-12, 13, (n,), generator=g))
    return (x * 2.0**offset).to(dtype)


def _scale_cases(dtype):
    yield torch.tensor([1.0, -0.25], dtype=dtype)
    for fmt in ("e4m3fn", "e5m2", "int8", "fp4_e2m1", "bf16"):  # amax exactly at max * 2**k, and its neighbours
        for k in (-3, 0, 2):
            v = torch.tensor(emunum.get_format(fmt).max * 2.0**k, dtype=dtype)
            if torch.isfinite(v):
                for w in (torch.nextafter(v, torch.tensor(0.0, dtype=dtype)), v,
                          torch.nextafter(v, torch.tensor(math.inf, dtype=dtype))):
                    yield torch.stack([w, -w / 3])
    for offset in (-100, -40, -10, 0, 10, 40, 100):
        yield _wide_range(64, offset, seed=offset + 200, dtype=torch.float64).to(dtype)  # fp16 may hold inf
    yield torch.tensor([torch.finfo(dtype).tiny / 4, 0.0], dtype=dtype)  # a subnormal amax


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2", "int8", "fp4_e2m1", "bf16"])
def test_per_tensor_scale_is_the_largest_power_of_two_keeping_amax_within_max(fmt, dtype):
    from emunum.nn import per_tensor_scale

    for x in _scale_cases(dtype):
        s = per_tensor_scale(x, fmt)
        assert s.dtype == dtype and s.shape == () and s.device == x.device
        assert s.item() == oracle_scale(x, fmt), (x, s)


@pytest.mark.parametrize("x", [torch.zeros(5), torch.zeros(0), torch.tensor([1.0, math.inf]),
                               torch.tensor([-math.inf, 2.0]), torch.tensor([math.nan, 2.0])],
                         ids=["zeros", "empty", "inf", "-inf", "nan"])
def test_per_tensor_scale_is_one_for_empty_zero_and_nonfinite_tensors(x):
    from emunum.nn import per_tensor_scale

    assert per_tensor_scale(x, "e4m3fn").item() == 1.0


@pytest.mark.parametrize("offset", [-40, 0, 40])
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2", "fp4_e2m1", "int8"])
@pytest.mark.parametrize("mode", ["nearest", "toward_zero", "up", "down", "odd", "stochastic"])
def test_scaled_rounding_is_quantize_of_x_times_s_divided_by_s(mode, fmt, offset):
    from emunum.autograd import Quantizer
    from emunum.nn import ScaledQuantizer

    x = _wide_range(offset=offset, seed=offset + 1)
    y = ScaledQuantizer(Quantizer(forward=fmt, forward_rounding=mode, seed=11), fmt)(x)
    s = oracle_scale(x, fmt)
    xs = x * s  # exact: s is a power of two and x * s stays normal
    assert torch.equal(xs.double(), x.double() * s)
    ref = quantize_reference(xs, emunum.get_format(fmt), mode, seed=11) / s
    assert torch.equal(y, ref)
    if fmt == "e4m3fn":  # the scaled tensor keeps e4m3's relative precision, wherever x lies
        big = x.abs() >= x.abs().max() * 2.0**-6
        assert ((y - x).abs()[big] <= x.abs()[big] * 2.0**-3).all()


@pytest.mark.parametrize("fmt, special", [("e4m3fn", "nan"), ("e5m2", "inf")])
def test_a_tensor_holding_inf_or_nan_is_rounded_unscaled(fmt, special):
    from emunum.autograd import Quantizer
    from emunum.nn import ScaledQuantizer

    x = torch.tensor([math.inf, -3.0, 1e-3, 1e6, math.nan, 0.0])
    y = ScaledQuantizer(Quantizer(forward=fmt), fmt)(x)
    ref = quantize_reference(x, emunum.get_format(fmt))
    torch.testing.assert_close(y, ref, atol=0, rtol=0, equal_nan=True)
    assert (torch.isnan(y[0]) if special == "nan" else y[0] == math.inf)


def test_scaled_gradient_rounding_rounds_down_or_up_on_the_scaled_grid():
    torch.manual_seed(0)
    layer = nn.Linear(64, 32)
    pol = Policy.make("e4m3fn", scaling="per_tensor", grad=None, grad_weight=("e4m3fn", "stochastic", "per_tensor"))
    emu = from_float(layer, pol)
    x = torch.randn(16, 64) * 1e-4
    g_up = torch.randn(16, 32) * 1e-5  # gw ~ 1e-8, far below e4m3's range: unscaled, all would round to 0
    emu(x).backward(g_up)
    xq = Q(x, pol.input)
    gw = g_up.t() @ xq  # the weight gradient before its rounding (F.linear's backward)
    fmt, s = pol.grad_weight.fmt, oracle_scale(gw, "e4m3fn")
    down = quantize_reference(gw * s, fmt, "down") / s
    up = quantize_reference(gw * s, fmt, "up") / s
    got = layer.weight.grad
    assert ((got == down) | (got == up)).all()
    assert (got != quantize_reference(gw * s, fmt, "nearest") / s).any()  # stochastic, not nearest
    assert (got != 0).float().mean() > 0.9


def test_scaled_layers_compile_fullgraph_to_the_eager_results():
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4))
    pol = POLICIES["e4m3_scaled"]
    eager, compiled = copy.deepcopy(base), copy.deepcopy(base)
    emunum.patch(eager, pol)
    emunum.patch(compiled, pol)
    x = torch.randn(8, 12) * 1e-3
    g = torch.randn(8, 4) * 1e3
    y = eager(x)
    y.backward(g)
    yc = torch.compile(compiled, fullgraph=True)(x)
    yc.backward(g)
    assert torch.equal(y, yc)
    for a, b in zip(eager.parameters(), compiled.parameters()):
        assert torch.equal(a.grad, b.grad)


def test_tracing_does_not_change_scaled_results():
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4))
    pol = Policy.make("e4m3fn", scaling="per_tensor")  # stochastic gradient rounding
    x, g = torch.randn(8, 12), torch.randn(8, 4) * 1e-6

    def run(trace):
        m = emunum.patch(copy.deepcopy(base), pol)
        torch.manual_seed(5)
        with (emunum.trace.collect(m, every=1) if trace else contextlib_null()):
            m(x).backward(g)
        return [p.grad for p in m.parameters()]

    for a, b in zip(run(False), run(True)):
        assert torch.equal(a, b)


def contextlib_null():
    import contextlib

    return contextlib.nullcontext()


def test_extra_repr_shows_the_scaling():
    assert repr(from_float(nn.ReLU(), Policy.make("e4m3fn", scaling="per_tensor", grad=None))) == \
        "EmuReLU(output=e4m3fn/nearest/per_tensor, grad_output=-)"


@pytest.mark.parametrize("fmt, kw", [("e5m2", {}), ("e4m3fn", {"grad": "e5m2", "ste": "clipped"}),
                                     ("fixed16_12", {}), ("bf16", {"grad_rounding": "nearest"})])
def test_merged_value_and_gradient_node_gives_the_same_bits_as_the_pair(fmt, kw):
    """_merged_quantizer (one straight-through node per role) == the separate value and gradient quantisers,
    outputs and gradients bit for bit, stochastic seeds drawn from torch's generator included."""
    def run(merged):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Conv1d(1, 8, 5), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 36, 10), torch.nn.Tanh())
        emunum.patch(m, fmt=fmt, **kw)
        if not merged:
            for mod in m.modules():
                if "_emunum_q1" in mod.__dict__:
                    mod.__dict__["_emunum_q1"] = {}
        torch.manual_seed(1)
        x = torch.randn(16, 1, 40)
        for _ in range(3):
            m.zero_grad()
            out = m(x)
            out.square().sum().backward()
        return [out.detach()] + [p.grad.clone() for p in m.parameters()]

    merged, pair = run(True), run(False)
    assert all(torch.equal(a, b) for a, b in zip(merged, pair))


class _ResidualBlock(nn.Module):
    """A ResNet basic block; ``inplace`` selects ``out += identity`` and ReLU(inplace=True) or their
    out-of-place forms (the same arithmetic)."""

    def __init__(self, inplace: bool):
        super().__init__()
        self.inplace = inplace
        self.c1 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU(inplace=inplace)
        self.c2 = nn.Conv2d(4, 4, 3, padding=1, bias=False)

    def forward(self, x):
        out = self.c2(self.relu(self.bn(self.c1(x))))
        if self.inplace:
            out += x
        else:
            out = out + x
        return self.relu(out)


@pytest.mark.parametrize("kw", [{"scaling": "per_tensor"}, {"grad_scaling": "per_tensor"},
                                {"scaling": "per_tensor", "grad": "e5m2", "grad_rounding": "nearest"}])
def test_in_place_ops_after_a_scaled_layer_give_the_out_of_place_bits(kw):
    """A per-tensor-scaled layer returns a tensor that later in-place ops may modify, with the values and
    gradients of the out-of-place model (stochastic seeds drawn in the same order)."""
    def run(inplace):
        torch.manual_seed(0)
        m = emunum.patch(_ResidualBlock(inplace), fmt="e4m3fn", **kw)
        x = torch.randn(2, 4, 5, 5, requires_grad=True)
        y = m(x)
        y.square().sum().backward()
        return [y.detach(), x.grad] + [p.grad for p in m.parameters()]

    for a, b in zip(run(True), run(False), strict=True):
        assert torch.equal(a, b)
