"""emunum.patch / unpatch / patched on models written as public code writes them.

Three model styles, none written for emunum: a ResNet-style CNN (torchvision's BasicBlock with a downsample
branch and batch norm), an nn.TransformerEncoder, and an MLP with tanh. Each guarantee is checked on all
three: Parameters reused (optimizers built before the patch keep working), state_dict keys unchanged and
state dicts interchangeable, patching twice idempotent, unpatch restoring the original objects and
bit-identical outputs, formats in print(model), train/eval mode and hooks surviving.
"""
import copy
import io
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import emunum
from emunum.nn import EmuLayer
from emunum.patch import unregister
from emunum.reference import quantize_reference


# ---- models, as public code writes them ------------------------------------------------------------------
def conv3x3(in_planes, out_planes, stride=1):
    """3x3 convolution with padding"""
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes, out_planes, stride=1):
    """1x1 convolution"""
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x

        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)

        out = self.conv2(out)
        out = self.bn2(out)

        if self.downsample is not None:
            identity = self.downsample(x)

        out += identity
        out = self.relu(out)

        return out


class ResNet(nn.Module):
    def __init__(self, block, layers, num_classes=10, width=8):
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._make_layer(block, width, layers[0])
        self.layer2 = self._make_layer(block, width * 2, layers[1], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 2 * block.expansion, num_classes)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, block, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                conv1x1(self.inplanes, planes * block.expansion, stride),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        for _ in range(1, blocks):
            layers.append(block(self.inplanes, planes))
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        x = self.fc(x)
        return x


class TransformerClassifier(nn.Module):
    def __init__(self, vocab=50, d_model=16, nhead=2, num_layers=2, num_classes=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=32, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens, padding_mask=None):
        h = self.encoder(self.embed(tokens), src_key_padding_mask=padding_mask)
        return self.head(h.mean(dim=1))


class MLP(nn.Module):
    def __init__(self, sizes=(10, 32, 32, 4)):
        super().__init__()
        layers = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(nn.Tanh())
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


def _batch(kind, seed=1):
    g = torch.Generator().manual_seed(seed)
    if kind == "resnet":
        return (torch.randn(4, 3, 8, 8, generator=g),), torch.randint(0, 10, (4,), generator=g)
    if kind == "transformer":
        return (torch.randint(0, 50, (3, 5), generator=g),), torch.randint(0, 3, (3,), generator=g)
    return (torch.randn(6, 10, generator=g) * 2,), torch.randint(0, 4, (6,), generator=g)


def make_model(kind):
    torch.manual_seed(0)
    return {"resnet": lambda: ResNet(BasicBlock, [1, 1]), "transformer": TransformerClassifier, "mlp": MLP}[kind]()


KINDS = ["resnet", "transformer", "mlp"]


def snapshot(model):
    return [(n, m, type(m)) for n, m in model.named_modules()]


def step_loss(model, kind, seed=1):
    args, target = _batch(kind, seed)
    return F.cross_entropy(model(*args), target)


def outputs(model, kind):
    with torch.no_grad():
        return model(*_batch(kind)[0])


# ---- guarantees on the three model styles ----------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_patch_reuses_parameters_so_an_earlier_optimizer_trains_the_patched_model(kind):
    model = make_model(kind)
    params = list(model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in params]
    assert emunum.patch(model, fmt="e5m2") is model
    assert len(list(model.parameters())) == len(params)
    assert all(a is b for a, b in zip(model.parameters(), params))
    opt.zero_grad()
    step_loss(model, kind).backward()
    opt.step()
    assert all(p.grad is not None for p in params)
    assert any(not torch.equal(p, b) for p, b in zip(params, before))


@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_keys_unchanged_and_state_dicts_load_both_ways(kind):
    model = make_model(kind)
    keys = list(model.state_dict())
    emunum.patch(model, fmt="e4m3fn", grad="e5m2")
    assert list(model.state_dict()) == keys
    model.train()
    step_loss(model, kind).backward()  # moves BatchNorm running statistics
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    fresh = make_model(kind)
    fresh.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))  # patched -> unpatched
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))
    other = emunum.patch(make_model(kind), fmt="e4m3fn", grad="e5m2")
    other.load_state_dict(fresh.state_dict())  # unpatched -> patched
    assert all(torch.equal(a, b) for a, b in zip(other.state_dict().values(), model.state_dict().values()))


