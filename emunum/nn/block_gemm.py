"""Block-scaled GEMMs for patched Linear and Conv1d/Conv2d layers (OCP MX / NVFP4 training).

When a Policy gives the ``input``, ``weight`` or ``grad_output`` role a ``BlockFormat``, each of the layer's
three GEMMs quantises its two operands along that GEMM's own reduction dimension K, as MX hardware and
torchao's MX linear do (re-quantising per GEMM from the high-precision tensors):

- forward      y  = x @ W.T:    x (tokens, in) and W (out, in) in blocks along ``in``;
- grad-input   gx = gy @ W:     gy (tokens, out) and W (out, in) in blocks along ``out``;
- grad-weight  gW = gy.T @ x:   gy and x in blocks along the tokens (every leading dimension, flattened).

x takes the input role's format, W the weight role's, gy the grad_output role's (each with its role's rounding;
a role that is None or not a BlockFormat leaves that operand unquantised). A weight format with 2-D tiles
(``BlockFormat(..., block_size=(16, 16))``) quantises W once, as tiles, for both of its GEMMs. A convolution is
the same GEMM on its im2col matrix: K is in_channels * kernel size (groups must be 1). The GEMMs themselves
are torch's, in the tensors' dtype (MX hardware accumulates in fp32); the block-format ``output``,
``grad_input`` and ``grad_weight`` roles are therefore not rounded. Stochastic rounding draws a fresh seed per
GEMM operand from torch's generator.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..formats import BlockFormat, RoundMode
from ..policy import Policy, Role, RoleSpec
from ..quantize import quantize


@dataclass(frozen=True)
class BlockPlan:
    """The block formats (as RoleSpecs, or None) of a layer's three GEMM operands, and sr_bits."""

    input: Optional[RoleSpec]
    weight: Optional[RoleSpec]
    grad_output: Optional[RoleSpec]
    sr_bits: Optional[int] = None

    def q(self, t: Tensor, spec: Optional[RoleSpec], axis: int) -> Tensor:
        if spec is None:
            return t
        return quantize(t, spec.fmt, spec.rounding, axis=axis, sr_bits=self.sr_bits)


def is_block(spec: Optional[RoleSpec]) -> bool:
    return spec is not None and isinstance(spec.fmt, BlockFormat)


def block_plan(policy: Policy) -> Optional[BlockPlan]:
    """The plan, or None when no GEMM-operand role holds a BlockFormat."""
    specs = {r: policy.spec(r) for r in (Role.INPUT, Role.WEIGHT, Role.GRAD_OUTPUT)}
    if not any(is_block(s) for s in specs.values()):
        return None
    if policy.mad is not None:
        raise ValueError("Policy.mad with block formats: emunum's MAD units do not take block-scaled operands "
                         "yet; use mad=None (torch's GEMM on the block-quantised operands)")
    return BlockPlan(*(s if is_block(s) else None for s in specs.values()), sr_bits=policy.sr_bits)


class _BlockGemm(torch.autograd.Function):
    """y = x2 @ W.T for x2 (tokens, K); operands quantised per GEMM along its reduction dimension."""

    @staticmethod
    def forward(ctx, x2: Tensor, w: Tensor, plan: BlockPlan) -> Tensor:
        ctx.plan = plan
        ctx.save_for_backward(x2, w)
        return plan.q(x2, plan.input, -1) @ plan.q(w, plan.weight, 1).t()

    @staticmethod
    def backward(ctx, gy: Tensor):
        x2, w = ctx.saved_tensors
        p = ctx.plan
        gx = gw = None
        if ctx.needs_input_grad[0]:
            gx = p.q(gy, p.grad_output, -1) @ p.q(w, p.weight, 0)  # K = out_features
        if ctx.needs_input_grad[1]:
            gw = p.q(gy, p.grad_output, 0).t() @ p.q(x2, p.input, 0)  # K = tokens
        return gx, gw, None


def block_gemm(x2: Tensor, w: Tensor, plan: BlockPlan) -> Tensor:
    return _BlockGemm.apply(x2, w, plan)


def block_linear(x: Tensor, w: Tensor, b: Optional[Tensor], plan: BlockPlan) -> Tensor:
    y = block_gemm(x.reshape(-1, x.shape[-1]), w, plan).reshape(*x.shape[:-1], w.shape[0])
    return y if b is None else y + b


def block_conv(module, x: Tensor, w: Tensor, b: Optional[Tensor], plan: BlockPlan) -> Tensor:
    """Conv1d/Conv2d (groups 1) as unfold (im2col) + the block GEMM, K = in_channels * kernel size."""
    nd = len(module.kernel_size)
    padding = module.padding
    if module.padding_mode != "zeros":
        x = F.pad(x, module._reversed_padding_repeated_twice, mode=module.padding_mode)
        padding = (0,) * nd
    if isinstance(padding, str):
        raise ValueError(f"{type(module).__name__}(padding={padding!r}) with block formats: give padding as ints")
    if nd == 1:
        x4, w4 = x.unsqueeze(-2), w.unsqueeze(-2)
        k, s, p, d = (1, module.kernel_size[0]), (1, module.stride[0]), (0, padding[0]), (1, module.dilation[0])
    else:
        x4, w4, k, s, p, d = x, w, module.kernel_size, module.stride, padding, module.dilation
    n, h, wd = x4.shape[0], x4.shape[-2], x4.shape[-1]
    ho = (h + 2 * p[0] - d[0] * (k[0] - 1) - 1) // s[0] + 1
    wo = (wd + 2 * p[1] - d[1] * (k[1] - 1) - 1) // s[1] + 1
    cols = F.unfold(x4, k, dilation=d, padding=p, stride=s)  # (n, C*kh*kw, L)
    x2 = cols.transpose(1, 2).reshape(-1, cols.shape[1])
    y = block_gemm(x2, w4.reshape(w4.shape[0], -1), plan)  # (n*L, out)
    y = y.reshape(n, ho * wo, -1).transpose(1, 2).reshape(n, -1, ho, wo)
    if b is not None:
        y = y + b.view(1, -1, 1, 1)
    return y.squeeze(-2) if nd == 1 else y
