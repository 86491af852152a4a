"""Rounding elision (emunum.grid, emunum.elide): a patched model gives the same bits with elision on and off
(forward outputs, gradients, weights after optimizer steps, and the state of torch's generator afterwards, so
that every seed draw happened), elision does happen where it is exact, and it does not where a rounding is
needed (average pooling, scaled dropout, overlapping max-pool, a tensor written in place).

Oracle: the same model and steps with elision off (the code path that rounds every role, unchanged), compared
bit for bit; and, for the grid claim itself, the rounding kernels: every value a rounding returns is returned
unchanged by every rounding mode of that format.
"""
import os
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import emunum
import emunum.trace
from emunum import grid
from emunum.quantize import quantize

MODES = ("nearest", "nearest_away", "toward_zero", "up", "down", "odd", "stochastic")
POLICIES = {
    "e5m2": dict(fmt="e5m2"),
    "e4m3fn_e5m2": dict(fmt="e4m3fn", grad="e5m2"),
    "directed_sr_forward": dict(fmt="e5m2", rounding="stochastic", grad="e4m3fn", grad_rounding="toward_zero"),
    "fwd_only": dict(fmt="e4m3fn", grad=None, rounding="up"),
    "grad_only_bf16": dict(fmt=None, grad="bf16"),
}



@pytest.fixture(autouse=True)
def _elide_every_size():
    """Elision at every tensor size (these tests' tensors are small; the default starts at 2**16 elements)."""
    prev = grid.set_min_elements(0)
    yield
    grid.set_min_elements(prev)


def _bits(t):
    return t.detach().contiguous().view(torch.int64 if t.dtype == torch.float64 else torch.int32)


def _same(a, b):
    return a.shape == b.shape and torch.equal(_bits(a), _bits(b))


def cnn(pool="max", dropout=0.0):
    torch.manual_seed(0)
    mid = {"max": nn.MaxPool2d(2), "avg": nn.AvgPool2d(2), "overlap": nn.MaxPool2d(3, 2, 1)}[pool]
    side = 4
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(),
                         mid, nn.Dropout(dropout), nn.Flatten(), nn.Linear(4 * side * side, 16), nn.ReLU(),
                         nn.Linear(16, 5))


def _image():
    return torch.randn(3, 3, 8, 8, generator=torch.Generator().manual_seed(1))


def _cnn_loss(m):
    y = torch.arange(3) % 5
    return F.cross_entropy(m(_image()), y)


def _train(build, loss_of, on: bool, policy: dict, steps: int = 3):
    """(outputs per step, grads of the last step, weights after, a draw from torch's generator after, elided)"""
    model = emunum.patch(build(), **policy)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    torch.manual_seed(123)
    grid.elided.clear()
    losses = []
    with grid.elision(on):
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = loss_of(model)
            loss.backward()
            losses.append(loss.detach().clone())
            grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
            opt.step()
    return losses, grads, [p.detach().clone() for p in model.parameters()], torch.rand(4), dict(grid.elided)


def _check_same(a, b):
    for x, y in zip(a[:4], b[:4]):
        xs, ys = (x, y) if isinstance(x, list) else ([x], [y])
        assert len(xs) == len(ys)
        for u, v in zip(xs, ys):
            assert _same(u, v)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_patched_cnn_gives_the_same_bits_with_elision_on_and_off(policy):
    on = _train(cnn, _cnn_loss, True, POLICIES[policy])
    off = _train(cnn, _cnn_loss, False, POLICIES[policy])
    _check_same(on, off)
    assert off[4] == {}


def test_elision_happens_where_a_tensor_is_on_the_grid():
    """The CNN's steps after the first (which runs under the coverage check): per step, the forward roundings of
    both ReLU outputs after conv, the second conv's input, the Linear input after max-pool and flatten, the last
    ReLU and the last Linear's input; and the same six gradient roundings in the backward pass."""
    on = _train(cnn, _cnn_loss, True, POLICIES["e5m2"], steps=3)
    assert on[4] == {"forward": 12, "backward": 12}


