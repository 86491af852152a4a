"""``emunum::quantize_block``: block-format rounding (``emunum.quantize(x, BlockFormat, axis=...)``) as a torch
custom op, so that ``torch.compile`` traces block-GEMM layers (``emunum.nn.block_gemm``) without graph breaks.

The format travels as its interned id (``formats.interned.intern``; valid within the process, as a compiled
graph that bakes it in is). The op returns a fresh contiguous tensor with ``quantize``'s values (bit for bit);
its fake (meta) implementation is ``empty_like`` in that layout, and its gradient is the identity (straight
through). ``seed=None`` draws a fresh seed from torch's default generator when the op runs, as ``quantize``
does in eager mode. Eager callers keep calling ``quantize`` directly (``ops.eager_ok``): no dispatch cost.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .formats import RoundMode
from .formats.interned import lookup
from .quantize import quantize


@torch.library.custom_op("emunum::quantize_block", mutates_args=())
def quantize_block_op(x: Tensor, fmt_id: int, mode: int, seed: Optional[int], sr_bits: int, axis: int) -> Tensor:
    """``quantize(x, lookup(fmt_id), RoundMode(mode), seed=seed, sr_bits=sr_bits, axis=axis)``, contiguous."""
    return quantize(x, lookup(fmt_id), RoundMode(mode), seed=seed, sr_bits=sr_bits, axis=axis).contiguous()


@quantize_block_op.register_fake
def _(x, fmt_id, mode, seed, sr_bits, axis):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _backward(ctx, grad):
    return grad, None, None, None, None, None


quantize_block_op.register_autograd(_backward)
