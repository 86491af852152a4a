"""Emulated layers: torch layers whose tensors are rounded by a ``Policy``, built from plain ones by ``from_float``.

``EmuLinear.from_float(linear, fmt="e5m2")`` returns a new module of a subclass of the original's class that
*shares* the original's state: the same ``_parameters``, ``_buffers``, ``_modules`` and hook dicts (so the same
Parameter objects, state_dict keys and hooks), plus the rounding plan. ``emunum.patch`` swaps such modules in
and ``emunum.unpatch`` swaps the originals back, copying attributes changed meanwhile (``training`` ...).

Names: ``Emu<Layer>`` (``EmuLinear``, ``EmuConv2d`` ...) are the emulated layers, torch's class plus the
rounding mixin of its kind; ``<Kind>Mixin`` (``LinearMixin``, ``ConvMixin`` ...) are those mixins, which hold
the rounding and are what ``emunum.register`` extends to other classes.

Where the rounding happens, per forward call (a role with no format is left alone):
- Linear, Conv1d/2d/3d, ConvTranspose1d/2d/3d: ``output = Q_out(op(Q_in(input), Q_w(weight), Q_w(bias)))``;
  in the backward pass the gradient arriving at the output is rounded to ``grad_output``, the gradient
  leaving for the input to ``grad_input`` and the weight and bias gradients to ``grad_weight``.
- Embedding: ``Q_out(embedding(indices, Q_w(weight)))`` (the whole table is rounded, so its gradient is the
  rounded gradient of the table; ``max_norm`` renormalises the stored weight first, as torch does).
- MultiheadAttention: see ``MultiheadAttentionMixin``.
- Norm layers and activations: ``Q_out(layer(input))``.
- Block formats (MX, NVFP4) in input/weight/grad_output: Linear, Conv*d, ConvTranspose*d and MultiheadAttention
  quantise the operands inside each GEMM along its reduction dimension (``emunum.nn.block_gemm``); other weight layers
  refuse them; norms and activations have no GEMM operand and ignore them.
Each rounding is ``emunum.quantize_ste`` with the role's format and rounding: the forward value straight
through (``Policy.ste``), then an identity whose backward rounds the gradient. Stochastic rounding draws fresh
seeds from torch's default generator on every call, so ``torch.manual_seed`` makes runs repeatable.
Roundings of tensors already on the format's grid are skipped where that changes no bit, seed draws included
(``emunum.elide``, docs/elision.md; ``patch(..., elide=False)`` or ``EMUNUM_ELIDE=0`` turns it off).
With ``EMUNUM_FUSED=1`` an element-wise Linear or Conv call runs all its roundings and its GEMM as one autograd
node, with the same bits and seed draws (``emunum.nn.fused``; off by default: no double backward through it).

Per-tensor scaling (a role whose ``RoleSpec.scaling`` is ``per_tensor``, see ``emunum.policy.Scaling``):
a forward role rounds ``x`` as ``quantize_ste(x * s) / s`` with ``s = per_tensor_scale(x, fmt)``, the
gradient passing straight through the scaling (so the straight-through estimator sees ``x * s``: the
clipped one zeroes only where ``x * s`` is beyond the format's range, i.e. at infinities); a gradient role
rounds the gradient ``g`` arriving in the backward pass as ``quantize(g * s_g) / s_g`` with
``s_g = per_tensor_scale(g, fmt)``. ``s`` is computed with torch ops on every call (no ``.item()``), so
scaled layers run under ``torch.compile(fullgraph=True)``.
"""
from .attention import MultiheadAttentionMixin
from .base import STATE_PREFIX, EmuLayer
from .layers import ConvMixin, ConvTransposeMixin, EmbeddingMixin, LinearMixin, OutputMixin
from .registry import (ACTIVATIONS, MIXINS, NORMS, EmuConv1d, EmuConv2d, EmuConv3d, EmuConvTranspose1d,
                       EmuConvTranspose2d, EmuConvTranspose3d, EmuEmbedding, EmuLinear, EmuMultiheadAttention,
                       emu_class, from_float, mixin_for)
from .scaling import ScaledGradQuantizer, ScaledQuantizer, per_tensor_scale

__all__ = [
    "STATE_PREFIX", "EmuLayer", "LinearMixin", "ConvMixin", "ConvTransposeMixin", "EmbeddingMixin", "OutputMixin",
    "MultiheadAttentionMixin",
    "EmuLinear", "EmuConv1d", "EmuConv2d", "EmuConv3d", "EmuConvTranspose1d", "EmuConvTranspose2d",
    "EmuConvTranspose3d", "EmuEmbedding", "EmuMultiheadAttention", "MIXINS", "NORMS", "ACTIVATIONS",
    "emu_class", "mixin_for", "from_float", "per_tensor_scale", "ScaledQuantizer", "ScaledGradQuantizer",
]