@pytest.mark.parametrize("kind", KINDS)
def test_patching_twice_is_idempotent_and_another_policy_raises(kind):
    model = emunum.patch(make_model(kind), fmt="e5m2", keep_first_last=True)
    snap = snapshot(model)
    assert emunum.patch(model, fmt="fp8_152", keep_first_last=True) is model  # an equal policy
    assert [(n, m) for n, m, _ in snap] == [(n, m) for n, m in model.named_modules()]
    with pytest.raises(ValueError, match="already patched .* another policy; call emunum.unpatch"):
        emunum.patch(model, fmt="e4m3fn")


def test_patching_the_whole_model_after_a_part_completes_the_patch():
    model = make_model("transformer")
    emunum.patch(model.encoder, fmt="e5m2")
    enc = [m for m in model.encoder.modules() if isinstance(m, EmuLayer)]
    emunum.patch(model, fmt="e5m2")
    assert isinstance(model.embed, EmuLayer) and isinstance(model.head, EmuLayer)
    assert enc == [m for m in model.encoder.modules() if isinstance(m, EmuLayer)]  # not patched again
    emunum.unpatch(model)
    assert not any(isinstance(m, EmuLayer) for m in model.modules())


def test_an_approx_only_policy_replaces_activations_alone():
    model = emunum.patch(make_model("mlp"), approx={"tanh": "pwl"})
    assert [type(m).__module__ for m in model.net] == ["torch.nn.modules.linear", "emunum.approx.modules"] * 2 + [
        "torch.nn.modules.linear"]


@pytest.mark.parametrize("kind", KINDS)
def test_unpatch_restores_original_objects_and_bit_identical_outputs(kind):
    model = make_model(kind).eval()
    snap = snapshot(model)
    ref = outputs(model, kind)
    emunum.patch(model, fmt="e5m2")
    assert not torch.equal(outputs(model, kind), ref)
    assert emunum.unpatch(model) is model
    assert [(n, m, type(m)) for n, m in model.named_modules()] == snap
    assert not any(isinstance(m, EmuLayer) for m in model.modules())
    assert torch.equal(outputs(model, kind), ref)
    assert emunum.unpatch(model) is model  # unpatching an unpatched model does nothing


@pytest.mark.parametrize("kind", KINDS)
def test_patched_context_manager_unpatches_even_on_error(kind):
    model = make_model(kind)
    snap = snapshot(model)
    with pytest.raises(RuntimeError, match="boom"):
        with emunum.patched(model, fmt="e5m2") as m:
            assert m is model and any(isinstance(x, EmuLayer) for x in model.modules())
            raise RuntimeError("boom")
    assert [(n, m, type(m)) for n, m in model.named_modules()] == snap


@pytest.mark.parametrize("kind", KINDS)
def test_print_shows_the_formats(kind):
    model = emunum.patch(make_model(kind), fmt="e4m3fn", grad="e5m2")
    text = str(model)
    assert "weight|input|output=e4m3fn/nearest" in text
    assert "grad_weight|grad_input|grad_output=e5m2/stochastic" in text


@pytest.mark.parametrize("kind", KINDS)
def test_train_eval_mode_and_hooks_survive_patch_and_unpatch(kind):
    model = make_model(kind).train()
    first = next(m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d, nn.Embedding)))
    seen = []
    first.register_forward_hook(lambda m, i, o: seen.append("before"))
    emunum.patch(model, fmt="e5m2")
    emu_first = next(m for m in model.modules() if isinstance(m, EmuLayer))
    assert all(m.training for m in model.modules())
    handle = emu_first.register_forward_hook(lambda m, i, o: seen.append("during"))
    model.eval()
    outputs(model, kind)
    assert seen == ["before", "during"]
    emunum.unpatch(model)
    assert not any(m.training for m in model.modules())  # eval() while patched reaches the originals
    outputs(model, kind)
    assert seen == ["before", "during"] * 2  # a hook added while patched is the original's hook too
    handle.remove()
    outputs(model, kind)
    assert seen[-1] == "before" and len(seen) == 5