@pytest.mark.parametrize("name", ["bert", "llama", "gpt2", "resnet"])
def test_third_party_models_give_the_same_bits_with_elision_on_and_off(name):
    pytest.importorskip("transformers")
    sys.path.insert(0, os.path.dirname(__file__))
    from third_party_models import training_case

    build, loss = training_case(name)
    on = _train(build, loss, True, POLICIES["e4m3fn_e5m2"], steps=2)
    off = _train(build, loss, False, POLICIES["e4m3fn_e5m2"], steps=2)
    _check_same(on, off)
    assert on[4].get("forward", 0) + on[4].get("backward", 0) > 0


class _Encoder(nn.Module):
    """torch's own TransformerEncoderLayer (MultiheadAttention, dropout, ReLU) and a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.enc = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.enc(x)).mean(1)


def test_torch_transformer_layers_give_the_same_bits_with_elision_on_and_off():
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(0))

    def loss(m):
        return m(x).square().sum()

    on = _train(_Encoder, loss, True, POLICIES["e5m2"], steps=3)
    off = _train(_Encoder, loss, False, POLICIES["e5m2"], steps=3)
    _check_same(on, off)
    assert on[4]


# ---- planted cases: a rounding that is needed stays -------------------------------------------------------
@pytest.mark.parametrize("pool, dropout, forward, backward", [
    ("max", 0.0, 6, 6),  # the reference: everything after max-pool elided
    ("avg", 0.0, 5, 5),  # average pooling: the Linear input and the ReLU gradient before the pool are rounded
    ("max", 0.3, 5, 5),  # dropout scales by 1/(1-p): the Linear input and the ReLU gradient are rounded
    ("overlap", 0.0, 6, 5),  # overlapping windows add gradients: the ReLU gradient before the pool is rounded
])
def test_roundings_after_ops_that_leave_the_grid_are_kept(pool, dropout, forward, backward):
    def build():
        return cnn(pool, dropout)

    on = _train(build, _cnn_loss, True, POLICIES["e5m2"], steps=2)
    off = _train(build, _cnn_loss, False, POLICIES["e5m2"], steps=2)
    _check_same(on, off)
    assert on[4] == {"forward": forward, "backward": backward}


def test_average_pooling_and_dropout_would_change_bits_if_their_roundings_were_skipped():
    """The planted cases are live: the average-pooled and the dropped-out ReLU outputs are off the grid, so
    rounding them changes bits."""
    x = quantize(torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0)), "e5m2").relu()
    p = F.avg_pool2d(x, 2)
    assert not _same(quantize(p, "e5m2"), p)
    torch.manual_seed(0)
    d = F.dropout(x, 0.3, training=True)
    assert not _same(quantize(d, "e5m2"), d)


class _InPlace(nn.Module):
    """conv -> ReLU -> max-pool -> a write to the pool's output (in place, under no_grad or recorded) -> conv.
    (A max-pool keeps its input's grid and, unlike ReLU, does not save its output: the write is valid in fp32.)"""

    def __init__(self, how):
        super().__init__()
        torch.manual_seed(0)
        self.c1, self.r, self.c2, self.how = nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 2, 3), how

    def forward(self, x):
        h = F.max_pool2d(self.r(self.c1(x)), 2)
        if self.how == "none":
            pass
        elif self.how == "no_grad":
            with torch.no_grad():
                h.mul_(1.3)
        elif self.how == "view":
            with torch.no_grad():
                h[:, :1].add_(0.1)
        else:
            h = h.add_(0.1)
        return self.c2(h)


@pytest.mark.parametrize("how", ["no_grad", "view", "recorded"])
def test_a_tensor_written_in_place_after_its_rounding_is_rounded_again(how):
    def loss(m):
        return m(_image()).square().sum()

    on = _train(lambda: _InPlace(how), loss, True, POLICIES["e5m2"], steps=2)
    off = _train(lambda: _InPlace(how), loss, False, POLICIES["e5m2"], steps=2)
    _check_same(on, off)
    unwritten = _train(lambda: _InPlace("none"), loss, True, POLICIES["e5m2"], steps=2)
    # second step (the first forward counts GEMM coverage and rounds every role): the ReLU output is skipped in
    # both models, the second conv's input only when unwritten
    assert unwritten[4]["forward"] == 2 and on[4].get("forward", 0) == 1


