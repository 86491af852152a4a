"""emunum.nn's exported names: Emu<Layer> are emulated layers, <Kind>Mixin their rounding mixins."""


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