@pytest.mark.parametrize("kind", KINDS)
def test_every_weight_layer_is_emulated(kind):
    model = emunum.patch(make_model(kind), fmt="e5m2")
    plain = [n for n, m in model.named_modules()
             if isinstance(m, (nn.Linear, nn.Conv2d, nn.Embedding, nn.MultiheadAttention, nn.BatchNorm2d,
                               nn.LayerNorm, nn.Tanh, nn.ReLU))
             and not isinstance(m, EmuLayer) and not n.endswith("self_attn.out_proj")]
    assert plain == []


def test_keep_first_last_leaves_the_first_and_last_weight_layers():
    model = emunum.patch(make_model("resnet"), fmt="e5m2", keep_first_last=True)
    assert type(model.conv1) is nn.Conv2d and type(model.fc) is nn.Linear
    assert isinstance(model.layer1[0].conv1, EmuLayer) and isinstance(model.bn1, EmuLayer)
    model = emunum.patch(make_model("transformer"), fmt="e5m2", keep_first_last=True)
    assert type(model.embed) is nn.Embedding and type(model.head) is nn.Linear
    assert isinstance(model.encoder.layers[0].self_attn, EmuLayer)


def test_filter_selects_layers_by_module_and_name():
    model = emunum.patch(make_model("resnet"), fmt="e5m2",
                         filter=lambda m, name: isinstance(m, nn.Conv2d) and name.startswith("layer2"))
    emulated = sorted(n for n, m in model.named_modules() if isinstance(m, EmuLayer))
    assert emulated == ["layer2.0.conv1", "layer2.0.conv2", "layer2.0.downsample.0"]


def test_filter_matching_nothing_is_an_error_naming_the_candidates():
    model = make_model("mlp")
    snap = snapshot(model)
    with pytest.raises(ValueError, match=r"filter left none of the 5 emulable layers: 'net.0', 'net.1'"):
        emunum.patch(model, fmt="e5m2", filter=lambda m, n: n == "nonexistent")
    assert [(n, m, type(m)) for n, m in model.named_modules()] == snap


class _Projection(nn.Module):
    """A GEMM layer no registry entry swaps (as GPT-2's ``Conv1D``): its ``F.linear`` is a functional GEMM."""

    def __init__(self, a, b):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(b, a) / a ** 0.5)

    def forward(self, x):
        return F.linear(x, self.weight)