@pytest.mark.parametrize("layout", ["transposed", "contiguous"])
def test_a_skipped_gradient_rounding_hands_on_the_layout_the_rounding_would_have(layout):
    """Later backward ops (GEMMs) may sum in another order for another memory layout, so a passed-on gradient
    keeps the strides of the rounding's result: C order for a transposed gradient."""
    from emunum.autograd import _Plan
    from emunum.elide import round_eliding

    plan = _Plan("e5m2", "e5m2", "nearest", "stochastic", "identity", None, None)
    g = quantize(torch.randn(6, 4, generator=torch.Generator().manual_seed(0)), "e5m2")
    g = g.t() if layout == "transposed" else g.t().contiguous()
    seen = {}
    grid.elided.clear()
    for on in (True, False):
        x = torch.randn(4, 6, requires_grad=True)
        a = x * 1.0
        a.register_hook(lambda t, on=on: seen.__setitem__(on, (t.stride(), t.clone())))
        y = round_eliding(plan, a) if on else plan(a)  # plan(a): the rounding that elision stands in for
        y.backward(grid.mark(g, emunum.get_format("e5m2")))
    assert seen[True][0] == seen[False][0]
    assert _same(seen[True][1], seen[False][1])
    assert grid.elided["backward"] == 1


@pytest.mark.parametrize("shape, strides", [((4, 6), (1, 4)), ((2, 1, 3), (3, 7, 1)), ((4, 6), (6, 1))])
@pytest.mark.parametrize("grad", [False, True])
def test_a_skipped_forward_rounding_returns_a_fresh_tensor_laid_out_as_the_rounding(shape, strides, grad):
    from emunum.autograd import _Plan
    from emunum.elide import round_eliding

    plan = _Plan("e5m2", "e5m2", "nearest", "stochastic", "identity", None, None)
    q = quantize(torch.randn(24, generator=torch.Generator().manual_seed(0)), "e5m2")
    x = torch.empty_strided(shape, strides).copy_(q[:torch.Size(shape).numel()].view(shape))
    x = grid.mark(x.requires_grad_(grad), emunum.get_format("e5m2"))
    grid.elided.clear()
    y_on, y_off = round_eliding(plan, x), plan(x)
    assert grid.elided["forward"] == 1
    assert y_on.stride() == y_off.stride() and _same(y_on, y_off)
    assert y_on.data_ptr() != x.data_ptr()


def _on_grid_input(grad: bool):
    x = quantize(torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(2)), "e5m2")
    return grid.mark(x.requires_grad_(grad), emunum.get_format("e5m2"))


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("layer", ["conv", "linear"])
def test_a_skipped_operand_rounding_hands_the_gemm_the_tensor_itself(layer, grad, monkeypatch):
    """A GEMM operand that only the layer reads is not copied when its rounding is skipped: the GEMM reads the
    input's own memory (and computes the same bits as with elision off)."""
    torch.manual_seed(0)
    m = emunum.patch(nn.Conv2d(3, 2, 3) if layer == "conv" else nn.Linear(6, 4), fmt="e5m2")
    fn = "conv2d" if layer == "conv" else "linear"
    seen, orig = [], getattr(F, fn)
    monkeypatch.setattr(F, fn, lambda x, *a, **k: seen.append(x.data_ptr()) or orig(x, *a, **k))
    m(_on_grid_input(False))  # the first forward counts GEMM coverage, rounding every role
    outs = []
    for on in (True, False):
        x, seen[:] = _on_grid_input(grad), []
        grid.elided.clear()
        with grid.elision(on):
            outs.append(m(x))
        assert (seen == [x.data_ptr()]) == on and grid.elided["forward"] == on
    assert _same(*outs)


