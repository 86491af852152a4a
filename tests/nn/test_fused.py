"""The fused node (``emunum.nn.fused``): one autograd node per element-wise Linear/Conv call gives the bits of the
separate rounding nodes around torch's GEMM: forward outputs, every gradient of every step, weights after optimizer
steps, and the state of torch's generator afterwards (so every stochastic-rounding seed was drawn, in the same
order: a swapped draw changes the gradient roundings).

Oracle: the same model and steps with the fused node off (``fused(False)``: the role-by-role path, unchanged),
compared bit for bit with zero tolerance. Where the node must not apply, the layer falls back to that path.
"""
import os
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import emunum
import emunum.trace
from emunum import FixedFormat, grid
from emunum.nn.fused import fused, set_fused


@pytest.fixture(autouse=True)
def _elide_every_size():
    """Elision at every tensor size (these tests' tensors are small; the default starts at 2**16 elements)."""
    prev = grid.set_min_elements(0)
    yield
    grid.set_min_elements(prev)


NODE = "_FusedGemmBackward"
POLICIES = {
    "e4m3fn_e5m2": dict(fmt="e4m3fn", grad="e5m2"),
    "sr_forward_directed_grad": dict(fmt="e5m2", rounding="stochastic", grad="e4m3fn", grad_rounding="toward_zero"),
    "clipped": dict(fmt="e4m3fn", grad="e5m2", ste="clipped"),
    "fwd_only": dict(fmt="e4m3fn", grad=None, rounding="up"),
    "grad_only_bf16": dict(fmt=None, grad="bf16"),
    "input_unrounded": dict(fmt="e5m2", input=None, grad_input=None),
    "output_grad_only": dict(fmt="e4m3fn", grad="e5m2", output=None),
    "fixed_weight": dict(fmt="e5m2", weight=FixedFormat(8, 5), grad_weight="bf16"),
    "elide_off": dict(fmt="e4m3fn", grad="e5m2", elide=False),
}


def _bits(t):
    return t.detach().contiguous().view(torch.int64 if t.dtype == torch.float64 else torch.int32)


def _same(a, b):
    return a.shape == b.shape and a.stride() == b.stride() and torch.equal(_bits(a), _bits(b))


def mlp(dtype=torch.float32):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 8, bias=False), nn.GELU(), nn.Linear(8, 8),
                      nn.Linear(8, 3))
    return m.to(dtype)


def cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, stride=2, bias=False),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4, 5))