class _Tower(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.inner, self.head = nn.Embedding(50, 16), _Projection(16, 16), nn.Linear(16, 4)

    def forward(self, ids):
        return self.head(torch.tanh(self.inner(self.embed(ids))))


@pytest.mark.parametrize("policy", [dict(fmt="e5m2", keep_first_last=True, filter=lambda m, n: n != "embed"),
                                    dict(fmt="nvfp4", keep_first_last=True)], ids=["element", "block"])
def test_a_filter_that_leaves_only_functional_gemms_emulates_them_instead_of_refusing(policy):
    model = emunum.patch(_Tower(), **policy)
    ids = torch.randint(0, 50, (6, 3), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # what runs off the format was left out by the policy: no warning
        cov = emunum.coverage(model, ids)
    by_module = {(r.module, r.emulated) for r in cov.records}
    assert ("inner", True) in by_module and ("head", False) in by_module and ("inner", False) not in by_module
    assert all(r.reason == "keep_first_last" for r in cov.unemulated())


def test_a_filter_that_leaves_no_gemm_emulated_warns_at_the_first_forward_or_raises_when_strict():
    policy = dict(fmt="nvfp4", filter=lambda m, n: not isinstance(m, nn.Linear))  # MLP's own forward is accepted
    model = emunum.patch(make_model("mlp"), **policy)
    with pytest.warns(RuntimeWarning, match="no GEMM of the forward ran emulated"):
        model(*_batch("mlp")[0])
    strict = emunum.patch(make_model("mlp"), strict=True, **policy)
    with pytest.raises(ValueError, match="no GEMM of the forward ran emulated"):
        strict(*_batch("mlp")[0])


@pytest.mark.parametrize("kwargs, exc, pattern", [
    (dict(fmt="fp7"), ValueError, "not a known format"),
    (dict(fmt="e5m2", grad="e5m9x"), ValueError, "grad='e5m9x'"),
    (dict(fmt="e5m2", wieght="int8"), TypeError, "unknown policy option"),
    (dict(grad=None), ValueError, "the policy emulates nothing"),
    (dict(fmt="e5m2", rounding="up-ish"), ValueError, "rounding='up-ish'"),
])
def test_bad_input_raises_clear_errors_and_leaves_the_model_alone(kwargs, exc, pattern):
    model = make_model("mlp")
    snap = snapshot(model)
    with pytest.raises(exc, match=pattern):
        emunum.patch(model, **kwargs)
    assert [(n, m, type(m)) for n, m in model.named_modules()] == snap


def test_patch_without_options_uses_the_contract_default_fp8_152():
    model = emunum.patch(make_model("mlp"))
    assert "e5m2" in repr(model)


def test_patch_refuses_non_modules():
    with pytest.raises(TypeError, match="must be a torch.nn.Module"):
        emunum.patch("model", fmt="e5m2")
    with pytest.raises(TypeError, match="must be a torch.nn.Module"):
        emunum.unpatch(3)


def test_a_model_without_emulable_layers_warns_when_functional_gemms_are_off():
    with pytest.warns(RuntimeWarning, match="has no layer to emulate"):
        model = emunum.patch(nn.Sequential(nn.Flatten(), nn.Dropout()), fmt="e5m2", functional=False)
    assert type(model[0]) is nn.Flatten


def test_a_subclass_overriding_forward_is_skipped_with_a_warning():
    class Scaled(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    model = nn.Sequential(Scaled(3, 3), nn.Linear(3, 2))
    with pytest.warns(RuntimeWarning, match=r"'0' \(Scaled\) overrides Linear.forward"):
        emunum.patch(model, fmt="e5m2")
    assert type(model[0]) is Scaled and isinstance(model[1], EmuLayer)


def test_a_module_with_an_instance_forward_is_skipped_with_a_warning():
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))
    model[0].forward = lambda x: x
    with pytest.warns(RuntimeWarning, match=r"'0' \(Linear\) overrides its instance's forward attribute"):
        emunum.patch(model, fmt="e5m2")
    assert type(model[0]) is nn.Linear and isinstance(model[1], EmuLayer)


def test_a_layer_that_is_the_whole_model_is_returned_and_restored():
    lin = nn.Linear(3, 2)
    emu = emunum.patch(lin, fmt="e5m2")
    assert isinstance(emu, EmuLayer) and emu.weight is lin.weight
    assert emunum.unpatch(emu) is lin


def test_a_module_registered_twice_is_swapped_everywhere_and_restored():
    shared = nn.Linear(4, 4)
    model = nn.Sequential(shared, nn.Tanh(), shared)
    emunum.patch(model, fmt="e5m2")
    assert model[0] is model[2] and isinstance(model[0], EmuLayer)
    emunum.unpatch(model)
    assert model[0] is shared and model[2] is shared


def test_register_a_custom_layer():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.full((3,), 1.1))

        def forward(self, x):
            return x * self.weight

    class EmuScale(nn.Module):
        def __init__(self, orig, policy):
            super().__init__()
            self.weight = orig.weight
            self.fmt = policy.weight.fmt

        def forward(self, x):
            return x * emunum.quantize_ste(self.weight, self.fmt)

    emunum.register(Scale, EmuScale, weight_layer=True)
    try:
        with pytest.raises(ValueError, match="already registered"):
            emunum.register(Scale, EmuScale)
        model = nn.Sequential(Scale(), nn.Linear(3, 3))
        emunum.patch(model, weight="e5m2")
        assert isinstance(model[0], EmuScale) and model[0].weight is model.get_parameter("0.weight")
        assert torch.equal(model[0](torch.ones(3)), torch.full((3,), 1.0))
        emunum.unpatch(model)
        assert type(model[0]) is Scale
    finally:
        unregister(Scale)


def test_a_factory_that_copies_parameters_is_refused():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(2))

    emunum.register(Scale, lambda m, p: copy.deepcopy(m))
    try:
        with pytest.raises(RuntimeError, match="does not reuse the original Parameters"):
            emunum.patch(nn.Sequential(Scale()), fmt="e5m2")
    finally:
        unregister(Scale)


def test_approx_replaces_activations_and_unpatch_restores_them():
    model = make_model("mlp")
    tanh = model.net[1]
    emunum.patch(model, fmt="e5m2", approx={"tanh": "hard"})
    from emunum.approx import Tanh as ApproxTanh

    assert isinstance(model.net[1], ApproxTanh) and isinstance(model.net[3], ApproxTanh)
    x = torch.tensor([[-3.0, -0.25, 0.0, 0.25, 3.0]])
    assert torch.equal(model.net[1](x), torch.tensor([[-1.0, -0.25, 0.0, 0.25, 1.0]]))  # hard tanh: clamp
    emunum.unpatch(model)
    assert model.net[1] is tanh