@pytest.mark.parametrize("inplace", [False, True])
def test_an_emulated_relu_over_an_on_grid_tensor_is_one_node_that_keeps_relus_own_result(inplace):
    """Its result is relu's own tensor (no copy; with inplace=True, the input itself), saved for backward as
    ReluBackward0 saves it: a later in-place write to it is refused at backward exactly where fp32 refuses it;
    values and gradients as with elision off (the conv's output, rounded, is on the grid)."""
    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 3, 1), nn.ReLU(inplace=inplace))

    results = []
    for on in (True, False):
        m = emunum.patch(build(), fmt="e5m2")
        m(_image())
        x = _image().requires_grad_(True)
        with grid.elision(on):
            y = m(x)
            assert (type(y.grad_fn).__name__ == "_ReluElidingBackward") == on
            y.backward(quantize(torch.randn(y.shape, generator=torch.Generator().manual_seed(3)), "e5m2"))
        results.append([y, x.grad, m[0].weight.grad, m[0].bias.grad])
    assert all(_same(a, b) for a, b in zip(*results))
    for model in (build(), emunum.patch(build(), fmt="e5m2")):
        model(_image())
        y = model(_image().requires_grad_(True))
        with torch.no_grad():
            y.mul_(2.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("before", ["conv", "view", "max_pool", "max_pool_view"])
def test_the_one_node_relu_skips_what_relu_and_its_rounding_skipped(before, inplace, monkeypatch):
    """The same skipped roundings, forward and backward, and the same bits, as relu's node and the rounding node
    after it (the one-node path switched off), whatever grid-keeping ops lie between the rounding before and it."""
    import emunum.elide as elide_mod
    import emunum.nn.layers as layers_mod

    mid = {"conv": [], "view": [nn.Flatten(), nn.Unflatten(1, (4, 6, 6))], "max_pool": [nn.MaxPool2d(2)],
           "max_pool_view": [nn.MaxPool2d(2), nn.Flatten(), nn.Unflatten(1, (4, 3, 3))]}[before]

    def build():
        torch.manual_seed(0)
        width = 36 if before.startswith("max_pool") else 144
        return nn.Sequential(nn.Conv2d(3, 4, 3), *mid, nn.ReLU(inplace=inplace), nn.Flatten(), nn.Linear(width, 3))

    def loss(m):
        return m(_image()).square().sum()

    one = _train(build, loss, True, POLICIES["e4m3fn_e5m2"], steps=2)
    monkeypatch.setattr(layers_mod, "relu_eliding", lambda *a: None)
    two = _train(build, loss, True, POLICIES["e4m3fn_e5m2"], steps=2)
    monkeypatch.undo()
    _check_same(one, two)
    assert one[4] == two[4] and one[4]["backward"] > 0
    assert elide_mod.relu_eliding is layers_mod.relu_eliding


@pytest.mark.parametrize("write", ["none", "in_place", "through_view", "no_grad", "copy_into"])
def test_a_tag_holds_for_the_tensor_and_its_views_until_a_write(write):
    f = emunum.get_format("e5m2")
    t = grid.mark(quantize(torch.randn(4, 4), f), f)
    v = t[1:, :2]
    if write == "in_place":
        t.mul_(1.0)
    elif write == "through_view":
        v.add_(0.0)
    elif write == "no_grad":
        with torch.no_grad():
            t.relu_()
    elif write == "copy_into":
        t.copy_(t)
    expect = f if write == "none" else None
    assert grid.grid_of(t) == expect and grid.grid_of(v) == expect and grid.grid_of(t.t()) == expect
    assert grid.grid_of(t.clone()) is None  # a copy is not tagged (only ops elision knows keep the grid)


# ---- the grid claim ----------------------------------------------------------------------------------------
_SPECIALS = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), -float("nan"), 1e38, -1e38, 1e-45, 3e-39,
             65504.0, 57344.0, 61440.0, 448.0, 464.0, 240.0, 7.5, 6.0]


