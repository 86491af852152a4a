"""The emulated classes: ``Emu<Type>`` for each supported torch layer, created once and cached, and the
lookup ``from_float`` that ``emunum.patch`` uses."""
from __future__ import annotations

from torch import nn

from ..policy import Policy
from .attention import MultiheadAttentionMixin
from .layers import ConvMixin, ConvTransposeMixin, EmbeddingMixin, LinearMixin, OutputMixin

_CLASSES: dict = {}


def emu_class(base: type, mixin: type) -> type:
    """The emulated subclass ``Emu<Base>`` of ``base`` with ``mixin``'s forward (created once, cached).

    The class is placed in this module's namespace so that pickling finds it."""
    key = (base, mixin)
    cls = _CLASSES.get(key)
    if cls is None:
        name = f"Emu{base.__name__}"
        if name in globals():  # another class of that name: qualify with its module
            name = f"Emu_{base.__module__.replace('.', '_')}_{base.__name__}"
        attrs = {"_emunum_base": base, "__module__": __name__, "__qualname__": name}
        if getattr(base, "cls_to_become", None) is not None:  # a lazy layer turns into its emulated twin's class
            attrs["cls_to_become"] = emu_class(base.cls_to_become, mixin)
        cls = type(name, (mixin, base), attrs)
        _CLASSES[key] = cls
        globals()[name] = cls
    return cls


# torch class -> the mixin that emulates it. Subclasses that keep their parent's forward use the same mixin.
MIXINS: dict = {nn.Linear: LinearMixin, nn.Embedding: EmbeddingMixin, nn.MultiheadAttention: MultiheadAttentionMixin}
MIXINS.update({c: ConvMixin for c in (nn.Conv1d, nn.Conv2d, nn.Conv3d)})
MIXINS.update({c: ConvTransposeMixin for c in (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)})
NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, nn.LayerNorm, nn.GroupNorm,
         nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d, nn.LocalResponseNorm, nn.RMSNorm)
ACTIVATIONS = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.RReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU,
               nn.Mish, nn.Tanh, nn.Sigmoid, nn.Hardtanh, nn.Hardsigmoid, nn.Hardswish, nn.Softplus, nn.Softsign,
               nn.Tanhshrink, nn.LogSigmoid, nn.Softmax, nn.LogSoftmax, nn.Softmin, nn.GLU, nn.Threshold)
MIXINS.update({c: OutputMixin for c in NORMS + ACTIVATIONS})

EmuLinear = emu_class(nn.Linear, LinearMixin)
EmuConv1d, EmuConv2d, EmuConv3d = (emu_class(c, ConvMixin) for c in (nn.Conv1d, nn.Conv2d, nn.Conv3d))
EmuConvTranspose1d, EmuConvTranspose2d, EmuConvTranspose3d = (
    emu_class(c, ConvTransposeMixin) for c in (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d))
EmuEmbedding = emu_class(nn.Embedding, EmbeddingMixin)
EmuMultiheadAttention = emu_class(nn.MultiheadAttention, MultiheadAttentionMixin)
for _c in NORMS + ACTIVATIONS:
    emu_class(_c, OutputMixin)
del _c


def mixin_for(module_type: type):
    """(mixin, base) emulating ``module_type``: its own entry, or an ancestor's if it keeps that forward."""
    if module_type in MIXINS:
        return MIXINS[module_type], module_type
    for base in module_type.__mro__[1:]:
        if base in MIXINS:
            return (MIXINS[base], base) if module_type.forward is base.forward else (None, base)
    return None, None


def from_float(module: nn.Module, policy: Policy) -> nn.Module:
    """The emulated twin of a built-in layer (or a subclass keeping its forward): ``Emu<Type>.from_float``."""
    mixin, base = mixin_for(type(module))
    if mixin is None:
        raise TypeError(f"no emulated layer for {type(module).__name__}")
    return emu_class(type(module), mixin).from_float(module, policy)