# ---- transformer fast paths ------------------------------------------------------------------------------
def test_transformer_inference_fast_path_is_off_while_patched():
    """In eval mode under no_grad torch runs TransformerEncoderLayer as one fused kernel that never calls
    the layers; patched, the emulated layers run: the output is the same with torch's fast path switched
    off globally, and the encoder's output (its last LayerNorm's) lies on the format's grid."""
    model = make_model("transformer").eval()
    args = _batch("transformer")[0]
    layer = model.encoder.layers[0]
    flag = layer.activation_relu_or_gelu
    with emunum.patched(model, fmt="e5m2"):
        assert layer.activation_relu_or_gelu == 0
        fast_allowed = outputs(model, "transformer")
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            fast_off = outputs(model, "transformer")
        finally:
            torch.backends.mha.set_fastpath_enabled(True)
        assert torch.equal(fast_allowed, fast_off)
        with torch.no_grad():
            h = model.encoder(model.embed(args[0]))
        assert torch.equal(quantize_reference(h, emunum.get_format("e5m2"), "nearest"), h)
    assert layer.activation_relu_or_gelu == flag


def test_transformer_encoder_nested_tensor_fast_path_is_off_while_patched():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, batch_first=True)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    assert enc.use_nested_tensor
    x = torch.randn(3, 5, 16)
    mask = torch.zeros(3, 5, dtype=torch.bool)
    mask[1, 3:] = True
    ref = enc(x, src_key_padding_mask=mask)
    with emunum.patched(enc, fmt="e5m2"), torch.no_grad():
        assert not enc.use_nested_tensor
        out = enc(x, src_key_padding_mask=mask)
    assert not out.is_nested and out.shape == ref.shape
    assert torch.equal(quantize_reference(out, emunum.get_format("e5m2"), "nearest"), out)
    assert enc.use_nested_tensor


def test_a_bare_non_dynamically_quantizable_linear_is_emulated():
    from torch.nn.modules.linear import NonDynamicallyQuantizableLinear

    model = nn.Sequential(NonDynamicallyQuantizableLinear(3, 3))
    emunum.patch(model, fmt="e5m2")
    assert isinstance(model[0], NonDynamicallyQuantizableLinear) and isinstance(model[0], EmuLayer)


def test_transformer_with_padding_mask_trains_patched():
    model = emunum.patch(make_model("transformer"), fmt="e5m2")
    tokens, target = _batch("transformer")
    mask = torch.zeros(3, 5, dtype=torch.bool)
    mask[0, 3:] = True
    F.cross_entropy(model(*tokens, padding_mask=mask), target).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# ---- torch.compile ---------------------------------------------------------------------------------------
def test_patched_model_under_torch_compile_matches_eager():
    model = emunum.patch(make_model("mlp"), fmt="e5m2", grad_rounding="nearest")
    args, target = _batch("mlp")

    def run(m):
        model.zero_grad()
        out = m(*args)
        F.cross_entropy(out, target).backward()
        return out.detach(), [p.grad.clone() for p in model.parameters()]

    eager_out, eager_grads = run(model)
    compiled_out, compiled_grads = run(torch.compile(model, fullgraph=True))
    assert torch.equal(compiled_out, eager_out)
    assert all(torch.equal(a, b) for a, b in zip(compiled_grads, eager_grads))


def test_import_emunum_stays_lean():
    import subprocess
    import sys

    code = ("import sys, emunum; bad = [m for m in ('numba.cuda', 'hydra', 'emunum.kernels.cuda') "
            "if m in sys.modules]; assert not bad, bad; import torch; assert not torch.cuda.is_initialized()")
    with warnings.catch_warnings():
        subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("how", ["trace", "script"])
def test_torchscript_of_a_patched_model_is_refused_with_a_clear_error(how):
    model = emunum.patch(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()), "e5m2")
    with pytest.raises(Exception, match="torch.export or torch.compile"):
        if how == "trace":
            torch.jit.trace(model, torch.randn(2, 4))
        else:
            torch.jit.script(model)