@pytest.mark.parametrize("fmt", ["e5m2", "e4m3fn", "e4m3fnuz", "e5m2fnuz", "fp6_e3m2", "fp4_e2m1", "fp16",
                                 "bf16", "fp8_143"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_value_a_rounding_returns_is_returned_unchanged_by_every_mode(fmt, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.tensor(_SPECIALS, dtype=dtype),
                   torch.randn(4000, generator=g, dtype=dtype) * torch.exp2(torch.randint(-30, 30, (4000,),
                                                                                           generator=g))])
    for m in MODES:
        q = quantize(x, fmt, m, seed=1)
        assert grid.taggable(emunum.get_format(fmt), q)
        for m2 in MODES:
            assert _same(quantize(q, fmt, m2, seed=2), q), (m, m2)
        r = q.relu()  # ReLU keeps the grid
        assert _same(quantize(r, fmt, "nearest"), r)


# ---- the switch ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [199, 200])
def test_roundings_of_tensors_below_the_minimum_size_are_not_elided(n):
    """From ``set_min_elements(m)`` on, a rounding of a tensor of fewer than m elements takes the plain path: not
    skipped, its result not tagged; one of m elements or more is skipped. The same bits either way."""
    grid.set_min_elements(200)
    m = emunum.patch(nn.Sequential(nn.Linear(n, 3)), fmt="e5m2")
    m(torch.zeros(1, n))  # the first forward counts GEMM coverage, rounding every role
    x = grid.mark(quantize(torch.randn(1, n, generator=torch.Generator().manual_seed(0)), "e5m2"),
                  emunum.get_format("e5m2"))
    grid.elided.clear()
    y_on = m(x)
    with grid.elision(False):
        y_off = m(x)
    assert grid.elided["forward"] == (n >= 200) and _same(y_on, y_off)


def test_the_minimum_size_is_checked_and_restored():
    assert grid.set_min_elements(5) == 0  # this module's fixture set 0
    assert grid.set_min_elements(0) == 5
    for bad, err in ((-1, ValueError), (2.0, TypeError), (True, TypeError), ("7", TypeError)):
        with pytest.raises(err, match="n"):
            grid.set_min_elements(bad)
    assert grid.DEFAULT_MIN_ELEMENTS == 1 << 16


def test_patch_elide_false_turns_elision_off_for_that_model():
    on = _train(cnn, _cnn_loss, True, dict(POLICIES["e5m2"], elide=False), steps=2)
    assert on[4] == {}


@pytest.mark.parametrize("value, on", [("0", False), ("off", False), ("No", False), ("1", True), ("", True),
                                       ("true", True)])
def test_the_environment_variable_sets_the_default(value, on, monkeypatch):
    monkeypatch.setenv(grid.ENV, value)
    assert grid._env_default() is on


def test_bad_switch_values_are_refused(monkeypatch):
    with pytest.raises(TypeError, match="elide"):
        emunum.patch(cnn(), fmt="e5m2", elide="yes")
    with pytest.raises(TypeError, match="bool"):
        grid.set_elision(1)
    monkeypatch.setenv(grid.ENV, "maybe")
    with pytest.raises(ValueError, match="EMUNUM_ELIDE='maybe'"):
        grid._env_default()


# ---- tracing -------------------------------------------------------------------------------------------------
def test_trace_counts_are_the_same_with_elision_on_and_off():
    def counts(on):
        model = emunum.patch(cnn(), fmt="e5m2")
        torch.manual_seed(5)
        with grid.elision(on), emunum.trace.collect(model, every=2) as t:
            for _ in range(4):
                _cnn_loss(model).backward()
        return t.to_dict(), dict(grid.elided)

    grid.elided.clear()
    on, elided = counts(True)
    grid.elided.clear()
    off, _ = counts(False)
    assert on == off
    assert elided  # unsampled calls were elided


# ---- nested formats and dtypes -------------------------------------------------------------------------------
_ML = {"e5m2": "float8_e5m2", "e4m3fn": "float8_e4m3fn", "e4m3fnuz": "float8_e4m3fnuz",
       "e5m2fnuz": "float8_e5m2fnuz", "fp16": "float16", "bf16": "bfloat16", "fp6_e3m2": "float6_e3m2fn",
       "fp4_e2m1": "float4_e2m1fn"}


def _oracle_nested(a: str, b: str) -> bool:
    """Every value of a (with -0 and inf where a has them) is a value of b: ml_dtypes casts it exactly."""
    import ml_dtypes
    import numpy as np

    fa, fb = emunum.get_format(a), emunum.get_format(b)
    v = fa.values()
    v = np.concatenate([v, -v] + ([np.array([np.inf, -np.inf])] if fa.has_inf else []))
    tb = np.dtype(getattr(ml_dtypes, _ML[b]) if _ML[b] not in ("float16",) else np.float16)
    with np.errstate(over="ignore", invalid="ignore"):
        back = v.astype(tb).astype(np.float64)
    same = np.array_equal(back, v) and (not fa.has_inf or not fb.saturate)
    zero = not fa.has_negative_zero or fb.has_negative_zero
    return bool(same and zero)


@pytest.mark.parametrize("inner", sorted(_ML))
@pytest.mark.parametrize("outer", sorted(_ML))
def test_nested_formats_are_those_whose_values_all_lie_in_the_other(inner, outer):
    pytest.importorskip("ml_dtypes")
    fa, fb = emunum.get_format(inner), emunum.get_format(outer)
    if fa.bits > 16:
        pytest.skip("nesting is decided for formats of 16 bits or fewer")
    assert grid.nested(fa, fb) == _oracle_nested(inner, outer)


def test_a_tensor_on_a_nested_grid_is_not_rounded_again():
    """Outputs in e5m2, inputs in fp16: the second conv's and the Linear's inputs (e5m2 values) are fp16 values."""
    policy = dict(fmt="fp16", output="e5m2")
    on = _train(cnn, _cnn_loss, True, policy, steps=2)
    off = _train(cnn, _cnn_loss, False, policy, steps=2)
    _check_same(on, off)
    assert on[4]["forward"] == 6


def test_half_precision_tensors_are_never_tagged():
    """A float16/bfloat16 result is a rounding cast back to its dtype, whose grid claim is not made."""
    q = quantize(torch.ones(2, dtype=torch.bfloat16), "fp16")
    assert not grid.taggable(emunum.get_format("fp16"), q)

    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).to(torch.bfloat16)

    def loss(m):
        return m(torch.randn(4, 8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)).float().sum()

    on = _train(build, loss, True, dict(fmt="fp16"), steps=2)
    off = _train(build, loss, False, dict(fmt="fp16"), steps=2)
    _check_same(on, off)
    assert on[4] == {}


