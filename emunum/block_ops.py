"""``emunum::quantize_block``: block-format rounding (``emunum.quantize(x, BlockFormat, axis=...)``) as a torch
custom op, so that ``torch.compile`` traces block-GEMM layers (``emunum.nn.block_gemm``) without graph breaks.

The format travels as its interned id (``formats.interned.intern``; valid within the process, as a compiled
graph that bakes it in is). The op returns what ``quantize`` returns, values and layout: a fresh tensor, laid
out as x's shape with the blocked axis moved last and then moved back (1-D blocks along another axis than the
last come back as a view with that axis innermost in memory; 2-D tiles and the last axis: contiguous). Its fake
(meta) implementation makes the same layout, so that a compiled graph hands torch's GEMMs the operands eager
mode hands them (a CPU's GEMM kernel may sum in another order for another operand layout). Its gradient is the
identity (straight through). ``seed=None`` draws a fresh seed from torch's default generator when the op runs,
as ``quantize`` does in eager mode. Eager callers keep calling ``quantize`` directly (``ops.eager_ok``): no
dispatch cost.
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
    """``quantize(x, lookup(fmt_id), RoundMode(mode), seed=seed, sr_bits=sr_bits, axis=axis)``."""
    return quantize(x, lookup(fmt_id), RoundMode(mode), seed=seed, sr_bits=sr_bits, axis=axis)


@quantize_block_op.register_fake
def _(x, fmt_id, mode, seed, sr_bits, axis):
    if lookup(fmt_id).tile[0] != 0 or x.dim() < 2:
        return torch.empty_like(x, memory_format=torch.contiguous_format)
    ax = axis % x.dim()
    return x.new_empty(x.movedim(ax, -1).shape).movedim(-1, ax)  # quantize's layout (module doc)


def _backward(ctx, grad):
    return grad, None, None, None, None, None


quantize_block_op.register_autograd(_backward)
