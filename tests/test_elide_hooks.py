"""Grid-tag hooks (``emunum.elide._hook_history``): a rounding site hooks the grid-keeping nodes above its input only
where a tag could reach a rounding from there. Where the chain of views ends in a node whose gradients are always
new tensors (a matrix product, an element-wise product, a summing expand, an addmm with a broadcast ``self`` as a
Linear's bias, or with beta != 1) nothing is hooked; where it ends in a rounding node or in a node that can pass its
gradient on (an addition, a no-op expand, an addmm with a full-shape ``self`` and beta 1) the hooks stay, and the
elisions they enable still happen.

Oracle: hook runs counted by wrapping ``elide._propagate``; elision counts from ``grid.elided``; for the models,
the same elision counts as every chain hooked (``_sink`` forced to False), and the same bits.
"""
import pytest
import torch

import emunum.elide as el
from emunum import grid
from emunum.autograd import _Plan


@pytest.fixture(autouse=True)
def _elide_every_size():
    """Elision at every tensor size (these tests' tensors are small; the default starts at 2**16 elements)."""
    prev = grid.set_min_elements(0)
    yield
    grid.set_min_elements(prev)


PLAN = _Plan("e5m2", "e5m2", "nearest", "nearest", "identity", None, None)


def _runs(monkeypatch):
    runs = []
    orig = el._propagate

    def counting(gi, go):
        runs.append(1)
        return orig(gi, go)
    monkeypatch.setattr(el, "_propagate", counting)
    return runs


def _chain_above(end: str):
    """(leaf, tensor x whose history is view -> transpose above a node of kind ``end``)."""
    a = torch.randn(4, 6, requires_grad=True)
    if end == "mm":
        h = a @ torch.randn(6, 6)
    elif end == "mul":
        h = a * 3.0
    elif end == "add":
        h = a + torch.randn(4, 6)
    elif end == "summing_expand":
        a = torch.randn(1, 6, requires_grad=True)
        h = a.expand(4, 6)
    elif end == "noop_expand":
        a = torch.randn(4, 6, requires_grad=True)
        h = a.expand(4, 6)
    elif end in ("addmm_bias", "addmm_full", "addmm_beta"):  # a's gradient: a sum, the gradient itself, a product
        a = torch.randn(6 if end == "addmm_bias" else (4, 6), requires_grad=True)
        h = torch.addmm(a, torch.randn(4, 5), torch.randn(5, 6), beta=2.0 if end == "addmm_beta" else 1.0)
    else:  # a rounding: the previous layer's output
        h = el.round_eliding(PLAN, a)
    return a, h.reshape(4, -1).reshape(2, 12).t()


@pytest.mark.parametrize("end,hooked", [("mm", False), ("mul", False), ("summing_expand", False), ("add", True),
                                        ("noop_expand", True), ("rounding", True),
                                        ("addmm_bias", False), ("addmm_beta", False), ("addmm_full", True)])
def test_a_chain_is_hooked_only_where_a_tag_can_reach_a_rounding(end, hooked, monkeypatch):
    runs = _runs(monkeypatch)
    a, x = _chain_above(end)
    el.round_eliding(PLAN, x).sum().backward()
    assert bool(runs) is hooked


def test_the_gradient_rounding_after_a_hooked_chain_is_still_elided(monkeypatch):
    grid.elided.clear()
    a, x = _chain_above("rounding")
    el.round_eliding(PLAN, x).sum().backward()
    assert grid.elided["backward"] == 1  # the lower rounding sees the upper one's rounded gradient


def test_an_addmm_passes_a_rounded_gradient_on_to_a_full_shape_self():
    grid.elided.clear()
    a = el.round_eliding(PLAN, torch.randn(4, 6, requires_grad=True))
    h = torch.addmm(a, torch.randn(4, 5), torch.randn(5, 6))
    el.round_eliding(PLAN, h.reshape(2, 12).t()).sum().backward()
    assert grid.elided["backward"] == 1  # a's rounding sees the upper one's rounded gradient, passed on by addmm


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_models_elide_the_same_roundings_with_the_sinks_unhooked(name, monkeypatch):
    pytest.importorskip("transformers")
    import os
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    import emunum
    from third_party_models import MODELS, loss_of

    def run():
        torch.manual_seed(0)
        model, args, kwargs = MODELS[name]()
        emunum.patch(model, fmt="e4m3fn", grad="e5m2")
        loss_of(model(*args, **kwargs)).backward()  # the coverage check's step
        grid.elided.clear()
        torch.manual_seed(1)
        model.zero_grad()
        loss_of(model(*args, **kwargs)).backward()
        return dict(grid.elided), [p.grad.clone() for p in model.parameters() if p.grad is not None]
    runs = _runs(monkeypatch)
    counts, grads = run()
    fewer = len(runs)
    runs.clear()
    monkeypatch.setattr(el, "_sink", lambda node: False)
    all_counts, all_grads = run()
    assert counts == all_counts and len(runs) > fewer
    assert all(torch.equal(u.view(torch.int32), v.view(torch.int32)) for u, v in zip(grads, all_grads))