class _Lookup(nn.Module):
    """An embedding lookup feeding a Linear layer."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.head = nn.Embedding(20, 6), nn.Linear(18, 4)

    def forward(self, idx):
        return self.head(self.emb(idx).flatten(1))


def _lookup_loss(m):
    return m(torch.tensor([[1, 2, 3], [4, 4, 19], [0, 7, 2]])).square().sum()


@pytest.mark.parametrize("weight, output, skipped", [("e4m3fn", "e4m3fn", 4), ("e5m2", "fp16", 4),
                                                     ("e4m3fn", "e5m2", 2), ("e5m2", "e4m3fn", 2)])
def test_an_embedding_lookup_keeps_its_rounded_tables_grid(weight, output, skipped):
    """Every element of a lookup is an element of the rounded table, so the lookup's output rounding is skipped
    where the table's format nests in the output's (the same format; e5m2 in fp16) and kept where it does not
    (e4m3fn and e5m2 in each other). Bits equal elision off either way. Forward roundings skipped in the two
    steps after the first: the Linear input (a view of the rounded output) each step, and the lookup's output
    where the formats nest."""
    policy = dict(weight=weight, output=output, input=output, grad="e5m2")
    on = _train(_Lookup, _lookup_loss, True, policy)
    off = _train(_Lookup, _lookup_loss, False, policy)
    _check_same(on, off)
    assert on[4].get("forward", 0) == skipped
