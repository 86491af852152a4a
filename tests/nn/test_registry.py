"""emunum.nn's exported names: Emu<Layer> are emulated layers, <Kind>Mixin their rounding mixins; a lazy layer
patched before its first forward turns into its emulated twin."""
import pytest
import torch
from torch import nn

import emunum


def test_exported_names_say_which_are_layers_and_which_are_mixins():
    import emunum.nn as enn

    names = set(enn.__all__)
    layers = {n for n in names if n.startswith("Emu") and n != "EmuLayer"}
    mixins = {n for n in names if n.endswith("Mixin")}
    assert layers and mixins and not any(n.endswith("Emu") for n in names)
    for n in layers:  # a layer is torch's class plus one mixin
        cls = getattr(enn, n)
        assert sum(issubclass(cls, getattr(enn, m)) for m in mixins) == 1, n
        assert any(b.__module__.startswith("torch.nn") for b in cls.__mro__), n
    for n in mixins:
        assert issubclass(getattr(enn, n), enn.EmuLayer)
        assert not any(b.__module__.startswith("torch.nn.modules") for b in getattr(enn, n).__mro__), n


LAZY = {  # a lazy stack, and its input
    "linear": (lambda: nn.Sequential(nn.LazyLinear(32), nn.ReLU(), nn.Linear(32, 4)), (3, 16)),
    "conv1d": (lambda: nn.Sequential(nn.LazyConv1d(4, 3), nn.Flatten(), nn.LazyLinear(4)), (2, 3, 12)),
    "conv2d": (lambda: nn.Sequential(nn.LazyConv2d(4, 3), nn.Flatten(), nn.LazyLinear(4)), (2, 3, 8, 8)),
    "conv_transpose2d": (lambda: nn.Sequential(nn.LazyConvTranspose2d(4, 3), nn.Flatten(), nn.LazyLinear(4)),
                         (2, 3, 5, 5)),
}


@pytest.mark.parametrize("fmt", ["e4m3fn", "nvfp4"])
@pytest.mark.parametrize("case", sorted(LAZY))
def test_a_lazy_layer_patched_before_its_first_forward_becomes_its_emulated_twin(case, fmt):
    make, shape = LAZY[case]
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    out = []
    for materialise_first in (False, True):
        torch.manual_seed(0)  # the same initial weights in both
        model = make()
        if materialise_first:
            model(x)
        model = emunum.patch(model, fmt=fmt, grad_rounding="nearest")
        xg = x.clone().requires_grad_()
        y = model(xg)
        y.square().sum().backward()
        assert all(type(m).__name__.startswith("Emu") for m in model if any(True for _ in m.parameters()))
        out.append([y, xg.grad, *(p.grad for p in model.parameters())])
    assert all(torch.equal(a, b) for a, b in zip(*out))