class _Conv1dNet(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.c1 = nn.Conv1d(2, 4, 3, padding=2, dilation=2)
        self.c2 = nn.Conv1d(4, 4, 3, groups=2)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(torch.tanh(self.c2(F.relu(self.c1(x)))).mean(-1))


def _mlp_loss(shape, dtype=torch.float32):
    x = torch.randn(*shape, 6, generator=torch.Generator().manual_seed(1), dtype=dtype)
    return lambda m: m(x).square().mean()


def _cnn_loss(m):
    x = torch.randn(3, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    return F.cross_entropy(m(x), torch.arange(3) % 5)


def _conv1d_loss(m):
    return m(torch.randn(3, 2, 12, generator=torch.Generator().manual_seed(1))).square().sum()


def _nodes(t):
    """Names of the autograd nodes in t's graph."""
    seen, todo, names = set(), [t.grad_fn], []
    while todo:
        n = todo.pop()
        if n is None or n in seen:
            continue
        seen.add(n)
        names.append(type(n).__name__)
        todo.extend(f for f, _ in n.next_functions)
    return names


def _train(build, loss_of, on: bool, policy: dict, steps: int = 3, prepare=None):
    """(losses, grads of every step, weights after, a draw from torch's generator after, fused nodes per step)."""
    model = emunum.patch(build(), **policy)
    if prepare is not None:
        prepare(model)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    torch.manual_seed(123)
    losses, grads, counts = [], [], []
    with fused(on):
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = loss_of(model)
            counts.append(_nodes(loss).count(NODE))
            loss.backward()
            losses.append(loss.detach().clone())
            grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
            opt.step()
    return losses, grads, [p.detach().clone() for p in model.parameters()], torch.rand(4), counts


def _check_same(a, b):
    assert len(a[0]) == len(b[0])
    for u, v in zip(a[0], b[0]):
        assert _same(u, v)
    for gu, gv in zip(a[1], b[1]):
        assert len(gu) == len(gv) and all(_same(u, v) for u, v in zip(gu, gv))
    assert all(_same(u, v) for u, v in zip(a[2], b[2]))
    assert torch.equal(a[3], b[3])  # the same number of draws from torch's generator


def _compare(build, loss_of, policy, steps=3, prepare=None, expect_fused=True):
    on = _train(build, loss_of, True, policy, steps, prepare)
    off = _train(build, loss_of, False, policy, steps, prepare)
    _check_same(on, off)
    assert off[4] == [0] * steps
    if expect_fused:  # the first forward runs under patch's coverage check (a dispatch mode): role by role
        assert all(c > 0 for c in on[4][1:])
    return on


@pytest.mark.parametrize("shape", [(5,), (2, 4), (2, 2, 3)], ids=["2d", "3d", "4d"])
@pytest.mark.parametrize("policy", POLICIES)
def test_a_patched_mlp_gives_the_same_bits_with_the_fused_node_on_and_off(policy, shape):
    _compare(mlp, _mlp_loss(shape), POLICIES[policy])


@pytest.mark.parametrize("policy", POLICIES)
def test_a_patched_cnn_gives_the_same_bits_with_the_fused_node_on_and_off(policy):
    _compare(cnn, _cnn_loss, POLICIES[policy])
    _compare(_Conv1dNet, _conv1d_loss, POLICIES[policy])


def test_float64_layers_give_the_same_bits_with_the_fused_node_on_and_off():
    _compare(lambda: mlp(torch.float64), _mlp_loss((4,), torch.float64), POLICIES["e4m3fn_e5m2"])


@pytest.mark.parametrize("frozen", ["weight", "bias", "both_first_layer"])
def test_frozen_parameters_draw_no_seeds_for_their_gradients_as_before(frozen):
    def prepare(m):
        first = m[0]
        if frozen in ("weight", "both_first_layer"):
            first.weight.requires_grad_(False)
        if frozen in ("bias", "both_first_layer"):
            first.bias.requires_grad_(False)
            m[4].bias.requires_grad_(False)
    _compare(mlp, _mlp_loss((4,)), POLICIES["e4m3fn_e5m2"], prepare=prepare)


@pytest.mark.parametrize("name", ["bert", "llama", "gpt2"])
def test_transformers_give_the_same_bits_with_the_fused_node_on_and_off(name):
    pytest.importorskip("transformers")
    sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
    from third_party_models import training_case

    build, loss = training_case(name)
    # GPT-2's projections are transformers' Conv1D (functional addmm): its fused layers are the LM head only
    _compare(build, loss, POLICIES["e4m3fn_e5m2"], steps=3)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("lead", [(), (2,), (2, 1)], ids=["2d", "3d", "4d"])
@pytest.mark.parametrize("n,k,m", [(1, 1, 1), (1, 5, 3), (4, 1, 3), (4, 5, 1), (3, 4, 5)])
def test_every_gradient_has_the_bits_and_strides_of_the_separate_nodes(n, k, m, lead, bias):
    """Degenerate sizes take torch's other (column-major) gradient formulas; the input is a leaf here."""
    def run(on):
        torch.manual_seed(0)
        layer = emunum.nn.EmuLinear.from_float(nn.Linear(k, m, bias=bias), fmt="e4m3fn", grad="e5m2")
        x = torch.randn(*lead, n, k, generator=torch.Generator().manual_seed(2)).requires_grad_(True)
        torch.manual_seed(5)
        with fused(on):
            y = layer(x)
            names = _nodes(y)
            y.backward(torch.randn(y.shape, generator=torch.Generator().manual_seed(3)) * 1e3)
        grads = [x.grad, layer.weight.grad] + ([layer.bias.grad] if bias else [])
        return y, grads, torch.rand(3), names
    y1, g1, r1, names = run(True)
    y0, g0, r0, _ = run(False)
    assert names.count(NODE) == 1
    assert _same(y1, y0) and all(_same(a, b) for a, b in zip(g1, g0)) and torch.equal(r1, r0)


@pytest.mark.parametrize("wrt", ["weight", "input", "hidden", "last_bias"])
def test_autograd_grad_for_some_inputs_rounds_and_draws_only_what_the_separate_nodes_do(wrt):
    def run(on):
        model = emunum.patch(mlp(), fmt="e4m3fn", grad="e5m2")
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
        model(x)  # the coverage check's forward
        torch.manual_seed(9)
        with fused(on):
            h = model[1](model[0](x))
            out = model[5](model[4](model[3](model[2](h))))
            target = {"weight": model[2].weight, "input": x, "hidden": h, "last_bias": model[5].bias}[wrt]
            (g,) = torch.autograd.grad(out.square().sum(), [target])
        return g, torch.rand(3)
    (g1, r1), (g0, r0) = run(True), run(False)
    assert _same(g1, g0) and torch.equal(r1, r0)


def test_a_second_backward_with_retain_graph_gives_the_same_bits():
    def run(on):
        model = emunum.patch(mlp(), fmt="e4m3fn", grad="e5m2")
        loss_of = _mlp_loss((4,))
        loss_of(model)
        torch.manual_seed(4)
        with fused(on):
            loss = loss_of(model)
            loss.backward(retain_graph=True)
            loss.backward()
        return [p.grad for p in model.parameters()], torch.rand(3)
    (g1, r1), (g0, r0) = run(True), run(False)
    assert all(_same(a, b) for a, b in zip(g1, g0)) and torch.equal(r1, r0)


def _linear_call(prepare=None, **policy):
    layer = emunum.nn.EmuLinear.from_float(nn.Linear(4, 3), **(policy or dict(fmt="e5m2")))
    if prepare is not None:
        prepare(layer)
    x = torch.randn(2, 4, requires_grad=True)
    with fused(True):
        return _nodes(layer(x))


def test_the_node_is_used_for_a_plain_element_wise_layer():
    assert _linear_call() == [NODE, "AccumulateGrad", "AccumulateGrad", "AccumulateGrad"]


@pytest.mark.parametrize("case", ["per_tensor", "trace", "saved_hooks", "param_hook", "non_contiguous", "switch_off",
                                  "mad"])
def test_the_layer_rounds_role_by_role_where_the_node_does_not_apply(case):
    layer = emunum.nn.EmuLinear.from_float(
        nn.Linear(4, 3), **(dict(fmt="e5m2", scaling="per_tensor") if case == "per_tensor" else
                            dict(fmt="e4m3fn", mad="h100_fp8_e4m3") if case == "mad" else dict(fmt="e5m2")))
    x = torch.randn(2, 4, requires_grad=True)
    if case == "non_contiguous":
        x = torch.randn(4, 2, requires_grad=True).t()
    if case == "param_hook":
        layer.weight.register_hook(lambda g: g)
    with fused(case != "switch_off"):
        if case == "saved_hooks":
            with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
                names = _nodes(layer(x))
        elif case == "trace":
            model = nn.Sequential(layer)
            with emunum.trace.collect(model):
                names = _nodes(model(x))
        else:
            names = _nodes(layer(x))
    assert NODE not in names


class _ScaledConv(nn.Conv2d):
    """A convolution class of its own (a registered foreign layer): its ``_conv_forward`` is not torch's."""

    def _conv_forward(self, x, w, b):
        return super()._conv_forward(x, w * 0.5, b)


def test_a_conv_class_with_its_own_forward_rounds_role_by_role_and_keeps_its_semantics():
    cls = emunum.nn.emu_class(_ScaledConv, emunum.nn.ConvMixin)
    torch.manual_seed(0)
    layer = cls.from_float(_ScaledConv(2, 3, 3), fmt="e4m3fn", grad="e5m2")
    x = torch.randn(1, 2, 5, 5, requires_grad=True)
    with fused(True):
        y = layer(x)
    with fused(False):
        y0 = layer(x)
    assert NODE not in _nodes(y) and _same(y, y0)


def test_double_backward_through_the_node_raises_and_works_with_the_node_off():
    layer = emunum.nn.EmuLinear.from_float(nn.Linear(4, 3), fmt=None, grad="bf16")
    x = torch.randn(2, 4, dtype=torch.float32, requires_grad=True)
    with fused(True):
        (g,) = torch.autograd.grad(layer(x).square().sum(), x, create_graph=False)
        with pytest.raises(RuntimeError, match="double backward"):
            torch.autograd.grad(layer(x).square().sum(), x, create_graph=True)
    with fused(False):
        (g,) = torch.autograd.grad(layer(x).square().sum(), x, create_graph=True)
        g.sum().backward()
    assert x.grad is not None


def test_the_switch_rejects_non_bools_and_restores_its_setting():
    with pytest.raises(TypeError, match="on must be a bool"):
        set_fused(1)
    prev = set_fused(False)
    with fused(True):
        assert set_fused(True) is True
    assert set_fused(prev) is False


@pytest.mark.parametrize("min_elements", [0, 100])  # 100: some of the cnn's operands and results below it
def test_elision_counts_are_the_same_with_the_node_on_and_off(min_elements):
    grid.set_min_elements(min_elements)
    counts, runs = [], []
    for on in (True, False):
        grid.elided.clear()
        runs.append(_train(cnn, _cnn_loss, on, POLICIES["e4m3fn_e5m2"]))
        counts.append(dict(grid.elided))
    _check_same(*runs)
    assert counts[0] == counts[1] and counts[0].get("backward", 0) > 0 and runs[0][4][-1] > 0


@pytest.mark.parametrize("value,on", [("", False), ("1", True), ("on", True), ("0", False), ("false", False)])
def test_the_environment_variable_sets_the_default(value, on, monkeypatch):
    from emunum.nn import fused as module

    monkeypatch.setenv("EMUNUM_FUSED", value)
    assert module._env_default() is on


def test_the_node_is_off_unless_asked(monkeypatch):
    from emunum.nn import fused as module

    monkeypatch.delenv("EMUNUM_FUSED", raising=False)
    assert module._env_default() is False


def test_a_bad_environment_value_is_refused(monkeypatch):
    from emunum.nn import fused as module

    monkeypatch.setenv("EMUNUM_FUSED", "maybe")
    with pytest.raises(ValueError, match="EMUNUM_FUSED='maybe'"):
        module._env_default()
